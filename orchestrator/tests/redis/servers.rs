//! Replicas of the server over one Redis: each its own service, router, listener and
//! Redis store, sharing one local backend (its sandboxes) and image store, as replicas
//! on one host share them. Any replica serves any request for any sandbox; a wait on
//! one ends with work done on another; jobs keep submission order across them.
//!
//! (Separate `orchard serve` processes on one data directory, sharing the local
//! backend's root between processes: `shared_root.rs`.)

use std::sync::Arc;
use std::time::Duration;

use orchard::config::StateChoice;
use orchard::service::{Keys, Service};
use serde_json::{json, Value};

use super::{get, post, req, RedisServer};
use crate::util::server::{send, Options, TestServer, KEY, OTHER_KEY};

/// A second replica of `first` (state in `redis`): its URL, service and task.
pub(super) async fn replica(
    first: &TestServer,
    redis: &RedisServer,
) -> (String, Service, tokio::task::JoinHandle<()>) {
    let data = first.data_dir().join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let mut config = orchard::config::Config::resolve(orchard::config::ServeArgs {
        data_dir: Some(data),
        agent: Some(orchard_test_support::agent::agent_binary()),
        ..Default::default()
    })
    .unwrap();
    config.service.policy = Options::default().policy;
    config.state = state(redis);
    let keys = Keys::new([KEY, OTHER_KEY]).with_operators([KEY]);
    let (router, service) = orchard::serve::app(
        first.backend.clone(),
        first.service.images().clone(),
        &config,
        keys,
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (url, service, task)
}

/// An in-process server with its state in `redis`: the first replica.
pub(super) async fn first_replica(redis: &RedisServer) -> TestServer {
    let st = state(redis);
    TestServer::with(Options {
        configure: Some(Arc::new(move |c| c.state = st.clone())),
        ..Options::default()
    })
    .await
}

pub(super) fn state(redis: &RedisServer) -> StateChoice {
    StateChoice::Redis {
        url: redis.url(),
        prefix: "orchard".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_serves_any_sandbox_and_a_wait_on_one_ends_with_a_job_on_another() {
    orchard_test_support::require_runc!();
    let redis = RedisServer::start();
    let first = first_replica(&redis).await;
    let (b, _b_service, b_task) = replica(&first, &redis).await;
    let a = first.url.clone();

    // Created through A (compatible route), seen by B as running.
    let (s, sb) = post(&a, "/sandboxes", json!({"image": "busybox:latest"})).await;
    assert_eq!(s, 200, "{sb}");
    let id = sb["sandbox_id"].as_str().expect("an id").to_string();
    let (s, ready) = get(&b, &format!("/sandboxes/{id}/wait?timeout=60")).await;
    assert_eq!(
        (s, ready["status"].as_str()),
        (200, Some("ready")),
        "{ready}"
    );

    // A job submitted through A, waited for through B.
    let (s, job) = post(
        &a,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": "sleep 0.3; echo from-a"}),
    )
    .await;
    assert_eq!(s, 200, "{job}");
    let job_id = job["job_id"].as_str().unwrap();
    let (s, done) = get(&b, &format!("/jobs/{job_id}/wait?timeout=30")).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(
        (done["status"].as_str(), done["stdout"].as_str()),
        (Some("succeeded"), Some("from-a\n")),
        "{done}"
    );

    // Jobs through both, alternating: they run in submission order.
    let mut ids = Vec::new();
    for i in 0..6 {
        let via = if i % 2 == 0 { &a } else { &b };
        let (s, job) = post(
            via,
            &format!("/sandboxes/{id}/exec"),
            json!({"command": format!("echo {i} >> /tmp/order")}),
        )
        .await;
        assert_eq!(s, 200, "{job}");
        ids.push(job["job_id"].as_str().unwrap().to_string());
    }
    for j in &ids {
        let (_, done) = get(&a, &format!("/jobs/{j}/wait?timeout=30")).await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    let (_, order) = post(
        &b,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": "cat /tmp/order", "wait": true}),
    )
    .await;
    assert_eq!(order["stdout"], "0\n1\n2\n3\n4\n5\n", "{order}");

    // Exec on /v1 through B, a sandbox created through B, listing and deleting
    // across: gone for both.
    let (s, out) = post(
        &b,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["echo", "via-b"]}),
    )
    .await;
    assert_eq!(
        (s, out["stdout"]["data"].as_str()),
        (200, Some("via-b\n")),
        "{out}"
    );
    let (s, other) = post(&b, "/v1/sandboxes", json!({"image": "busybox:latest"})).await;
    assert_eq!(s, 201, "{other}");
    let other = other["id"].as_str().unwrap().to_string();
    for url in [&a, &b] {
        let (_, list) = get(url, "/v1/sandboxes").await;
        for sb in [&id, &other] {
            assert!(list.to_string().contains(sb.as_str()), "{list}");
        }
    }
    let (s, body) = send(req(
        reqwest::Method::DELETE,
        &b,
        &format!("/sandboxes/{id}"),
    ))
    .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = send(req(
        reqwest::Method::DELETE,
        &a,
        &format!("/sandboxes/{other}"),
    ))
    .await;
    assert_eq!(s, 200, "{body}");
    for url in [&a, &b] {
        for sb in [&id, &other] {
            let (s, _) = get(url, &format!("/sandboxes/{sb}")).await;
            assert_eq!(s, 404);
        }
    }
    b_task.abort();
    first.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_away_requests_answer_503_fast_and_the_server_recovers() {
    orchard_test_support::require_runc!();
    let mut redis = RedisServer::start_with(true);
    let server = first_replica(&redis).await;
    let (s, sb) = server
        .post("/v1/sandboxes", json!({"image": "busybox:latest"}))
        .await;
    assert_eq!(s, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_string();

    redis.down();
    for path in [format!("/sandboxes/{id}"), "/v1/sandboxes".to_string()] {
        let t = std::time::Instant::now();
        let (s, body) = server.get(&path).await;
        assert_eq!(s, 503, "{path}: {body}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{path} answered in {:?}",
            t.elapsed()
        );
    }
    let t = std::time::Instant::now();
    let (s, body) = server
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "true", "wait": true}),
        )
        .await;
    assert_eq!(s, 503, "{body}");
    assert!(t.elapsed() < Duration::from_secs(5));

    redis.up();
    // Back by itself (the connection is remade on the next calls); the AOF kept the
    // record, and jobs run again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (s, body) = server
            .post(
                &format!("/sandboxes/{id}/exec"),
                json!({"command": "echo back", "wait": true}),
            )
            .await;
        if s == 200 {
            assert_eq!(body["stdout"], "back\n", "{body}");
            break;
        }
        assert_eq!(s, 503, "{body}");
        assert!(std::time::Instant::now() < deadline, "not back: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.finish().await;
}

/// A job's output of tens of MiB goes into Redis whole and is read back whole through
/// another replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_tens_of_mib_of_output_is_kept_whole_across_replicas() {
    orchard_test_support::require_runc!();
    const BYTES: usize = 24 << 20;
    let redis = RedisServer::start();
    let first = first_replica(&redis).await;
    let (b, _b_service, b_task) = replica(&first, &redis).await;
    let id = create(&first.url, json!({})).await;
    let (s, done) = post(
        &first.url,
        &format!("/sandboxes/{id}/exec"),
        json!({
            "command": format!("head -c {BYTES} /dev/zero | tr '\\0' x; echo end >&2"),
            "wait": true
        }),
    )
    .await;
    assert_eq!(s, 200, "{}", done["error"]);
    let job_id = done["job_id"].as_str().unwrap();
    let (s, job) = get(&b, &format!("/jobs/{job_id}")).await;
    assert_eq!(s, 200);
    let out = job["stdout"].as_str().unwrap_or_default();
    assert_eq!(out.len(), BYTES, "{}", job["error"]);
    assert!(out.bytes().all(|c| c == b'x'));
    assert_eq!(
        (job["stderr"].as_str(), job["output_truncated"].as_bool()),
        (Some("end\n"), Some(false))
    );
    b_task.abort();
    first.finish().await;
}

/// A pause through one replica holds on every replica (the record is shared), a
/// snapshot taken through one is forked through the other, and its forks are every
/// replica's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_and_a_snapshot_through_one_replica_hold_on_the_other() {
    orchard_test_support::require_runc!();
    let redis = RedisServer::start();
    let first = first_replica(&redis).await;
    let (b, _b_service, b_task) = replica(&first, &redis).await;
    let id = create(&first.url, json!({})).await;
    let exec = format!("/v1/sandboxes/{id}/exec");
    let (s, _) = post(&first.url, &exec, json!({"command": "echo x > /f"})).await;
    assert_eq!(s, 200);
    let (s, p) = post(&first.url, &format!("/v1/sandboxes/{id}/pause"), json!({})).await;
    assert_eq!(s, 200, "{p}");
    let (s, e) = post(&b, &exec, json!({"command": "true"})).await;
    assert_eq!(s, 409, "the other replica must refuse too: {e}");
    let (s, _) = post(&b, &format!("/v1/sandboxes/{id}/resume"), json!({})).await;
    assert_eq!(s, 200);
    let (s, _) = post(&first.url, &exec, json!({"command": "true"})).await;
    assert_eq!(s, 200);
    let (s, snap) = post(&b, &format!("/v1/sandboxes/{id}/snapshots"), json!({})).await;
    assert_eq!(s, 201, "{snap}");
    let sid = snap["snapshot_id"].as_str().unwrap();
    let (s, forks) = post(
        &first.url,
        &format!("/v1/snapshots/{sid}/fork"),
        json!({"count": 2}),
    )
    .await;
    assert_eq!(s, 201, "{forks}");
    for f in forks["sandboxes"].as_array().unwrap() {
        let fid = f["id"].as_str().unwrap();
        let (s, out) = post(
            &b,
            &format!("/v1/sandboxes/{fid}/exec"),
            json!({"command": "cat /f"}),
        )
        .await;
        assert_eq!(
            (s, out["stdout"]["data"].as_str()),
            (200, Some("x\n")),
            "{out}"
        );
        let (s, _) = send(req(
            reqwest::Method::DELETE,
            &b,
            &format!("/v1/sandboxes/{fid}"),
        ))
        .await;
        assert_eq!(s, 200);
    }
    let (s, _) = send(req(
        reqwest::Method::DELETE,
        &first.url,
        &format!("/v1/snapshots/{sid}"),
    ))
    .await;
    assert_eq!(s, 200);
    b_task.abort();
    first.finish().await;
}

/// Creates a sandbox through `url`'s `/v1` with `extra` fields; answers its id.
async fn create(url: &str, extra: Value) -> String {
    let mut body = json!({"image": "busybox:latest"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let (s, sb) = post(url, "/v1/sandboxes", body).await;
    assert_eq!(s, 201, "{sb}");
    sb["id"].as_str().unwrap().to_string()
}

async fn backend_ids(server: &TestServer) -> Vec<String> {
    use orchard::backend::Backend;
    server
        .backend
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_to_delete_expire_and_reconcile_act_once() {
    orchard_test_support::require_runc!();
    let redis = RedisServer::start();
    let first = first_replica(&redis).await;
    let (b, b_service, b_task) = replica(&first, &redis).await;
    let a = first.url.clone();

    // Deletes of the same sandboxes through both at once: one wins, the other is told
    // it is gone (or also answers 200 if it came first to a finished removal).
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(create(if i % 2 == 0 { &a } else { &b }, json!({})).await);
    }
    for id in &ids {
        let path = format!("/sandboxes/{id}");
        let ((sa, ba), (sb, bb)) = tokio::join!(
            send(req(reqwest::Method::DELETE, &a, &path)),
            send(req(reqwest::Method::DELETE, &b, &path)),
        );
        assert!(
            [sa, sb].contains(&200) && [sa, sb].iter().all(|s| [200, 404].contains(s)),
            "{sa} {ba} / {sb} {bb}"
        );
    }

    // Expiry run by both replicas at once (and by their policy loops).
    let expiring: Vec<String> = futures_util::future::join_all(
        (0..3).map(|i| create(if i % 2 == 0 { &a } else { &b }, json!({"ttl_s": 1}))),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        tokio::join!(first.service.expire_now(), b_service.expire_now());
        let left = backend_ids(&first).await;
        if expiring.iter().all(|id| !left.contains(id)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not expired: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Reconciliation by both at once: sandboxes gone behind our back fail once.
    let kept = create(&a, json!({})).await;
    let vanished = [create(&b, json!({})).await, create(&a, json!({})).await];
    for id in &vanished {
        first.backend.inner.delete(id).await.unwrap();
    }
    let (ra, rb) = tokio::join!(first.service.reconcile_now(), b_service.reconcile_now());
    assert!(ra && rb);
    for id in &vanished {
        let (s, sb) = get(&b, &format!("/sandboxes/{id}")).await;
        assert_eq!((s, sb["status"].as_str()), (200, Some("failed")), "{sb}");
    }
    let (s, sb) = get(&a, &format!("/sandboxes/{kept}")).await;
    assert_eq!((s, sb["status"].as_str()), (200, Some("ready")), "{sb}");

    // The audit: no sandbox was deleted twice at the backend, and records and backend
    // agree on what runs.
    let deleted = first.backend.deleted.lock().unwrap().clone();
    for id in ids.iter().chain(&expiring) {
        assert_eq!(
            deleted.iter().filter(|d| *d == id).count(),
            1,
            "{id}: {deleted:?}"
        );
    }
    assert_eq!(backend_ids(&first).await, std::slice::from_ref(&kept));
    b_task.abort();
    first.finish().await;
}
