//! Two stores on one Redis are two replicas: what one writes, the other sees and is
//! woken by; leases and job order hold across them.

use std::time::Duration;

use orchard::state::conformance::{finished, job, record};
use orchard::state::redis::RedisStore;
use orchard::state::{StateStore, StoreError, Topic};
use orchard_protocol::compat::JobStatus;

use super::RedisServer;

#[tokio::test]
async fn a_write_on_one_replica_wakes_a_wait_on_the_other() {
    let redis = RedisServer::start();
    let a = RedisStore::connect(&redis.url(), "orchard").await.unwrap();
    let b = RedisStore::connect(&redis.url(), "orchard").await.unwrap();
    a.insert_sandbox(record("sb", "u1")).await.unwrap();
    let mut queue_on_b = b.subscribe(Topic::Queue("sb".into()));
    a.insert_job(job("job-1", "sb"), "u1").await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(5), queue_on_b.changed()).await;
    assert_eq!(woke.ok(), Some(true), "B's worker is woken by A's submit");

    let lease = b
        .acquire_lease("sandbox/sb", "b", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(
        a.acquire_lease("sandbox/sb", "a", Duration::from_secs(30))
            .await
            .unwrap()
            .is_none(),
        "one worker per sandbox across replicas"
    );
    let mut done_on_a = a.subscribe(Topic::Job("job-1".into()));
    let taken = b.take_job("sb", &lease).await.unwrap().unwrap();
    assert_eq!(
        a.job("job-1").await.unwrap().unwrap().job.status,
        JobStatus::Running
    );
    b.finish_job(finished(taken, 0, "hi\n", 5), Some(&lease))
        .await
        .unwrap();
    // The wait on A: woken, possibly by the take first; it re-reads until finished.
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let j = a.job("job-1").await.unwrap().unwrap();
            if j.job.status.is_finished() {
                return j;
            }
            assert!(done_on_a.changed().await);
        }
    })
    .await
    .expect("A's wait ends when B finishes the job");
    assert_eq!(read.job.stdout, "hi\n");
}

#[tokio::test]
async fn two_replicas_racing_on_one_record_both_land_or_one_is_told_to_retry() {
    let redis = RedisServer::start();
    let a = RedisStore::connect(&redis.url(), "orchard").await.unwrap();
    let b = RedisStore::connect(&redis.url(), "orchard").await.unwrap();
    let v = a.insert_sandbox(record("sb", "u1")).await.unwrap();
    let mut ra = record("sb", "u1");
    ra.heartbeat_ms = Some(1);
    let mut rb = record("sb", "u1");
    rb.heartbeat_ms = Some(2);
    let (x, y) = tokio::join!(a.update_sandbox(ra, v), b.update_sandbox(rb, v));
    let oks = [x.is_ok(), y.is_ok()];
    assert_eq!(oks.iter().filter(|o| **o).count(), 1, "{x:?} {y:?}");
    assert!([x, y]
        .into_iter()
        .any(|r| matches!(r, Err(StoreError::Conflict(_)))));
    // Both remove: one gets the record, the other nothing.
    let (x, y) = tokio::join!(a.remove_sandbox("sb", "u1"), b.remove_sandbox("sb", "u1"));
    let removed = [x.unwrap(), y.unwrap()];
    assert_eq!(removed.iter().filter(|r| r.is_some()).count(), 1);
    // Many slots taken at once from both: never past the limit.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let s = if i % 2 == 0 { &a } else { &b };
        tasks.push(s.acquire_slot("creates", 7));
    }
    let got = futures_util::future::join_all(tasks).await;
    assert_eq!(got.into_iter().filter(|g| *g.as_ref().unwrap()).count(), 7);
}
