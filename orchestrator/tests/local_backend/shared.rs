//! Shared roots: several backends opened with `shared` on one root, as `orchard serve`
//! replicas over one Redis run on one data directory. Two backends opened in one test
//! process stand for two processes: flocks belong to open file descriptions, so two
//! opens of one lock file conflict as they would across processes.

use std::fs;
use std::time::Duration;

use orchard::backend::local::{FailPoint, LocalBackend, LocalConfig, LocalError, SandboxSpec};
use orchard::backend::Backend;

use super::init_pid_at_fail_point;
use crate::util::sandbox::*;

fn shared_config(root: &std::path::Path) -> LocalConfig {
    let mut config = test_config(root);
    config.shared = true;
    config
}

/// A second backend on `tb`'s root, shared; dropped before `tb.finish()`, which
/// destroys the root.
fn open_second(tb: &TestBackend) -> LocalBackend {
    LocalBackend::open(shared_config(&tb.root)).expect("opening a second shared backend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_backends_share_a_root_and_an_exclusive_one_is_refused_beside_them() {
    orchard_test_support::require_runc!();
    let a = TestBackend::with_config(shared_config(&fresh_root()));
    // Two more at once: their injections of the agent take turns.
    let (b, c) = std::thread::scope(|s| {
        let b = s.spawn(|| open_second(&a));
        let c = s.spawn(|| open_second(&a));
        (b.join().unwrap(), c.join().unwrap())
    });
    drop(c);
    let mut exclusive = test_config(&a.root);
    exclusive.lock_wait = Duration::from_millis(300);
    let e = LocalBackend::open(exclusive).unwrap_err();
    assert!(matches!(e, LocalError::Busy(_)), "{e}");
    drop(b);
    a.finish().await;

    // And a shared one is refused beside an exclusive one.
    let tb = TestBackend::new();
    let mut shared = shared_config(&tb.root);
    shared.lock_wait = Duration::from_millis(300);
    let e = LocalBackend::open(shared).unwrap_err();
    assert!(matches!(e, LocalError::Busy(_)), "{e}");
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_one_shared_backend_created_is_listed_and_deleted_by_another() {
    orchard_test_support::require_runc!();
    let a = TestBackend::with_config(shared_config(&fresh_root()));
    let b = open_second(&a);
    let sb = a.busybox().await;
    let listed: Vec<String> = b.list().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, std::slice::from_ref(&sb.id));
    // B reaches it with what it read from the disk (its token included).
    let via_b = b.get(&sb.id).expect("B gets A's sandbox");
    assert_eq!(sh_ok(&via_b, "echo from b").await, "from b\n");
    // A shared backend's shutdown leaves the sandboxes to the other replicas.
    Backend::shutdown(&b).await.expect("B's shutdown");
    assert!(sb.bundle.exists());
    assert_eq!(sh_ok(&sb, "echo still here").await, "still here\n");

    within(Duration::from_secs(60), b.delete(&sb.id))
        .await
        .expect("B deletes A's sandbox");
    assert!(!sb.bundle.exists());
    assert!(b.list().is_empty());
    // A sees it gone, and deleting it again finds nothing.
    assert!(a.backend.list().is_empty());
    assert!(a.backend.get(&sb.id).is_none());
    assert!(matches!(
        a.backend.delete(&sb.id).await,
        Err(LocalError::NotFound(_))
    ));
    assert!(matches!(
        b.delete(&sb.id).await,
        Err(LocalError::NotFound(_))
    ));
    assert!(!a
        .root
        .join("locks")
        .join(format!("{}.lock", sb.id))
        .exists());
    assert_clean(&a.backend).await;
    assert_clean(&b).await;
    drop(b);
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_on_a_shared_root_leaves_alone_a_sandbox_another_backend_is_creating() {
    orchard_test_support::require_runc!();
    // A's creates stop after `runc create`, holding the sandbox's lock: a create in
    // flight. A runs on a runtime of its own so that shutting that runtime down drops
    // the create as a dying process would (its lock goes, its sandbox stays).
    let mut config = shared_config(&fresh_root());
    config.fail_point = Some(FailPoint::HangAfterRuncCreate);
    let a = TestBackend::with_config(config);
    // A short wait for a sandbox's lock: B's delete of A's sandbox in flight gives up.
    let mut b_config = shared_config(&a.root);
    b_config.lock_wait = Duration::from_millis(200);
    let b = LocalBackend::open(b_config).expect("opening B");
    let id = unique_id("inflight");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some(id.clone());
    let a_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("A's runtime");
    let creating = a.backend.clone();
    a_runtime.spawn(async move { creating.create(spec).await });
    let dir = a.root.join("sandboxes").join(&id);
    let lock = a.root.join("locks").join(format!("{id}.lock"));
    let pid = init_pid_at_fail_point(&dir).await;
    assert!(lock.exists());

    let report = within(Duration::from_secs(60), b.recover())
        .await
        .expect("B recovers");
    assert_eq!(report.skipped, std::slice::from_ref(&id), "{report:?}");
    assert!(
        report.removed.is_empty() && report.adopted.is_empty(),
        "{report:?}"
    );
    assert!(report.problems.is_empty(), "{report:?}");
    assert!(dir.join("rootfs").exists(), "the sandbox was torn down");
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        !stat.is_empty() && !stat.contains(") Z "),
        "the sandbox's init {pid} was killed: {stat:?}"
    );
    // Not running yet: B does not list it, and cannot delete it while A holds it.
    assert!(b.list().is_empty());
    let e = b.delete(&id).await.unwrap_err();
    assert!(matches!(e, LocalError::SandboxBusy(_)), "{e}");
    assert!(dir.join("rootfs").exists());

    // A "dies": its create is dropped and its lock with it; now recovery removes the
    // half-made sandbox.
    tokio::task::spawn_blocking(move || a_runtime.shutdown_timeout(Duration::from_secs(10)))
        .await
        .expect("shutting A's runtime down");
    assert!(!lock.exists(), "the dropped create kept its lock");
    let report = within(Duration::from_secs(60), b.recover())
        .await
        .expect("B recovers again");
    assert_eq!(report.removed, std::slice::from_ref(&id), "{report:?}");
    assert!(report.problems.is_empty(), "{report:?}");
    assert!(!dir.exists());
    assert_clean(&b).await;
    drop(b);
    a.finish().await;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "the sandbox's init {pid} outlived recovery: {stat}"
    );
}
