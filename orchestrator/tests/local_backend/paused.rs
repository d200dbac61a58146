//! A paused sandbox across a backend restart: a backend alone on its root adopts it
//! running (its agent cannot answer health checks while frozen, which used to get it
//! removed as broken), its captured layers and snapshots stay on the root, and the
//! copy of a capture killed half-way is reported and removed.

use orchard::backend::local::{LocalBackend, SandboxSpec};
use orchard::backend::{Backend, SnapshotSpec};

use crate::util::sandbox::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_left_by_a_backend_is_adopted_running_with_its_snapshot() {
    orchard_test_support::require_runc!();
    let root = fresh_root();
    let first = LocalBackend::open(test_config(&root)).expect("opening the backend");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some("frozen".into());
    let sb = first.create(spec).await.expect("creating");
    sh_ok(&sb, "echo before > /f").await;
    let snap = Backend::snapshot(
        &first,
        SnapshotSpec {
            sandbox_id: "frozen".into(),
            ..Default::default()
        },
    )
    .await
    .expect("a snapshot");
    first.pause("frozen").await.expect("pausing");
    // The backend process goes; its sandboxes stay (as after a SIGKILL).
    drop(first);

    // A capture killed half-way leaves its copy; a dead pid names it.
    let stale = root.join("layers/.tmp-2147483000-dead");
    std::fs::create_dir_all(stale.join("half")).unwrap();
    let tb = TestBackend::with_config(test_config(&root));
    let leaks = tb.backend.audit().await.unwrap();
    assert!(leaks.directories.contains(&stale), "{leaks}");
    let report = tb.backend.recover().await.expect("recovering");
    assert!(!stale.exists(), "recovery removes a dead capture's copy");
    assert_eq!(report.adopted, ["frozen"], "{report:?}");
    let sb = tb.backend.get("frozen").expect("adopted");
    assert_eq!(sh_ok(&sb, "cat /f").await, "before\n");
    let snaps = tb.backend.snapshots().expect("listing snapshots");
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].id, snap.id);
    tb.backend.delete("frozen").await.expect("deleting");
    assert_eq!(
        tb.backend
            .delete_snapshot(&snap.id)
            .await
            .expect("deleting"),
        snap.size_bytes,
        "what the snapshot was charged is freed (7 bytes of content and its entries)"
    );
    assert!(tb.backend.snapshots().unwrap().is_empty());
    tb.finish().await;
}
