//! A replica dies (SIGKILL) while its worker runs a job: another replica takes the
//! sandbox's jobs over once the dead worker's lease expires. The command that was
//! running goes on in the agent, and the new worker delivers its real output (the
//! agent keeps it under the job's id); the next job runs after it, in order; nothing
//! stays `running` forever. Real `orchard serve` processes over one Redis.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{get, import_busybox, post, RedisServer};
use crate::util::server::{reap_orphaned_agents, ServerProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_jobs_are_taken_over_and_its_running_job_delivers_its_real_output() {
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
    import_busybox(&a.url).await;
    let (s, sb) = post(&a.url, "/v1/sandboxes", json!({"image": "busybox:latest"})).await;
    assert_eq!(s, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_string();

    // A's worker runs a job that waits for a fifo; A dies under it.
    let (s, mk) = post(
        &a.url,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": "mkfifo /tmp/go-on", "wait": true}),
    )
    .await;
    assert_eq!((s, &mk["exit_code"]), (200, &json!(0)), "{mk}");
    let (s, long) = post(
        &a.url,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": "read l < /tmp/go-on; echo \"delivered $l\"; exit 7"}),
    )
    .await;
    assert_eq!(s, 200, "{long}");
    let long = long["job_id"].as_str().unwrap().to_string();
    // Running in the agent (not only taken in the store: a replica killed between the
    // two leaves a job whose command never started, which fails with the reason).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, k) = get(&b.url, &format!("/v1/sandboxes/{id}/exec/results/{long}")).await;
        if s == 200 {
            assert_eq!(k["state"], "running", "{k}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never running in the agent: {s} {k}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.kill9();
    // The command goes on only after A is gone: its output exists nowhere else yet.
    let (s, go) = post(
        &b.url,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["sh", "-c", "echo on > /tmp/go-on"]}),
    )
    .await;
    assert_eq!(s, 200, "{go}");

    // Through B: the next job runs once A's lease expired, after the one A ran, which
    // ends with its real output.
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
    let (_, taken) = get(&b.url, &format!("/jobs/{long}")).await;
    assert_eq!(
        (
            taken["status"].as_str(),
            taken["stdout"].as_str(),
            taken["exit_code"].as_i64()
        ),
        (Some("failed"), Some("delivered on\n"), Some(7)),
        "{taken}"
    );
    assert!(taken["error"].is_null(), "{taken}");
    assert!(
        taken["completed_at"].as_f64() <= next["started_at"].as_f64(),
        "in order: {taken} before {next}"
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
