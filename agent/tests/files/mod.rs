//! Files: reads, writes, listings, moves, and tar uploads and downloads (with unsafe paths refused).

use super::*;

/// A plain tar of `(name, type, link target, contents)` entries, names written as
/// given (tar::Builder would refuse `..` and absolute names).
fn raw_tar(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        let mut header = tar::Header::new_gnu();
        let gnu = header.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_size(data.len() as u64);
        header.set_mode(if *kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_entry_type(*kind);
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_write_with_mode_and_parents_then_read_whole_range_and_stat() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let w = ok(
        "write",
        c.write_file("/tmp/new/deep/data.bin", data.clone(), Some(0o640)),
    )
    .await;
    assert_eq!(
        (w.path.as_str(), w.size),
        ("/tmp/new/deep/data.bin", 300_000)
    );

    assert_eq!(
        ok("read", c.read_file("/tmp/new/deep/data.bin")).await,
        data
    );
    let range = ok(
        "read range",
        c.read_range("/tmp/new/deep/data.bin", Some(1000), Some(10)),
    )
    .await;
    assert_eq!(range, data[1000..1010]);
    let tail = ok(
        "read tail",
        c.read_range("/tmp/new/deep/data.bin", Some(299_990), None),
    )
    .await;
    assert_eq!(tail, data[299_990..]);

    let st = ok("stat", c.stat("/tmp/new/deep/data.bin")).await;
    assert_eq!(st.kind, FileKind::File);
    assert_eq!(st.size, 300_000);
    assert_eq!(st.mode, 0o640);
    assert_eq!(st.name, "data.bin");
    let st = ok("stat dir", c.stat("/tmp/new/deep")).await;
    assert_eq!(st.kind, FileKind::Directory);

    // The sandbox's own processes see the same file.
    let r = sb.sh("stat -c '%s %a' /tmp/new/deep/data.bin").await;
    assert_eq!(r.stdout.text_lossy(), "300000 640\n");

    let err = fails("read missing", c.read_file("/tmp/nope")).await;
    assert_api_error(&err, 404, ErrorCode::NotFound);
    let err = fails("write on read-only root", c.write_file("/etc/x", "x", None)).await;
    assert!(
        matches!(err.code(), Some(ErrorCode::PermissionDenied)),
        "{err}"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_list_depth_2_mkdir_move_and_remove_recursive() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    ok("mkdir", c.mkdir("/tmp/tree/sub/subsub")).await;
    ok("write a", c.write_file("/tmp/tree/a.txt", "a", None)).await;
    ok("write b", c.write_file("/tmp/tree/sub/b.txt", "bb", None)).await;
    ok(
        "write c",
        c.write_file("/tmp/tree/sub/subsub/c.txt", "ccc", None),
    )
    .await;

    let list = ok("list depth 1", c.list_dir("/tmp/tree", 1)).await;
    let paths: Vec<&str> = list.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, vec!["/tmp/tree/a.txt", "/tmp/tree/sub"]);
    let list = ok("list depth 2", c.list_dir("/tmp/tree", 2)).await;
    assert!(!list.truncated);
    let paths: Vec<&str> = list.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "/tmp/tree/a.txt",
            "/tmp/tree/sub",
            "/tmp/tree/sub/b.txt",
            "/tmp/tree/sub/subsub"
        ],
        "depth 2 lists the subdirectory's entries after it, not deeper"
    );
    let b = list.entries.iter().find(|e| e.name == "b.txt").unwrap();
    assert_eq!((b.kind, b.size), (FileKind::File, 2));
    let sub = list.entries.iter().find(|e| e.name == "sub").unwrap();
    assert_eq!(sub.kind, FileKind::Directory);

    ok("move", c.rename("/tmp/tree/sub", "/tmp/moved/sub2", false)).await;
    assert_eq!(
        ok("read moved", c.read_file("/tmp/moved/sub2/subsub/c.txt")).await,
        "ccc"
    );
    let err = fails("stat old", c.stat("/tmp/tree/sub")).await;
    assert_api_error(&err, 404, ErrorCode::NotFound);
    let err = fails(
        "move over",
        c.rename("/tmp/tree/a.txt", "/tmp/moved/sub2/b.txt", false),
    )
    .await;
    assert_api_error(&err, 409, ErrorCode::AlreadyExists);

    let err = fails("remove non-empty", c.remove("/tmp/moved", false)).await;
    assert_api_error(&err, 409, ErrorCode::DirectoryNotEmpty);
    ok("remove recursive", c.remove("/tmp/moved", true)).await;
    let err = fails("stat removed", c.stat("/tmp/moved")).await;
    assert_api_error(&err, 404, ErrorCode::NotFound);
    let r = sb.sh("ls -A /tmp").await;
    assert_eq!(r.stdout.text_lossy(), "tree\n");
    sb.stop();
}

/// The extractor must be running while the body is fed to it through a bounded queue:
/// an archive bigger than the queue once waited forever for an extractor that only
/// started when awaited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_archive_bigger_than_the_upload_queue_is_extracted() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    // Random bytes do not compress: the gzip body is about 4 MiB, many chunks.
    let mut noise = vec![0u8; 4 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let archive = tar_gz(&[("big.bin", &noise)]);
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        c.upload_tar("/tmp/big", archive),
    )
    .await
    .expect("the upload hung")
    .unwrap();
    assert_eq!(r.bytes, 4 << 20);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_upload_tar_gz_extracts_into_the_directory() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let archive = tar_gz(&[("top.txt", b"top\n"), ("nested/dir/inner.txt", b"inner\n")]);
    let r = ok("upload", c.upload_tar("/tmp/up", archive)).await;
    assert_eq!(r.path, "/tmp/up");
    assert_eq!(r.bytes, 10);
    assert_eq!(ok("read", c.read_file("/tmp/up/top.txt")).await, "top\n");
    assert_eq!(
        ok("read nested", c.read_file("/tmp/up/nested/dir/inner.txt")).await,
        "inner\n"
    );
    let err = fails(
        "garbage archive",
        c.upload_tar("/tmp/up2", &b"not a tar at all"[..]),
    )
    .await;
    assert_api_error(&err, 400, ErrorCode::InvalidArchive);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_download_dir_as_tar_gz_holds_its_entries() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    ok("write a", c.write_file("/tmp/src/a.txt", "alpha", None)).await;
    ok(
        "write b",
        c.write_file("/tmp/src/sub/b.txt", "beta", Some(0o600)),
    )
    .await;
    let gz = ok("download", c.download_tar("/tmp/src")).await;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
    let mut entries = BTreeSet::new();
    let mut contents = Vec::new();
    for entry in archive.entries().expect("a tar.gz") {
        let mut entry = entry.expect("a tar entry");
        let path = entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        if entry.header().entry_type().is_file() {
            let mut data = String::new();
            entry.read_to_string(&mut data).unwrap();
            contents.push((path.clone(), data, entry.header().mode().unwrap() & 0o777));
        }
        entries.insert(path);
    }
    let expected: BTreeSet<String> = ["src", "src/a.txt", "src/sub", "src/sub/b.txt"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(entries, expected);
    contents.sort();
    assert_eq!(
        contents,
        vec![
            ("src/a.txt".to_string(), "alpha".to_string(), 0o644),
            ("src/sub/b.txt".to_string(), "beta".to_string(), 0o600),
        ]
    );
    let err = fails("download missing", c.download_tar("/tmp/nope")).await;
    assert_api_error(&err, 404, ErrorCode::NotFound);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_upload_with_a_parent_dir_entry_is_unsafe_path_and_writes_nothing() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    ok("mkdir", c.mkdir("/tmp/target")).await;
    let archive = raw_tar(&[
        ("good.txt", tar::EntryType::Regular, "", b"good\n"),
        ("../evil", tar::EntryType::Regular, "", b"evil\n"),
    ]);
    let err = fails("upload", c.upload_tar("/tmp/target", archive)).await;
    assert_api_error(&err, 400, ErrorCode::UnsafePath);
    let r = sb
        .sh("ls -A /tmp/target; test -e /tmp/evil && echo EVIL")
        .await;
    assert_eq!(
        r.stdout.text_lossy(),
        "",
        "a refused archive must write nothing, in or out of the target"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_upload_escaping_by_absolute_name_or_symlink_is_unsafe_path() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    ok("mkdir", c.mkdir("/tmp/target")).await;
    let archives = [
        (
            "absolute name",
            raw_tar(&[("/tmp/abs.txt", tar::EntryType::Regular, "", b"abs\n")]),
        ),
        (
            "write through an archived symlink",
            raw_tar(&[
                ("link", tar::EntryType::Symlink, "/tmp", b""),
                (
                    "link/through.txt",
                    tar::EntryType::Regular,
                    "",
                    b"through\n",
                ),
            ]),
        ),
        (
            "hard link to a file outside",
            raw_tar(&[("hard", tar::EntryType::Link, "../../etc/passwd", b"")]),
        ),
    ];
    for (what, archive) in archives {
        let err = fails(what, c.upload_tar("/tmp/target", archive)).await;
        assert_api_error(&err, 400, ErrorCode::UnsafePath);
    }
    let r = sb.sh("ls -A /tmp/target; ls -A /tmp").await;
    assert_eq!(r.stdout.text_lossy(), "target\n", "nothing may be written");
    sb.stop();
}
