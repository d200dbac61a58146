//! The sandbox's agent token belongs to the server: the proxy refuses to change it (the
//! agent's `PUT /v1/token` exists for warm-pool claims), so a tenant cannot cut its own
//! sandbox off from the server's jobs and proxy by mistake.

use serde_json::json;

use crate::util::server::{send, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_refuses_to_rotate_the_agent_token() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    for path in ["token", "token/"] {
        let req = srv
            .req(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/{path}"))
            .json(&json!({"token": "x".repeat(32)}));
        let (s, body) = send(req).await;
        assert_eq!(s, 403, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("managed by the server"),
            "{body}"
        );
    }
    // The server's token still works: a job runs.
    let (s, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "echo ok", "wait": true}),
        )
        .await;
    assert_eq!((s, job["stdout"].as_str()), (200, Some("ok\n")), "{job}");
    srv.finish().await;
}
