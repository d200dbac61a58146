//! A replica dies (SIGKILL) while its worker runs a job: another replica takes the
//! sandbox's jobs over once the dead worker's lease expires. The job that was running
//! ends `failed` with the reason (nobody can deliver its output), the next job runs,
//! nothing stays `running` forever. Real `orchard serve` processes over one Redis.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{get, post, req, RedisServer};
use crate::util::server::{reap_orphaned_agents, send, ServerProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_jobs_are_taken_over_and_its_running_job_fails_with_the_reason() {
    orchard_test_support::require_runc!();
    let redis = RedisServer::start();
    let url = redis.url();
    // Each replica its own backend here (the local backend's root is one process's):
    // no reconciliation, which would take the other's sandboxes for vanished ones.
    let args = [
        "--state",
        url.as_str(),
        "--worker-lease-s",
        "2",
        "--reconcile-interval-s",
        "3600",
    ];
    let (data_a, data_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = ServerProcess::start(data_a.path(), &args);
    let mut b = ServerProcess::start(data_b.path(), &args);
    let layout = orchard_test_support::images::image_layout("busybox");
    let mut tar = tar::Builder::new(Vec::new());
    tar.append_dir_all(".", &layout).unwrap();
    let (s, body) = send(
        req(
            reqwest::Method::POST,
            &a.url,
            "/v1/images/import?name=busybox:latest",
        )
        .body(tar.into_inner().unwrap()),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let (s, sb) = post(&a.url, "/v1/sandboxes", json!({"image": "busybox:latest"})).await;
    assert_eq!(s, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_string();

    // A's worker runs a long job; A dies under it.
    let (s, long) = post(
        &a.url,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": "sleep 60; echo never"}),
    )
    .await;
    assert_eq!(s, 200, "{long}");
    let long = long["job_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, j) = get(&b.url, &format!("/jobs/{long}")).await;
        if j["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never running: {j}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.kill9();

    // Through B: the next job runs once A's lease expired, and the one A ran fails.
    let t = Instant::now();
    let (s, next) = post(
        &b.url,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": "echo after", "wait": true, "timeout": 60}),
    )
    .await;
    assert_eq!(s, 200, "{next}");
    assert_eq!(
        (next["status"].as_str(), next["stdout"].as_str()),
        (Some("succeeded"), Some("after\n")),
        "{next}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took over in {:?}",
        t.elapsed()
    );
    let (_, orphan) = get(&b.url, &format!("/jobs/{long}")).await;
    assert_eq!(orphan["status"], "failed", "{orphan}");
    assert!(
        orphan["error"]
            .as_str()
            .is_some_and(|e| e.contains("stopped or lost its lease")),
        "{orphan}"
    );

    // Cleanup: B leaves (keeping the shared sandboxes, the default with Redis); A
    // comes back on its backend and deletes every sandbox on the way out.
    assert!(b.stop().success());
    let mut a = ServerProcess::start(
        data_a.path(),
        &[&args[..], &["--keep-sandboxes-on-exit", "false"]].concat(),
    );
    let (s, _) = get(&a.url, &format!("/sandboxes/{id}")).await;
    assert_eq!(s, 200, "the record outlived both replicas");
    assert!(a.stop().success());
    reap_orphaned_agents();
}
