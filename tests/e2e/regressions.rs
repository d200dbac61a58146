//! One `regression_*` test per bug fixed so far that took the orchestrator, the agent
//! and runc together to show, named after what broke.

use reqwest::Method;
use serde_json::json;

use crate::util::{assert_api_error, send, Server};

/// Commit e2efe0a: running a program that is a symbolic-link loop (ELOOP, as `make run`
/// made when busybox was overwritten with a link to itself) was a server error; it is
/// the caller's mistake, `command_not_found`, like any program that cannot run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_program_that_is_a_symlink_loop_is_command_not_found() {
    orchard_test_support::require_runc!();
    let (srv, id) = Server::with_sandbox().await;
    let exec = format!("/v1/sandboxes/{id}/exec");
    let (status, answer) = send(
        srv.req(Method::POST, &exec)
            .json(&json!({"command": "ln -s /tmp/loop /tmp/loop"})),
    )
    .await;
    assert_eq!(
        (status, answer["exit_code"].as_i64()),
        (200, Some(0)),
        "{answer}"
    );
    let answer = send(
        srv.req(Method::POST, &exec)
            .json(&json!({"command": ["/tmp/loop"]})),
    )
    .await;
    assert_api_error(&answer, 400, "command_not_found", "exec of /tmp/loop");
    srv.finish().await;
}

/// Commit 3f749bb and e0d3cdf: the agent answered a refused upload (a bad query, found
/// before any handler ran) before reading its body, hyper closed the connection under
/// the orchestrator's proxy still sending, and the proxy answered 502 instead of the
/// agent's 400 (a PUT of 2 MB was a 502 one time in three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_refused_upload_through_the_proxy_is_the_agents_400_not_a_502() {
    orchard_test_support::require_runc!();
    let (srv, id) = Server::with_sandbox().await;
    let base = format!("/v1/sandboxes/{id}/files");
    let body = vec![b'x'; 2 << 20];
    // A race: several times, each refusal from a different place in the agent.
    for round in 0..4 {
        for query in ["path=/tmp/f&parents=0.5", "path=", "path=relative"] {
            let answer = send(
                srv.req(Method::PUT, &format!("{base}?{query}"))
                    .body(body.clone()),
            )
            .await;
            let what = format!("round {round}, PUT files?{query}");
            assert_api_error(&answer, 400, "invalid_argument", &what);
        }
    }
    // The connection pool still serves: an accepted upload of the same size lands.
    let (status, answer) = send(
        srv.req(Method::PUT, &format!("{base}?path=/tmp/f"))
            .body(body.clone()),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    srv.finish().await;
}
