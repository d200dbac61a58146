//! Quotas, TTL, heartbeats, reconciliation, 100 creates at once, and a server killed
//! with SIGKILL and restarted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use orchard::backend::local::LocalBackend;
use orchard::backend::Backend;
use serde_json::{json, Value};

use crate::util::sandbox::{assert_clean, within};
use crate::util::server::{
    import_busybox, send, temp_dir, Options, ServerProcess, TestServer, KEY,
};

/// Polls `f` until it answers true; for behaviour that is itself time-based (a TTL, a
/// heartbeat period), where there is no event to wait on.
async fn eventually(limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_answer_429_per_key() {
    orchard_test_support::require_runc!();
    let srv = TestServer::with(Options {
        max_sandboxes: 2,
        creates_per_minute: 3,
        ..Options::default()
    })
    .await;
    let a = srv.sandbox().await;
    let _b = srv.sandbox().await;
    let (s, e) = srv
        .post("/sandboxes", json!({"image": "busybox:latest"}))
        .await;
    assert_eq!(s, 429, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("limit is 2"), "{e}");
    // Another key has its own quota.
    let (s, _) = send(
        srv.http
            .post(format!("{}/sandboxes", srv.url))
            .header("X-API-Key", crate::util::server::OTHER_KEY)
            .json(&json!({"image": "busybox:latest"})),
    )
    .await;
    assert_eq!(s, 200);
    // Deleting frees a slot, but the rate (3 per minute) is spent.
    let (s, _) = srv.delete(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(s, 200);
    let (s, _) = srv
        .post("/v1/sandboxes", json!({"image": "busybox:latest"}))
        .await;
    assert_eq!(s, 201);
    let (s, _) = srv.delete(&format!("/v1/sandboxes/{_b}")).await;
    assert_eq!(s, 200);
    let (s, e) = srv
        .post("/sandboxes", json!({"image": "busybox:latest"}))
        .await;
    assert_eq!(s, 429, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("per minute"), "{e}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_and_heartbeats_reap_sandboxes() {
    orchard_test_support::require_runc!();
    let mut opts = Options::default();
    opts.policy.heartbeat_timeout = Duration::from_millis(1500);
    let srv = TestServer::with(opts).await;
    let (s, short) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:latest", "ttl_s": 1}),
        )
        .await;
    assert_eq!(s, 201);
    assert!(short["expires_at"].is_string(), "{short}");
    let short = short["id"].as_str().unwrap().to_string();
    let quiet = srv.sandbox().await;
    let beating = srv.sandbox().await;
    let (s, hb) = srv
        .post(&format!("/v1/sandboxes/{beating}/heartbeat"), json!({}))
        .await;
    assert_eq!(s, 200);
    assert!(hb["expires_at"].is_string());
    let started = Instant::now();
    // The TTL sandbox goes; the heartbeat one goes once beats stop.
    eventually(Duration::from_secs(30), async || {
        srv.get(&format!("/v1/sandboxes/{short}")).await.0 == 404
    })
    .await;
    eventually(Duration::from_secs(30), async || {
        srv.get(&format!("/v1/sandboxes/{beating}")).await.0 == 404
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(1000));
    // A sandbox that never sent a heartbeat is not reaped by the heartbeat policy.
    let (s, v) = srv.get(&format!("/v1/sandboxes/{quiet}")).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("running")));
    assert_eq!(
        srv.backend.inner.list().len(),
        1,
        "the reaped ones are gone from the host"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_fails_lost_sandboxes_removes_orphans_and_skips_when_listing_fails() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let lost = srv.sandbox().await;
    let kept = srv.sandbox().await;
    // Deleted behind the server's back.
    srv.backend.inner.delete(&lost).await.unwrap();
    // Made by a server but owned by no record (as if its record was lost).
    let image = srv.service.images().get("busybox:latest").unwrap().unwrap();
    let orphan = Backend::create(
        &srv.backend.inner,
        orchard::backend::CreateSpec {
            id: "orphan-1".into(),
            image: orchard::backend::SandboxImage::Local(image),
            cpus: None,
            memory_bytes: None,
            egress: false,
            env: vec![],
            labels: BTreeMap::from([("orchard.tenant".to_string(), "someone".to_string())]),
            ttl: None,
            snapshot: None,
            progress: Default::default(),
        },
    )
    .await
    .unwrap();
    // A backend that cannot list changes nothing.
    srv.backend
        .list_fails
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(!srv.service.reconcile_now().await);
    assert_eq!(
        srv.get(&format!("/v1/sandboxes/{lost}")).await.1["status"],
        "running"
    );
    assert!(srv.backend.inner.get(&orphan.id).is_some());
    srv.backend
        .list_fails
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(srv.service.reconcile_now().await);
    let (s, v) = srv.get(&format!("/v1/sandboxes/{lost}")).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("failed")), "{v}");
    assert!(
        srv.backend.inner.get(&orphan.id).is_none(),
        "the orphan is removed"
    );
    assert_eq!(
        srv.get(&format!("/v1/sandboxes/{kept}")).await.1["status"],
        "running"
    );
    let (s, e) = srv
        .post(
            &format!("/sandboxes/{lost}/exec"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(s, 502, "{e}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_not_ready_in_time_fails_and_a_v1_create_leaves_nothing() {
    orchard_test_support::require_runc!();
    let srv = TestServer::with(Options {
        fail_point: Some(orchard::backend::local::FailPoint::HangAfterRuncCreate),
        ..Options::default()
    })
    .await;
    let (s, created) = srv
        .post(
            "/sandboxes",
            json!({"image": "busybox:latest", "timeout": 1}),
        )
        .await;
    assert_eq!(s, 200);
    let id = created["sandbox_id"].as_str().unwrap();
    let (s, e) = srv.get(&format!("/sandboxes/{id}/wait?timeout=30")).await;
    assert_eq!(s, 502, "{e}");
    assert!(
        e["detail"]
            .as_str()
            .unwrap()
            .contains("not ready within 1 s"),
        "{e}"
    );
    let (_, st) = srv.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(
        (st["status"].as_str(), st["ready"].as_bool()),
        (Some("failed"), Some(false))
    );
    // A short wait on a pending sandbox is a 408.
    let (_, other) = srv
        .post(
            "/sandboxes",
            json!({"image": "busybox:latest", "timeout": 60}),
        )
        .await;
    let other = other["sandbox_id"].as_str().unwrap();
    let (s, _) = srv
        .get(&format!("/sandboxes/{other}/wait?timeout=0.2"))
        .await;
    assert_eq!(s, 408);
    let (s, e) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:latest", "ready_timeout_s": 1}),
        )
        .await;
    assert_eq!(s, 502, "{e}");
    let (_, list) = srv.get("/v1/sandboxes").await;
    let ids: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "the failed /v1 create was removed: {list}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_creates_all_become_ready() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (http, url) = (srv.http.clone(), srv.url.clone());
        tasks.push(tokio::spawn(async move {
            let (s, v) = send(
                http.post(format!("{url}/sandboxes"))
                    .header("X-API-Key", KEY)
                    .json(&json!({"image": "busybox:latest", "sandbox_id": format!("many-{i}")})),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            let (s, v) = send(
                http.get(format!("{url}/sandboxes/many-{i}/wait?timeout=300"))
                    .header("X-API-Key", KEY),
            )
            .await;
            assert_eq!((s, v["ready"].as_bool()), (200, Some(true)), "{v}");
            let (s, job) = send(
                http.post(format!("{url}/sandboxes/many-{i}/exec"))
                    .header("X-API-Key", KEY)
                    .json(&json!({"command": "hostname", "wait": true})),
            )
            .await;
            assert_eq!(
                (s, job["stdout"].as_str()),
                (200, Some(format!("many-{i}\n").as_str()))
            );
        }));
    }
    for t in tasks {
        within(Duration::from_secs(600), t).await.unwrap();
    }
    eprintln!("100 sandboxes ready and used in {:?}", started.elapsed());
    assert_eq!(srv.sandbox_count().await, 100);
    let text = srv.metrics().await;
    assert!(
        text.contains("orchard_sandboxes{state=\"running\"} 100"),
        "{text}"
    );
    assert!(text.contains("orchard_sandbox_create_seconds_count 100"));
    assert!(text.contains("orchard_exec_seconds_count{route=\"compat\"} 100"));
    srv.finish().await;
}

fn blocking_json(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let req = http
            .request(method.parse().unwrap(), url)
            .header("X-API-Key", KEY);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        send(req).await
    })
}

/// Regression for the restart contract: a server killed with -9 mid-job comes back
/// with its sandboxes adopted, the job reported failed with an error, and after a
/// clean stop nothing is left on the host.
#[test]
fn a_server_killed_with_sigkill_restarts_adopting_sandboxes_and_failing_jobs_in_flight() {
    orchard_test_support::require_runc!();
    let data = temp_dir("orchard-k9-");
    let mut first = ServerProcess::start(data.path(), &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(import_busybox(&first.url));
    let (s, sb) = blocking_json(
        "POST",
        &format!("{}/v1/sandboxes", first.url),
        Some(json!({"image": "busybox:latest", "id": "survivor"})),
    );
    assert_eq!(s, 201, "{sb}");
    let (_, done) = blocking_json(
        "POST",
        &format!("{}/sandboxes/survivor/exec", first.url),
        Some(json!({"command": "echo before > /tmp/mark", "wait": true})),
    );
    assert_eq!(done["status"], "succeeded");
    let (_, q) = blocking_json(
        "POST",
        &format!("{}/sandboxes/survivor/exec", first.url),
        Some(json!({"command": "sleep 600"})),
    );
    let in_flight = q["job_id"].as_str().unwrap().to_string();
    let (_, running) = blocking_json(
        "GET",
        &format!("{}/jobs/{in_flight}/wait?timeout=0.5", first.url),
        None,
    );
    assert_eq!(running["status"], "running", "{running}");
    first.kill9();

    let mut second = ServerProcess::start(data.path(), &[]);
    let (s, sb) = blocking_json("GET", &format!("{}/sandboxes/survivor", second.url), None);
    assert_eq!((s, sb["status"].as_str()), (200, Some("ready")), "{sb}");
    let (s, job) = blocking_json("GET", &format!("{}/jobs/{in_flight}", second.url), None);
    assert_eq!(s, 200);
    assert_eq!(job["status"], "failed", "{job}");
    assert!(
        job["error"]
            .as_str()
            .is_some_and(|e| e.contains("restarted")),
        "{job}"
    );
    let (s, before) = blocking_json(
        "GET",
        &format!("{}/jobs/{}", second.url, done["job_id"].as_str().unwrap()),
        None,
    );
    assert_eq!((s, before["status"].as_str()), (200, Some("succeeded")));
    // The adopted sandbox still works, state and all.
    let (_, cat) = blocking_json(
        "POST",
        &format!("{}/sandboxes/survivor/exec", second.url),
        Some(json!({"command": "cat /tmp/mark", "wait": true})),
    );
    assert_eq!(cat["stdout"], "before\n", "{cat}");
    let (_, other) = blocking_json(
        "POST",
        &format!("{}/v1/sandboxes", second.url),
        Some(json!({"image": "busybox:latest"})),
    );
    assert_eq!(other["status"], "running");
    let status = second.stop();
    assert!(status.success(), "{status}");
    crate::util::server::reap_orphaned_agents();
    // Its log is JSON lines, each request with an id, and every line about a sandbox
    // (a request on its routes, its creation, adoption and removal) with its id.
    let log = std::fs::read_to_string(data.path().join("server.log")).unwrap();
    let mut requests = 0;
    let mut named = std::collections::BTreeSet::new();
    for line in log.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["ts"].is_string() && v["level"].is_string() && v["msg"].is_string(),
            "{line}"
        );
        if v["msg"] == "request" {
            requests += 1;
            assert!(
                v["request_id"].as_str().is_some_and(|r| r.len() >= 8),
                "{line}"
            );
            assert!(v["status"].is_string() && v["path"].is_string(), "{line}");
        }
        let what = match (v["msg"].as_str(), v["path"].as_str()) {
            (Some("request"), Some("/v1/sandboxes")) if v["method"] == "POST" => "create request",
            (Some("request"), Some("/sandboxes/survivor/exec")) => "exec request",
            (Some(msg @ ("sandbox ready" | "adopted sandbox" | "sandbox removed")), _) => msg,
            _ => continue,
        };
        assert!(v["sandbox_id"].is_string(), "{line}");
        if v["sandbox_id"] == "survivor" {
            named.insert(what.to_string());
        }
    }
    assert!(requests >= 8, "{log}");
    let want = [
        "adopted sandbox",
        "create request",
        "exec request",
        "sandbox ready",
        "sandbox removed",
    ];
    assert_eq!(named, want.map(String::from).into(), "{log}");
    // Stopping deleted everything: a backend opened on the same root finds nothing.
    let backend = LocalBackend::open(crate::util::sandbox::test_config(
        &data.path().join("backend"),
    ))
    .unwrap();
    rt.block_on(async {
        let report = backend.recover().await.unwrap();
        assert!(
            report.adopted.is_empty() && report.removed.is_empty(),
            "{report:?}"
        );
        assert_clean(&backend).await;
        backend.destroy().await.unwrap();
    });
}

#[test]
fn a_server_without_keys_generates_one_prints_it_and_keeps_it_across_restarts() {
    orchard_test_support::require_runc!();
    let data = temp_dir("orchard-key-");
    let mut first = ServerProcess::start_with_keys(data.path(), &[], &[]);
    let log = std::fs::read_to_string(data.path().join("server.log")).unwrap();
    let key = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("export SANDBOX_API_KEY="))
        .unwrap_or_else(|| panic!("no generated key printed:\n{log}"))
        .to_string();
    let get = |url: &str, key: Option<&str>| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut req = reqwest::Client::new().get(format!("{url}/v1/sandboxes"));
            if let Some(k) = key {
                req = req.header("X-API-Key", k);
            }
            send(req).await.0
        })
    };
    assert_eq!(get(&first.url, Some(&key)), 200);
    assert_eq!(get(&first.url, None), 401, "auth is on by default");
    // The key, the tokens and every tenant's jobs are readable by the server's user only.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(data.path()), 0o700);
    assert_eq!(mode(&data.path().join("api-key")), 0o600);
    assert_eq!(mode(&data.path().join("jobs/jobs.ndjson")), 0o600);
    assert!(first.stop().success());
    let second = ServerProcess::start_with_keys(data.path(), &[], &[]);
    assert_eq!(
        get(&second.url, Some(&key)),
        200,
        "the same key after a restart"
    );
    drop(second);
    let third = ServerProcess::start_with_keys(data.path(), &[], &["--no-auth"]);
    assert_eq!(
        get(&third.url, None),
        200,
        "--no-auth accepts requests without a key"
    );
}

/// Regression: a server stopped (SIGTERM) while creates were in flight exited with
/// their sandboxes still running, mounts and all (a runc container and two mounts were
/// left by the burst-of-creates fairness test). Its shutdown now refuses new creates,
/// waits for those in flight and deletes what they made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_server_stopped_during_creates_leaves_no_sandbox_behind() {
    orchard_test_support::require_runc!();
    let data = temp_dir("orchard-stop-creating-");
    let mut srv = ServerProcess::start(data.path(), &["--max-concurrent-creates", "2"]);
    import_busybox(&srv.url).await;
    let http = reqwest::Client::new();
    for _ in 0..6 {
        let (s, v) = send(
            http.post(format!("{}/sandboxes", srv.url))
                .header("X-API-Key", KEY)
                .json(&json!({"image": "busybox:latest"})),
        )
        .await;
        assert_eq!(s, 200, "{v}");
    }
    // Stopped once a create is in the backend: its sandbox's directory exists.
    let sandboxes = data.path().join("backend/sandboxes");
    let in_backend = || {
        std::fs::read_dir(&sandboxes)
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while in_backend() == 0 {
        assert!(Instant::now() < deadline, "no create reached the backend");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let status = srv.stop();
    assert!(status.success(), "orchard serve exited with {status}");
    assert_eq!(in_backend(), 0, "sandboxes left in {}", sandboxes.display());
    assert_eq!(
        crate::util::mounts_under(data.path()),
        Vec::<String>::new(),
        "mounts left"
    );
    let runc = std::process::Command::new("runc")
        .arg("--root")
        .arg(data.path().join("backend/runc"))
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    assert_eq!(String::from_utf8_lossy(&runc.stdout), "", "containers left");
}

/// Regression: a server that keeps its sandboxes on exit (the default with Redis) left
/// its disk pool mounted: two mounts per run of the SDK's replica test, kept until the
/// machine rebooted. Its sandboxes stay; the pool goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_server_keeping_its_sandboxes_leaves_no_disk_pool_mounted() {
    orchard_test_support::require_runc!();
    let data = temp_dir("orchard-keep-pool-");
    let mut srv = ServerProcess::start(data.path(), &["--keep-sandboxes-on-exit", "true"]);
    let pools = data.path().join("backend/diskpool");
    let deadline = Instant::now() + Duration::from_secs(60);
    while crate::util::mounts_under(&pools).is_empty() {
        assert!(Instant::now() < deadline, "the disk pool mounted nothing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = srv.stop();
    assert!(status.success(), "orchard serve exited with {status}");
    assert_eq!(
        crate::util::mounts_under(data.path()),
        Vec::<String>::new(),
        "mounts left"
    );
}
