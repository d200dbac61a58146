//! A sandbox no node can take yet (the Kubernetes backend's progress, through the fake
//! backend): unschedulable on both APIs while it waits, ready once placed, failed
//! saying why at its limit.

use super::*;

/// The record `id` once `done` holds of it (woken by its writes, up to 10 s).
async fn record_once(
    h: &Harness,
    id: &str,
    done: impl Fn(&SandboxRecord) -> bool,
) -> SandboxRecord {
    let store = h.service.store();
    let wait = async {
        loop {
            let mut changes = store.subscribe(crate::state::Topic::Sandbox(id.to_string()));
            let rec = store.sandbox(id).await.unwrap().unwrap().value;
            if done(&rec) {
                return rec;
            }
            changes.changed().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the record changed as expected")
}

/// The progress sink the backend got with the create of `id`.
fn progress_of(h: &Harness, id: &str) -> crate::backend::StartProgress {
    h.backend
        .created
        .lock()
        .unwrap()
        .iter()
        .find(|s| s.id == id)
        .expect("the create reached the backend")
        .progress
        .clone()
}

/// While the backend says no node can take a pending sandbox, both APIs say
/// `unschedulable` with the scheduler's reason; it is not terminal (waits go on), goes
/// back to `pending` once scheduled, and the sandbox becomes ready when the create ends.
#[tokio::test]
async fn a_sandbox_no_node_can_take_yet_is_unschedulable_on_both_apis_until_it_is_ready() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let h = Harness::new(FakeBackend::tcp().gated(gate.clone())).await;
    let mut creates = h.backend.creates.subscribe();
    let rec = h.service.create(&tenant(), create_req()).await.unwrap();
    creates.wait_for(|n| *n >= 1).await.unwrap();
    let progress = progress_of(&h, &rec.id);

    progress.unschedulable(NO_NODE);
    record_once(&h, &rec.id, |r| r.unschedulable.is_some()).await;
    let (status, compat) = h.call("GET", &format!("/sandboxes/{}", rec.id), None).await;
    assert_eq!(status, StatusCode::OK, "{compat}");
    assert_eq!(
        (
            &compat["status"],
            &compat["status_message"],
            &compat["ready"]
        ),
        (&"unschedulable".into(), &NO_NODE.into(), &false.into()),
        "{compat}"
    );
    let (_, v1) = h
        .call("GET", &format!("/v1/sandboxes/{}", rec.id), None)
        .await;
    assert_eq!(
        (&v1["status"], &v1["status_message"], &v1["ready"]),
        (&"unschedulable".into(), &NO_NODE.into(), &false.into()),
        "{v1}"
    );
    // Not terminal: a wait times out as for any pending sandbox, it does not fail.
    let err = h
        .service
        .wait_ready(&tenant(), &rec.id, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReadyTimeout { .. }), "{err:?}");

    progress.scheduled();
    record_once(&h, &rec.id, |r| r.unschedulable.is_none()).await;
    let (_, compat) = h.call("GET", &format!("/sandboxes/{}", rec.id), None).await;
    assert_eq!(compat["status"], "pending", "{compat}");

    progress.unschedulable(NO_NODE);
    record_once(&h, &rec.id, |r| r.unschedulable.is_some()).await;
    gate.add_permits(1);
    let ready = h
        .service
        .wait_ready(&tenant(), &rec.id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((ready.phase, ready.unschedulable), (Phase::Ready, None));
    let (_, compat) = h.call("GET", &format!("/sandboxes/{}", rec.id), None).await;
    assert_eq!(
        (&compat["status"], &compat["status_message"]),
        (&"ready".into(), &"".into()),
        "{compat}"
    );
}

/// A sandbox still unschedulable when its readiness limit runs out fails, and the
/// failure says it waited for a node and why.
#[tokio::test]
async fn a_sandbox_still_unschedulable_at_its_limit_fails_saying_why() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let h = Harness::new(FakeBackend::tcp().gated(gate.clone())).await;
    let mut creates = h.backend.creates.subscribe();
    let req = CreateRequest {
        ready_timeout_s: Some(1),
        ..create_req()
    };
    let rec = h.service.create(&tenant(), req).await.unwrap();
    creates.wait_for(|n| *n >= 1).await.unwrap();
    progress_of(&h, &rec.id).unschedulable(NO_NODE);
    let err = h
        .service
        .wait_ready(&tenant(), &rec.id, Duration::from_secs(10))
        .await
        .unwrap_err();
    let Error::StartFailed { reason, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        reason,
        &format!("the sandbox was not ready within 1 s (unschedulable: {NO_NODE})")
    );
    let rec = h
        .service
        .store()
        .sandbox(&rec.id)
        .await
        .unwrap()
        .unwrap()
        .value;
    assert_eq!(
        rec.unschedulable, None,
        "a failed record is not unschedulable"
    );
    let (_, compat) = h.call("GET", &format!("/sandboxes/{}", rec.id), None).await;
    assert_eq!(compat["status"], "failed", "{compat}");
    gate.add_permits(1);
}
