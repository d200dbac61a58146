//! One Redis store: the conformance checks, and Redis trouble.

use std::time::{Duration, Instant};

use orchard::state::conformance;
use orchard::state::redis::{RedisStore, CALL_TIMEOUT};
use orchard::state::{StateStore, StoreError, Topic};

use super::RedisServer;

#[tokio::test]
async fn the_redis_store_passes_the_conformance_checks() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), "orchard").await.unwrap();
    conformance::all(&store, "redis").await;
    // Another prefix is another deployment: it sees none of it.
    let other = RedisStore::connect(&redis.url(), "other").await.unwrap();
    assert!(other.sandboxes().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_store_that_cannot_reach_redis_says_so_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redis+unix://{}", dir.path().join("none.sock").display());
    let err = RedisStore::connect(&url, "orchard").await.err().unwrap();
    assert!(err.to_string().contains("redis"), "{err}");
    let err = RedisStore::connect("http://nope", "orchard")
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("bad redis URL"), "{err}");
}

#[tokio::test]
async fn while_redis_is_away_calls_fail_fast_and_the_store_recovers_by_itself() {
    let mut redis = RedisServer::start_with(true);
    let store = RedisStore::connect(&redis.url(), "orchard").await.unwrap();
    store
        .insert_sandbox(conformance::record("kept", "u1"))
        .await
        .unwrap();
    let mut waiting = store.subscribe(Topic::Sandbox("kept".into()));
    redis.down();
    // A waiter is woken when the notifications are lost (it re-reads; a missed wake
    // would hang it).
    assert!(
        tokio::time::timeout(Duration::from_secs(10), waiting.changed())
            .await
            .unwrap_or(false),
        "the loss of the channel wakes the waiters"
    );
    let t = Instant::now();
    let err = store.sandbox("kept").await.err().unwrap();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
    assert!(
        t.elapsed() <= CALL_TIMEOUT + Duration::from_secs(1),
        "failed in {:?}",
        t.elapsed()
    );
    redis.up();
    // Back by itself: the next calls work (the connection is remade on demand) and
    // the AOF kept the record.
    let deadline = Instant::now() + Duration::from_secs(15);
    let rec = loop {
        match store.sandbox("kept").await {
            Ok(r) => break r,
            Err(e) => assert!(Instant::now() < deadline, "not back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rec.unwrap().value.uid, "u1");
    // And the notifications again: a write wakes a new waiter.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut w = store.subscribe(Topic::Sandbox("probe".into()));
        let _ = store
            .insert_sandbox(conformance::record("probe", "u1"))
            .await;
        if tokio::time::timeout(Duration::from_millis(500), w.changed())
            .await
            .unwrap_or(false)
        {
            break;
        }
        assert!(Instant::now() < deadline, "notifications did not come back");
    }
}
