//! Issue 30, point 7: in an image with a `User`, the files API reads as that user.
//! Code in the sandbox plants links to a root-only file, a root-only directory and the
//! agent's own first environment (which held its token) and waits for a client to read
//! them back through the API: every read, stat, listing and download through such a
//! link is refused, while the user's own files read as before.

use std::os::unix::fs::PermissionsExt;

use orchard_protocol::ErrorCode;

use crate::util::sandbox::{image, layers, sh_ok, spec_of, TestBackend};

/// A layer with root-only things: `/root` (0700) holding `key`, and `/etc/secret`,
/// both 0600 and owned by root.
fn secret_layer(dir: &std::path::Path) {
    let set = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    std::fs::create_dir_all(dir.join("root")).unwrap();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("root/key"), "ROOT-KEY\n").unwrap();
    std::fs::write(dir.join("etc/secret"), "ROOT-SECRET\n").unwrap();
    set(&dir.join("root/key"), 0o600);
    set(&dir.join("etc/secret"), 0o600);
    set(&dir.join("root"), 0o700);
}

/// Asserts `result` is a refusal (permission denied) whose text carries no secret.
fn refused<T: std::fmt::Debug>(what: &str, result: Result<T, orchard_client::ClientError>) {
    let err = match result {
        Ok(v) => panic!("{what}: read through a planted link: {v:?}"),
        Err(e) => e,
    };
    assert_eq!(
        err.code(),
        Some(ErrorCode::PermissionDenied),
        "{what}: {err}"
    );
    let text = err.to_string();
    assert!(
        !text.contains("ROOT-") && !text.contains("ORCHARD_AGENT_TOKEN"),
        "{what}: {text}"
    );
}

/// The type and content of each entry of a tar.gz.
fn tar_entries(gz: &[u8]) -> Vec<(tar::EntryType, Vec<u8>)> {
    use std::io::Read;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        out.push((entry.header().entry_type(), data));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_files_api_reads_as_the_image_user_not_through_planted_links() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let secrets = tempfile::tempdir().unwrap();
    secret_layer(secrets.path());
    let l = layers();
    let config = orchard::image::ImageConfig {
        user: Some("app".into()),
        ..orchard::image::ImageConfig::default()
    };
    let layers = vec![
        l.busybox.clone(),
        l.top.clone(),
        secrets.path().to_path_buf(),
    ];
    let sb = tb
        .create(spec_of(image("app-secrets", layers, config), "reads"))
        .await;
    // The user itself cannot read them: what the API must not do for it either.
    assert_eq!(
        sh_ok(
            &sb,
            "id -u; cat /etc/secret /root/key /proc/1/environ 2>/dev/null; echo $?"
        )
        .await,
        "1000\n1\n"
    );
    sh_ok(
        &sb,
        "cd /workspace && ln -s /etc/secret s && ln -s /root r && ln -s /proc/1/environ env \
         && ln -s /proc/1 agent && echo mine > own && ln -s own own-link",
    )
    .await;
    let agent = sb.client();

    for path in ["/workspace/s", "/workspace/env"] {
        refused(&format!("read {path}"), agent.read_file(path).await);
        // A download of the link itself carries the link, never its target's content.
        let tar = agent.download_tar(path).await.unwrap();
        let entries = tar_entries(&tar);
        assert_eq!(entries.len(), 1, "{path}: {entries:?}");
        assert_eq!(entries[0].0, tar::EntryType::Symlink, "{path}: {entries:?}");
    }
    // Through the agent's own /proc entries: its environment, and its descriptors
    // (fd 1 is its log file on the host, outside the sandbox's root).
    for path in [
        "/workspace/r/key",
        "/workspace/agent/environ",
        "/workspace/agent/fd/1",
        "/workspace/agent/maps",
    ] {
        refused(&format!("read {path}"), agent.read_file(path).await);
        refused(&format!("tar {path}"), agent.download_tar(path).await);
    }
    refused("stat in /root", agent.stat("/workspace/r/key").await);
    refused(
        "stat an agent fd",
        agent.stat("/workspace/agent/fd/1").await,
    );
    refused("list /root", agent.list_dir("/workspace/r", 1).await);
    refused("list /root", agent.list_dir("/workspace/r/", 2).await);
    refused(
        "list the agent's fds",
        agent.list_dir("/workspace/agent/fd", 1).await,
    );

    // The user's own files, directly and through its own link, read as before; the
    // planted links themselves can be looked at (they are the user's).
    assert_eq!(
        &agent.read_file("/workspace/own").await.unwrap()[..],
        b"mine\n"
    );
    assert_eq!(
        &agent.read_file("/workspace/own-link").await.unwrap()[..],
        b"mine\n"
    );
    let link = agent.stat("/workspace/s").await.unwrap();
    assert_eq!(link.link_target.as_deref(), Some("/etc/secret"));
    let listed = agent.list_dir("/workspace", 1).await.unwrap();
    assert!(listed.entries.iter().any(|e| e.name == "own"), "{listed:?}");
    let whole = tar_entries(&agent.download_tar("/workspace").await.unwrap());
    assert!(whole.iter().any(|(_, data)| data == b"mine\n"), "{whole:?}");
    assert!(
        !whole.iter().any(|(_, data)| data.starts_with(b"ROOT-")),
        "{whole:?}"
    );
    // World-readable files of root's stay readable.
    assert_eq!(&agent.read_file("/etc/motd").await.unwrap()[..], b"top\n");
    tb.finish().await;
}
