//! Two `orchard serve` processes over one Redis on ONE data directory: the local
//! backend's root is shared (its lock held shared), so each replica deletes the
//! sandboxes the other created, and a replica's exit and restart leave the other's
//! sandboxes running.

use serde_json::json;

use super::{import_busybox, post, req, RedisServer};
use crate::util::server::{reap_orphaned_agents, send, ServerProcess};

async fn echo(url: &str, id: &str, word: &str) -> (u16, Option<String>) {
    let (s, out) = post(
        url,
        &format!("/sandboxes/{id}/exec"),
        json!({"command": format!("echo {word}"), "wait": true, "timeout": 60}),
    )
    .await;
    (s, out["stdout"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_on_one_data_directory_serve_and_delete_each_others_sandboxes() {
    orchard_test_support::require_runc!();
    let redis = RedisServer::start();
    let url = redis.url();
    let args = ["--state", url.as_str()];
    let data = tempfile::tempdir().unwrap();
    let mut a = ServerProcess::start(data.path(), &args);
    // Before shared roots, this one exited: the backend's root was locked by A.
    let mut b = ServerProcess::start(data.path(), &args);
    import_busybox(&a.url).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, sb) = post(&a.url, "/v1/sandboxes", json!({"image": "busybox:latest"})).await;
        assert_eq!(s, 201, "{sb}");
        ids.push(sb["id"].as_str().unwrap().to_string());
    }
    let sandboxes = data.path().join("backend/sandboxes");

    // B deletes one of A's sandboxes: really (its directory goes), not just the record.
    let (s, body) = send(req(
        reqwest::Method::DELETE,
        &b.url,
        &format!("/sandboxes/{}", ids[0]),
    ))
    .await;
    assert_eq!(s, 200, "{body}");
    assert!(!sandboxes.join(&ids[0]).exists(), "B left A's sandbox");

    // B leaves and comes back (recovering on the shared root): A's other sandbox runs
    // on, and B serves it.
    assert!(b.stop().success());
    assert!(sandboxes.join(&ids[1]).exists());
    let mut b = ServerProcess::start(data.path(), &args);
    assert_eq!(
        echo(&b.url, &ids[1], "via-b").await,
        (200, Some("via-b\n".to_string()))
    );
    assert_eq!(
        echo(&a.url, &ids[1], "via-a").await,
        (200, Some("via-a\n".to_string()))
    );

    let (s, body) = send(req(
        reqwest::Method::DELETE,
        &a.url,
        &format!("/sandboxes/{}", ids[1]),
    ))
    .await;
    assert_eq!(s, 200, "{body}");
    assert!(!sandboxes.join(&ids[1]).exists());
    assert!(b.stop().success());
    assert!(a.stop().success());
    reap_orphaned_agents();
}
