//! Extraction and building together, as the files capability uses them: what is
//! refused, what is kept, and round trips.

use std::fs::{self, File, Permissions};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use flate2::read::GzDecoder;
use orchard_protocol::ErrorCode;
use tar::{EntryType, Header};

use super::*;
use crate::error::ApiError;

/// A raw tar entry, bypassing the builder's refusal of `..` and absolute names.
fn raw_entry(
    builder: &mut tar::Builder<Vec<u8>>,
    name: &[u8],
    kind: EntryType,
    link: &[u8],
    data: &[u8],
) {
    let mut header = Header::new_gnu();
    {
        let gnu = header.as_gnu_mut().expect("gnu header");
        gnu.name[..name.len()].copy_from_slice(name);
        gnu.linkname[..link.len()].copy_from_slice(link);
    }
    header.set_entry_type(kind);
    header.set_mode(if kind == EntryType::Directory {
        0o750
    } else {
        0o644
    });
    header.set_size(data.len() as u64);
    header.set_mtime(1_600_000_000);
    header.set_cksum();
    builder.append(&header, data).expect("append");
}

/// Name, type, link target, data.
type RawEntry<'a> = (&'a [u8], EntryType, &'a [u8], &'a [u8]);

fn tar_of(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        raw_entry(&mut builder, name, *kind, link, data);
    }
    builder.into_inner().expect("finish")
}

/// Names in `dir`, sorted, recursively, with a marker for kind.
fn snapshot(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for item in fs::read_dir(&d).unwrap() {
            let item = item.unwrap();
            let path = item.path();
            let ft = item.file_type().unwrap();
            let rel = path.strip_prefix(dir).unwrap().display().to_string();
            if ft.is_dir() {
                out.push(format!("{rel}/"));
                stack.push(path);
            } else if ft.is_symlink() {
                out.push(format!(
                    "{rel} -> {}",
                    fs::read_link(&path).unwrap().display()
                ));
            } else {
                out.push(format!("{rel} = {:?}", fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn code_of(err: ArchiveError) -> ErrorCode {
    ApiError::from(err).code
}

#[test]
fn extraction_refuses_parent_dir_entries() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("keep"), b"k").unwrap();
    let before = snapshot(dir.path());
    let tar = tar_of(&[
        (b"ok.txt", EntryType::Regular, b"", b"fine"),
        (b"../x", EntryType::Regular, b"", b"evil"),
    ]);
    let err = extract(&tar[..], dir.path()).unwrap_err();
    assert!(err.to_string().contains("../x"), "{err}");
    assert_eq!(code_of(err), ErrorCode::UnsafePath);
    assert_eq!(snapshot(dir.path()), before);
    assert!(!dir.path().parent().unwrap().join("x").exists());
}

#[test]
fn extraction_refuses_absolute_entries() {
    let dir = tempfile::tempdir().unwrap();
    let tar = tar_of(&[(b"/abs", EntryType::Regular, b"", b"evil")]);
    let err = extract(&tar[..], dir.path()).unwrap_err();
    assert!(err.to_string().contains("/abs"), "{err}");
    assert_eq!(code_of(err), ErrorCode::UnsafePath);
    assert!(snapshot(dir.path()).is_empty());
}

#[test]
fn extraction_refuses_writing_through_an_archived_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("keep"), b"k").unwrap();
    let before = snapshot(dir.path());
    let target = elsewhere.path().as_os_str().as_encoded_bytes().to_vec();
    let tar = tar_of(&[
        (b"first.txt", EntryType::Regular, b"", b"partial?"),
        (b"link", EntryType::Symlink, &target, b""),
        (b"link/file", EntryType::Regular, b"", b"evil"),
    ]);
    let err = extract(&tar[..], dir.path()).unwrap_err();
    assert!(err.to_string().contains("link/file"), "{err}");
    assert_eq!(code_of(err), ErrorCode::UnsafePath);
    assert_eq!(
        snapshot(dir.path()),
        before,
        "no staged leftovers, no partial files"
    );
    assert!(snapshot(elsewhere.path()).is_empty());
}

#[test]
fn extraction_refuses_writing_through_a_symlink_in_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    symlink(elsewhere.path(), dir.path().join("sub")).unwrap();
    let before = snapshot(dir.path());
    let tar = tar_of(&[
        (b"a.txt", EntryType::Regular, b"", b"a"),
        (b"sub/file", EntryType::Regular, b"", b"evil"),
    ]);
    let err = extract(&tar[..], dir.path()).unwrap_err();
    assert_eq!(code_of(err), ErrorCode::UnsafePath);
    assert_eq!(snapshot(dir.path()), before);
    assert!(snapshot(elsewhere.path()).is_empty());
}

#[test]
fn hard_links_inside_the_archive_work_and_escaping_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tar = tar_of(&[
        (b"a/data", EntryType::Regular, b"", b"shared"),
        (b"b/alias", EntryType::Link, b"a/data", b""),
    ]);
    let stats = extract(&tar[..], dir.path()).unwrap();
    assert_eq!(
        stats,
        ExtractStats {
            entries: 2,
            bytes: 6
        }
    );
    let a = fs::metadata(dir.path().join("a/data")).unwrap();
    let b = fs::metadata(dir.path().join("b/alias")).unwrap();
    assert_eq!(a.ino(), b.ino());

    let dir = tempfile::tempdir().unwrap();
    for link in [&b"../../etc/passwd"[..], b"/etc/passwd"] {
        let tar = tar_of(&[(b"x", EntryType::Link, link, b"")]);
        let err = extract(&tar[..], dir.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::UnsafePath);
    }
    let tar = tar_of(&[
        (b"l", EntryType::Symlink, b"/etc", b""),
        (b"x", EntryType::Link, b"l/passwd", b""),
    ]);
    assert_eq!(
        code_of(extract(&tar[..], dir.path()).unwrap_err()),
        ErrorCode::UnsafePath
    );
    assert!(snapshot(dir.path()).is_empty());
}

#[test]
fn device_entries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tar = tar_of(&[(b"dev", EntryType::Char, b"", b"")]);
    let err = extract(&tar[..], dir.path()).unwrap_err();
    assert_eq!(code_of(err), ErrorCode::InvalidArchive);
    assert!(snapshot(dir.path()).is_empty());
}

fn sample_tree() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    let root = src.path().join("proj");
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::write(root.join("a/b/c/deep.txt"), b"deep").unwrap();
    let binary: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    fs::write(root.join("a/blob.bin"), &binary).unwrap();
    fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("run.sh"), Permissions::from_mode(0o755)).unwrap();
    symlink("a/b", root.join("shortcut")).unwrap();
    symlink("/nowhere/at/all", root.join("dangling")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    src
}

#[test]
fn tar_gz_round_trips_through_build_and_extract() {
    let src = sample_tree();
    let root = src.path().join("proj");
    let old = UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    File::options()
        .write(true)
        .open(root.join("run.sh"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let gz = build(&root, Vec::new()).unwrap();
    assert_eq!(gz[..2], [0x1f, 0x8b], "gzip");

    let dest = tempfile::tempdir().unwrap();
    let stats = extract(&gz[..], dest.path()).unwrap();
    // proj, a, a/b, a/b/c, deep.txt, blob.bin, run.sh, shortcut, dangling, empty
    assert_eq!(stats.entries, 10);
    assert_eq!(stats.bytes, 4 + 200_000 + 18);
    let out = dest.path().join("proj");
    assert_eq!(snapshot(&out), snapshot(&root));
    let mode = fs::metadata(out.join("run.sh")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    assert_eq!(
        fs::metadata(out.join("run.sh"))
            .unwrap()
            .modified()
            .unwrap(),
        old
    );
    assert!(fs::symlink_metadata(out.join("shortcut"))
        .unwrap()
        .file_type()
        .is_symlink());
    let leftovers: Vec<_> = fs::read_dir(dest.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("proj")]);
}

#[test]
fn plain_tar_is_accepted_too() {
    let tar = tar_of(&[
        (b"./", EntryType::Directory, b"", b""),
        (b"./d/", EntryType::Directory, b"", b""),
        (b"./d/f", EntryType::Regular, b"", b"xyz"),
    ]);
    let dest = tempfile::tempdir().unwrap();
    let stats = extract(&tar[..], &dest.path().join("new/dir")).unwrap();
    assert_eq!(
        stats,
        ExtractStats {
            entries: 2,
            bytes: 3
        }
    );
    assert_eq!(fs::read(dest.path().join("new/dir/d/f")).unwrap(), b"xyz");
    let mode = fs::metadata(dest.path().join("new/dir/d")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o750);
}

#[test]
fn truncated_archives_are_invalid_and_leave_nothing() {
    let src = sample_tree();
    let gz = build(&src.path().join("proj"), Vec::new()).unwrap();
    let dest = tempfile::tempdir().unwrap();
    fs::write(dest.path().join("keep"), b"k").unwrap();
    let before = snapshot(dest.path());
    for cut in [gz.len() / 2, gz.len() - 4, 10] {
        let err = extract(&gz[..cut], dest.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::InvalidArchive, "cut at {cut}");
        assert_eq!(snapshot(dest.path()), before);
    }

    let tar = tar_of(&[
        (b"one", EntryType::Regular, b"", b"complete"),
        (b"two", EntryType::Regular, b"", &[7u8; 2000]),
    ]);
    for cut in [512 * 3 + 100, 512 * 2 + 100, 700] {
        let err = extract(&tar[..cut], dest.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::InvalidArchive, "cut at {cut}");
        assert_eq!(snapshot(dest.path()), before);
    }

    let missing = dest.path().join("not/yet");
    assert!(extract(&gz[..gz.len() / 2], &missing).is_err());
    assert!(!missing.exists());
}

#[test]
fn garbage_is_an_invalid_archive() {
    let dest = tempfile::tempdir().unwrap();
    let err = extract(&[0x55u8; 1024][..], dest.path()).unwrap_err();
    assert_eq!(code_of(err), ErrorCode::InvalidArchive);
    let err = extract(&[0x1f, 0x8b, 0, 1, 2, 3][..], dest.path()).unwrap_err();
    assert_eq!(code_of(err), ErrorCode::InvalidArchive);
    assert!(snapshot(dest.path()).is_empty());
}

#[test]
fn merge_into_an_existing_directory_keeps_unrelated_files() {
    let dest = tempfile::tempdir().unwrap();
    fs::create_dir_all(dest.path().join("proj/a")).unwrap();
    fs::write(dest.path().join("proj/a/mine.txt"), b"mine").unwrap();
    fs::write(dest.path().join("proj/run.sh"), b"old").unwrap();
    fs::write(dest.path().join("other.txt"), b"other").unwrap();
    let src = sample_tree();
    let gz = build(&src.path().join("proj"), Vec::new()).unwrap();
    extract(&gz[..], dest.path()).unwrap();
    assert_eq!(
        fs::read(dest.path().join("proj/a/mine.txt")).unwrap(),
        b"mine"
    );
    assert_eq!(fs::read(dest.path().join("other.txt")).unwrap(), b"other");
    assert_eq!(
        fs::read(dest.path().join("proj/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        fs::read(dest.path().join("proj/a/b/c/deep.txt")).unwrap(),
        b"deep"
    );
}

#[test]
fn merge_conflicts_are_refused_before_anything_moves() {
    let dest = tempfile::tempdir().unwrap();
    fs::create_dir(dest.path().join("x")).unwrap();
    fs::write(dest.path().join("y"), b"file").unwrap();
    let before = snapshot(dest.path());
    let tar = tar_of(&[
        (b"new.txt", EntryType::Regular, b"", b"n"),
        (b"x", EntryType::Regular, b"", b"file over dir"),
    ]);
    let err = extract(&tar[..], dest.path()).unwrap_err();
    assert_eq!(code_of(err), ErrorCode::IsADirectory);
    assert_eq!(snapshot(dest.path()), before);
    let tar = tar_of(&[(b"y/z", EntryType::Regular, b"", b"dir over file")]);
    let err = extract(&tar[..], dest.path()).unwrap_err();
    assert_eq!(code_of(err), ErrorCode::NotADirectory);
    assert_eq!(snapshot(dest.path()), before);
}

#[test]
fn later_entries_replace_links_instead_of_writing_through_them() {
    let dest = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = elsewhere.path().join("victim");
    fs::write(&outside, b"safe").unwrap();
    let target = outside.as_os_str().as_encoded_bytes().to_vec();
    let tar = tar_of(&[
        (b"f", EntryType::Symlink, &target, b""),
        (b"f", EntryType::Regular, b"", b"new"),
    ]);
    extract(&tar[..], dest.path()).unwrap();
    assert_eq!(fs::read(&outside).unwrap(), b"safe");
    assert_eq!(fs::read(dest.path().join("f")).unwrap(), b"new");
    assert!(fs::symlink_metadata(dest.path().join("f"))
        .unwrap()
        .is_file());
}

#[test]
fn a_single_file_archives_under_its_own_name() {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("one.txt"), b"1").unwrap();
    let gz = build(&src.path().join("one.txt"), Vec::new()).unwrap();
    let mut names = Vec::new();
    let mut archive = tar::Archive::new(GzDecoder::new(&gz[..]));
    for entry in archive.entries().unwrap() {
        names.push(entry.unwrap().path().unwrap().display().to_string());
    }
    assert_eq!(names, vec!["one.txt"]);
}
