//! What an operator sets and Orchard's users rely on without asking: default limits and
//! working directory echoed back, time-outs reported as Orchard does (124), job output
//! kept far past 1 MiB with a stated cap, a queue (not a 503) for creates beyond the
//! concurrency limit and `Retry-After` when it is full, and heartbeat reaping switched
//! off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::server::{Options, TestServer};

fn options(f: impl Fn(&mut orchard::config::Config) + Send + Sync + 'static) -> Options {
    Options {
        configure: Some(Arc::new(f)),
        ..Options::default()
    }
}

async fn compat_sandbox(srv: &TestServer, body: Value) -> (String, Value) {
    compat_sandbox_within(srv, body, 60).await
}

async fn compat_sandbox_within(srv: &TestServer, body: Value, secs: u64) -> (String, Value) {
    let (s, created) = srv.post("/sandboxes", body).await;
    assert_eq!(s, 200, "{created}");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let (s, ready) = srv
        .get(&format!("/sandboxes/{id}/wait?timeout={secs}"))
        .await;
    assert_eq!((s, &ready["ready"]), (200, &json!(true)), "{ready}");
    (id, created)
}

async fn job(srv: &TestServer, id: &str, body: Value) -> Value {
    let (s, job) = srv.post(&format!("/sandboxes/{id}/exec"), body).await;
    assert_eq!(s, 200, "{job}");
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_defaults_are_applied_and_echoed() {
    orchard_test_support::require_runc!();
    let srv = TestServer::with(options(|c| {
        c.service.defaults.cpu = "1500m".into();
        c.service.defaults.memory = "300Mi".into();
        c.service.defaults.working_dir = "/srv/work".into();
    }))
    .await;
    let (id, created) = compat_sandbox(&srv, json!({"image": "busybox:latest"})).await;
    assert_eq!(
        (&created["cpu"], &created["memory"], &created["working_dir"]),
        (&json!("1500m"), &json!("300Mi"), &json!("/srv/work")),
        "the create answer echoes the defaults it applied"
    );
    // The image has no /srv/work: the sandbox gets it, as Orchard's pods get theirs.
    let pwd = job(&srv, &id, json!({"command": "pwd", "wait": true})).await;
    assert_eq!(pwd["stdout"], "/srv/work\n", "{pwd}");
    let (s, list) = srv.get(&format!("/sandboxes/{id}/files/list")).await;
    assert_eq!((s, &list["path"]), (200, &json!("/srv/work")), "{list}");
    // The limits are in force, not only echoed: the memory cgroup holds 300 MiB.
    let limit = job(
        &srv,
        &id,
        json!({"command": "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes", "wait": true}),
    )
    .await;
    assert_eq!(limit["stdout"], format!("{}\n", 300u64 << 20), "{limit}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_job_output_is_not_cut_at_one_mebibyte_and_the_cap_is_stated() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let (id, _) = compat_sandbox(&srv, json!({"image": "busybox:latest"})).await;
    // 3 MiB on stdout: the agent's own 1 MiB default no longer cuts it.
    let big = job(
        &srv,
        &id,
        json!({"command": "head -c 3145728 /dev/zero | tr '\\0' a", "wait": true}),
    )
    .await;
    assert_eq!(big["status"], "succeeded");
    assert_eq!(big["stdout"].as_str().unwrap().len(), 3 << 20);
    assert_eq!(big["output_truncated"], false);
    srv.finish().await;

    let srv = TestServer::with(options(|c| c.service.job_output_cap = 64 << 10)).await;
    let (id, _) = compat_sandbox(&srv, json!({"image": "busybox:latest"})).await;
    let cut = job(
        &srv,
        &id,
        json!({"command": "head -c 200000 /dev/zero | tr '\\0' a; echo END", "wait": true}),
    )
    .await;
    assert_eq!(cut["output_truncated"], true, "{}", cut["stderr"]);
    let out = cut["stdout"].as_str().unwrap();
    assert!(out.ends_with("aaaaEND\n"), "the tail is kept");
    assert!(out.starts_with("aaaa"), "the head is kept");
    assert!(
        out.contains("bytes of output left out here"),
        "the cut is stated where it is"
    );
    assert!(out.len() < (64 << 10) + 200, "{}", out.len());
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_exec_reports_timeouts_with_124_only_when_asked() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let body = |asked: bool| json!({"command": ["sh", "-c", "echo partial >&2; sleep 30"], "timeout_ms": 300, "timeout_exit_124": asked});
    let (s, plain) = srv
        .post(&format!("/v1/sandboxes/{id}/exec"), body(false))
        .await;
    assert_eq!(s, 200, "{plain}");
    assert_eq!(plain["timed_out"], true);
    assert_eq!(plain["exit_code"], Value::Null, "killed by a signal");
    assert!(plain["signal"].is_i64(), "{plain}");
    assert_eq!(plain["stderr"]["data"], "partial\n");

    let (s, asked) = srv
        .post(&format!("/v1/sandboxes/{id}/exec"), body(true))
        .await;
    assert_eq!(s, 200, "{asked}");
    assert_eq!(
        (&asked["timed_out"], &asked["exit_code"]),
        (&json!(true), &json!(124))
    );
    assert!(asked["signal"].is_i64(), "the signal stays: {asked}");
    assert_eq!(
        asked["stderr"]["data"],
        "partial\nCommand timed out after 0.3s and was killed\n"
    );

    // The streamed exec ends the same way: a last stderr frame, then exit 124.
    let resp = srv
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/exec/stream"),
        )
        .json(&body(true))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    let frames: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let exit = frames.last().unwrap();
    assert_eq!(
        (&exit["type"], &exit["exit_code"]),
        (&json!("exit"), &json!(124))
    );
    let stderr: Vec<u8> = frames
        .iter()
        .filter(|f| f["type"] == "stderr")
        .flat_map(|f| orchard_protocol::output::b64_decode(f["data"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(
        String::from_utf8(stderr).unwrap(),
        "partial\nCommand timed out after 0.3s and was killed\n"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_beyond_the_concurrency_limit_wait_in_the_queue() {
    orchard_test_support::require_runc!();
    let srv = TestServer::with(options(|c| {
        c.service.max_concurrent_creates = 1;
        c.service.create_queue = 16;
    }))
    .await;
    let creates = (0..6).map(|_| srv.post("/sandboxes", json!({"image": "busybox:latest"})));
    let answers = futures_util::future::join_all(creates).await;
    for (s, created) in &answers {
        assert_eq!(*s, 200, "queued, not refused: {created}");
    }
    for (_, created) in &answers {
        let id = created["sandbox_id"].as_str().unwrap();
        let (s, ready) = srv.get(&format!("/sandboxes/{id}/wait?timeout=60")).await;
        assert_eq!((s, &ready["status"]), (200, &json!("ready")), "{ready}");
    }
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_pull_from_a_stalled_registry_holds_no_create_slot() {
    orchard_test_support::require_runc!();
    // A registry that accepts connections and never answers: the pull waits for the
    // registry client's read limit (60 s).
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = stalled.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in stalled.incoming().take(4).flatten() {
            conns.push(c);
        }
        std::thread::sleep(Duration::from_secs(90));
        drop(conns);
    });
    let srv = TestServer::with(options(|c| c.service.max_concurrent_creates = 1)).await;
    let (s, pulling) = srv
        .post(
            "/sandboxes",
            json!({"image": format!("127.0.0.1:{port}/stalled:latest")}),
        )
        .await;
    assert_eq!(s, 200, "{pulling}");
    // With the pull inside the one slot, this cached image waited behind it.
    let started = Instant::now();
    let (id, _) = compat_sandbox_within(&srv, json!({"image": "busybox:latest"}), 20).await;
    assert!(started.elapsed() < Duration::from_secs(20), "{id}");
    let (_, still) = srv
        .get(&format!(
            "/sandboxes/{}",
            pulling["sandbox_id"].as_str().unwrap()
        ))
        .await;
    assert_ne!(still["status"], "ready", "{still}");
    drop(srv);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_create_queue_answers_503_with_retry_after() {
    orchard_test_support::require_runc!();
    let mut opts = options(|c| {
        c.service.max_concurrent_creates = 1;
        c.service.create_queue = 1;
    });
    // Creates hang at the backend until their readiness limit: the slot and the queue
    // stay full for that long.
    opts.fail_point = Some(orchard::backend::local::FailPoint::HangAfterRuncCreate);
    opts.policy.ready_timeout = Duration::from_secs(4);
    let srv = TestServer::with(opts).await;
    for _ in 0..2 {
        let (s, v) = srv
            .post("/sandboxes", json!({"image": "busybox:latest"}))
            .await;
        assert_eq!(s, 200, "one running, one queued: {v}");
    }
    let resp = srv
        .req(reqwest::Method::POST, "/sandboxes")
        .json(&json!({"image": "busybox:latest"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let body: Value = resp.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("queue"), "{body}");
    drop(srv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_reaping_can_be_switched_off() {
    orchard_test_support::require_runc!();
    let mut opts = Options::default();
    opts.policy.heartbeat_timeout = Duration::from_millis(300);
    opts.policy.heartbeat_reaping = false;
    let srv = TestServer::with(opts).await;
    let id = srv.sandbox().await;
    let (s, _) = srv
        .post(&format!("/sandboxes/{id}/heartbeat"), json!({}))
        .await;
    assert_eq!(s, 200);
    // Several heartbeat periods and policy rounds (every 50 ms) pass: nothing to wait
    // on for something that must not happen, so the wait is bounded by time.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let (s, v) = srv.get(&format!("/sandboxes/{id}")).await;
        assert_eq!((s, &v["status"]), (200, &json!("ready")), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_listing_cut_at_its_limit_says_so() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let (id, _) = compat_sandbox(&srv, json!({"image": "busybox:latest"})).await;
    let made = job(
        &srv,
        &id,
        json!({"command": "mkdir /tmp/many && cd /tmp/many && seq 1 10050 | xargs touch && ls | wc -l", "wait": true}),
    )
    .await;
    assert_eq!(made["stdout"], "10050\n", "{made}");
    let (s, list) = srv
        .get(&format!("/sandboxes/{id}/files/list?path=/tmp/many"))
        .await;
    assert_eq!(s, 200);
    assert_eq!(list["truncated"], true, "never cut silently");
    assert_eq!(list["files"].as_array().unwrap().len(), 10_000);
    srv.finish().await;
}
