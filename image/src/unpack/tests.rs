//! Tests of unpacking layers: whiteouts, links, modes and the refusals.

use super::*;
use crate::digest::of_bytes;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// A tar built entry by entry, with raw names so tests can write hostile ones.
struct TarBuilder(tar::Builder<Vec<u8>>);

impl TarBuilder {
    fn new() -> Self {
        TarBuilder(tar::Builder::new(Vec::new()))
    }

    fn header(name: &str, kind: EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        let bytes = name.as_bytes();
        header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_600_000_000);
        header
    }

    fn file(mut self, name: &str, data: &[u8], mode: u32, uid: u64) -> Self {
        let mut header = Self::header(name, EntryType::Regular, mode, data.len() as u64);
        header.set_uid(uid);
        header.set_gid(uid);
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    fn dir(mut self, name: &str, mode: u32) -> Self {
        let mut header = Self::header(name, EntryType::Directory, mode, 0);
        header.set_cksum();
        self.0.append(&header, &[][..]).unwrap();
        self
    }

    fn link(mut self, name: &str, kind: EntryType, target: &str) -> Self {
        let mut header = Self::header(name, kind, 0o777, 0);
        let bytes = target.as_bytes();
        header.as_old_mut().linkname[..bytes.len()].copy_from_slice(bytes);
        header.set_cksum();
        self.0.append(&header, &[][..]).unwrap();
        self
    }

    fn build(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn unpack_bytes(data: &[u8]) -> (tempfile::TempDir, Result<Unpacked, ImageError>) {
    let dir = tempfile::tempdir().unwrap();
    let result = unpack(&mut &data[..], dir.path(), "layer test");
    (dir, result)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn keeps_files_links_owners_modes_and_times() {
    orchard_test_support::require_root!("chown and mknod");
    let tar = TarBuilder::new()
        .dir("./", 0o755)
        .dir("etc/", 0o750)
        .file("etc/passwd", b"root:x:0:0\n", 0o644, 0)
        .file("usr/bin/su", b"suid", 0o4755, 0)
        .file("home/u/own", b"mine", 0o600, 1000)
        .link("etc/link", EntryType::Symlink, "/etc/passwd")
        .link("etc/hard", EntryType::Link, "./etc/passwd")
        .build();
    let (dir, result) = unpack_bytes(&tar);
    let unpacked = result.unwrap();
    assert_eq!(unpacked.diff_id, of_bytes(&tar));
    assert_eq!(unpacked.compression, Compression::None);
    let root = dir.path();
    assert_eq!(fs::read(root.join("etc/passwd")).unwrap(), b"root:x:0:0\n");
    let etc = fs::metadata(root.join("etc")).unwrap();
    assert_eq!(etc.mode() & 0o7777, 0o750);
    assert_eq!(etc.mtime(), 1_600_000_000);
    assert_eq!(
        fs::metadata(root.join("usr/bin/su")).unwrap().mode() & 0o7777,
        0o4755
    );
    let own = fs::metadata(root.join("home/u/own")).unwrap();
    assert_eq!(
        (own.uid(), own.gid(), own.mode() & 0o777),
        (1000, 1000, 0o600)
    );
    assert_eq!(own.mtime(), 1_600_000_000);
    assert_eq!(
        fs::read_link(root.join("etc/link")).unwrap(),
        Path::new("/etc/passwd")
    );
    let hard = fs::metadata(root.join("etc/hard")).unwrap();
    assert_eq!(
        hard.ino(),
        fs::metadata(root.join("etc/passwd")).unwrap().ino()
    );
}

#[test]
fn whiteouts_become_overlay_whiteouts() {
    orchard_test_support::require_root!("chown and mknod");
    let tar = TarBuilder::new()
        .file("data/.wh.gone", b"", 0o644, 0)
        .file("opaque/.wh..wh..opq", b"", 0o644, 0)
        .dir("opaque/", 0o755)
        .file("opaque/new", b"new", 0o644, 0)
        .file(".wh..wh.plnk", b"", 0o644, 0)
        .build();
    let (dir, result) = unpack_bytes(&gzip(&tar));
    let unpacked = result.unwrap();
    assert_eq!(unpacked.compression, Compression::Gzip);
    assert_eq!(unpacked.diff_id, of_bytes(&tar));
    let gone = fs::symlink_metadata(dir.path().join("data/gone")).unwrap();
    assert!(gone.file_type().is_char_device());
    assert_eq!(gone.rdev(), 0);
    assert!(!dir.path().join("data/.wh.gone").exists());
    assert_eq!(
        get_xattr(&dir.path().join("opaque"), OPAQUE_XATTR).unwrap(),
        Some(b"y".to_vec())
    );
    assert_eq!(
        get_xattr(&dir.path().join("data"), OPAQUE_XATTR).unwrap(),
        None
    );
    assert!(!dir.path().join(".wh..wh.plnk").exists());
}

#[test]
fn empty_numeric_fields_are_zero() {
    orchard_test_support::require_root!("chown and mknod");
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..1].copy_from_slice(b"f");
    header.set_entry_type(EntryType::Regular);
    header.set_size(2);
    header.set_mode(0o640);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &b"ok"[..]).unwrap();
    let (dir, result) = unpack_bytes(&builder.into_inner().unwrap());
    result.unwrap();
    let meta = fs::metadata(dir.path().join("f")).unwrap();
    assert_eq!(
        (meta.uid(), meta.mtime(), meta.mode() & 0o777),
        (0, 0, 0o640)
    );
}

#[test]
fn zstd_layers_unpack() {
    let tar = TarBuilder::new().file("a", b"zstd!", 0o644, 0).build();
    let compressed = zstd::encode_all(&tar[..], 1).unwrap();
    let (dir, result) = unpack_bytes(&compressed);
    let unpacked = result.unwrap();
    assert_eq!(unpacked.compression, Compression::Zstd);
    assert_eq!(unpacked.diff_id, of_bytes(&tar));
    assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"zstd!");
}

#[test]
fn empty_layer_unpacks_to_nothing() {
    let tar = TarBuilder::new().build();
    let (dir, result) = unpack_bytes(&tar);
    assert_eq!(result.unwrap().entries, 0);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    let (_dir, result) = unpack_bytes(b"");
    assert_eq!(result.unwrap().diff_id, of_bytes(b""));
}

#[test]
fn later_entries_replace_earlier_ones() {
    let tar = TarBuilder::new()
        .file("x", b"first", 0o644, 0)
        .file("x", b"second", 0o644, 0)
        .dir("d/", 0o755)
        .file("d/inner", b"", 0o644, 0)
        .file("d", b"now a file", 0o644, 0)
        .build();
    let (dir, result) = unpack_bytes(&tar);
    result.unwrap();
    assert_eq!(fs::read(dir.path().join("x")).unwrap(), b"second");
    assert_eq!(fs::read(dir.path().join("d")).unwrap(), b"now a file");
}

#[test]
fn refuses_escapes() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap().to_string();
    let cases = [
        TarBuilder::new().file("../evil", b"x", 0o644, 0).build(),
        TarBuilder::new()
            .file("a/../../evil", b"x", 0o644, 0)
            .build(),
        TarBuilder::new()
            .link("out", EntryType::Symlink, &target)
            .file("out/evil", b"x", 0o644, 0)
            .build(),
        TarBuilder::new()
            .link("out", EntryType::Symlink, &target)
            .file("out/.wh.evil", b"", 0o644, 0)
            .build(),
        TarBuilder::new()
            .link("hard", EntryType::Link, "../../etc/passwd")
            .build(),
        TarBuilder::new()
            .link("hard", EntryType::Link, "missing")
            .build(),
    ];
    for (i, tar) in cases.iter().enumerate() {
        let (_dir, result) = unpack_bytes(tar);
        match result {
            Err(ImageError::Invalid { reason, .. }) => {
                assert!(reason.contains("entry"), "case {i}: {reason}")
            }
            other => panic!("case {i}: {other:?}"),
        }
    }
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn refuses_garbage() {
    let (_dir, result) = unpack_bytes(&gzip(b"this is not a tar archive at all, not even close"));
    assert!(
        matches!(result, Err(ImageError::Invalid { .. })),
        "{result:?}"
    );
}

#[test]
fn verified_checks_both_digests_and_prefers_the_blob_mismatch() {
    let tar = TarBuilder::new().file("f", &[7u8; 5000], 0o644, 0).build();
    let blob = gzip(&tar);
    let diff_id = of_bytes(&tar);
    let blob_digest = of_bytes(&blob);
    let dir = tempfile::tempdir().unwrap();
    let verified =
        unpack_verified(&blob[..], dir.path(), Some(&blob_digest), &diff_id, "l").unwrap();
    assert_eq!(
        (verified.blob_digest, verified.blob_size),
        (blob_digest.clone(), blob.len() as u64)
    );

    // A corrupted blob: the decompressor fails, but the report is the digest.
    let mut corrupt = blob.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    let dir = tempfile::tempdir().unwrap();
    match unpack_verified(&corrupt[..], dir.path(), Some(&blob_digest), &diff_id, "l") {
        Err(ImageError::DigestMismatch { expected, .. }) => assert_eq!(expected, blob_digest),
        other => panic!("{other:?}"),
    }
    // The right blob under a wrong diff_id.
    let dir = tempfile::tempdir().unwrap();
    let wrong = of_bytes(b"other");
    match unpack_verified(&blob[..], dir.path(), Some(&blob_digest), &wrong, "l") {
        Err(ImageError::DigestMismatch { what, .. }) => {
            assert!(what.contains("diff_id"), "{what}")
        }
        other => panic!("{other:?}"),
    }
}
