//! Bad input on the routes themselves: unknown routes and wrong methods, the agent's
//! errors passed through on proxied routes, plain HTTP on the compatible terminal's
//! WebSocket route, and every documented route called against the router (so the list
//! in [`orchard::server::openapi::ROUTES`] cannot drift from it).

use reqwest::Method;
use serde_json::{json, Value};

use super::bad_input::{assert_agent_error, assert_detail};
use super::v1_routes::{close_code, next_json, send_json, ws_connect};
use crate::util::server::{send, TestServer, KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_are_404_and_wrong_methods_405_with_a_detail() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = "any-1";
    for path in [
        "/nope",
        "/v1/nope",
        "/v1",
        "/sandboxes/x/nope",
        "/jobs",
        "/v1/images/x/y",
        "/sandboxes/x/files/list/deeper",
    ] {
        let d = assert_detail(srv.get(path).await, 404, path);
        assert!(d.starts_with("no route GET"), "{d}");
        let (s, _) = send(srv.http.get(format!("{}{path}", srv.url))).await;
        assert_eq!(s, 404, "{path} without a key is still unknown");
    }
    let wrong: Vec<(Method, String)> = vec![
        (Method::POST, "/".into()),
        (Method::POST, "/health".into()),
        (Method::POST, "/metrics".into()),
        (Method::DELETE, "/openapi.json".into()),
        (Method::PUT, "/resources".into()),
        (Method::GET, "/sandboxes".into()),
        (Method::PUT, format!("/sandboxes/{id}")),
        (Method::POST, format!("/sandboxes/{id}/wait")),
        (Method::GET, format!("/sandboxes/{id}/heartbeat")),
        (Method::GET, format!("/sandboxes/{id}/exec")),
        (Method::POST, format!("/sandboxes/{id}/exec/pty")),
        (Method::GET, format!("/sandboxes/{id}/apply_patch")),
        (Method::DELETE, format!("/sandboxes/{id}/files")),
        (Method::POST, format!("/sandboxes/{id}/files/list")),
        (Method::DELETE, "/jobs/job-1".into()),
        (Method::POST, "/jobs/job-1/wait".into()),
        (Method::DELETE, "/v1/sandboxes".into()),
        (Method::PATCH, format!("/v1/sandboxes/{id}")),
        (Method::POST, format!("/v1/sandboxes/{id}/wait")),
        (Method::GET, format!("/v1/sandboxes/{id}/heartbeat")),
        (Method::POST, "/v1/images".into()),
        (Method::GET, "/v1/images/pull".into()),
        (Method::GET, "/v1/images/import".into()),
    ];
    for (m, path) in wrong {
        let d = assert_detail(
            send(srv.req(m.clone(), &path)).await,
            405,
            &format!("{m} {path}"),
        );
        assert!(d.contains("not allowed"), "{d}");
    }
    // A path that is not UTF-8 once decoded.
    for path in ["/sandboxes/%FF", "/v1/sandboxes/%FF/wait", "/jobs/%C3%28"] {
        let (s, body) = srv.get(path).await;
        assert!((400..500).contains(&s), "{path}: {s} {body}");
        assert!(body["detail"].is_string(), "{path}: {s} {body}");
    }
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_routes_pass_the_agents_errors_through() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let v = format!("/v1/sandboxes/{id}");
    let cases: Vec<(Method, String, Option<&str>, u16, &str)> = vec![
        (
            Method::POST,
            format!("{v}/exec"),
            Some(r#"{"command": 3}"#),
            400,
            "invalid_json",
        ),
        (
            Method::POST,
            format!("{v}/exec"),
            Some("{"),
            400,
            "invalid_json",
        ),
        (
            Method::POST,
            format!("{v}/exec"),
            Some(""),
            400,
            "invalid_json",
        ),
        (
            Method::POST,
            format!("{v}/exec"),
            Some(r#"{"command": "true", "bogus": 1}"#),
            400,
            "invalid_json",
        ),
        (
            Method::POST,
            format!("{v}/exec"),
            Some(r#"{"command": ["/no/such"]}"#),
            400,
            "command_not_found",
        ),
        (
            Method::POST,
            format!("{v}/exec/stream"),
            Some(r#"{}"#),
            400,
            "invalid_json",
        ),
        (
            Method::POST,
            format!("{v}/processes"),
            Some(r#"{"command": "true", "cwd": "/no/such"}"#),
            400,
            "cwd_not_found",
        ),
        (
            Method::GET,
            format!("{v}/processes/nope"),
            None,
            404,
            "not_found",
        ),
        (
            Method::POST,
            format!("{v}/processes/nope/signal"),
            Some(r#"{"signal": "TERM"}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            format!("{v}/sessions/nope/run"),
            Some(r#"{"command": "true"}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            format!("{v}/pty"),
            Some(r#"{"rows": "many"}"#),
            400,
            "invalid_json",
        ),
        (
            Method::GET,
            format!("{v}/pty/nope/attach"),
            None,
            404,
            "not_found",
        ),
        (
            Method::GET,
            format!("{v}/files?path=relative"),
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            format!("{v}/files"),
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            format!("{v}/files?path=/no/such"),
            None,
            404,
            "not_found",
        ),
        (
            Method::GET,
            format!("{v}/files/list?path=/etc&depth=-1"),
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            format!("{v}/files/mkdir"),
            Some("{}"),
            400,
            "invalid_json",
        ),
        (
            Method::POST,
            format!("{v}/files/move"),
            Some(r#"{"from": "/no/such", "to": "/tmp/y"}"#),
            404,
            "not_found",
        ),
        (
            Method::PUT,
            format!("{v}/files/archive?path=/tmp/a"),
            Some("not a tar at all, not even close"),
            400,
            "invalid_archive",
        ),
        (
            Method::POST,
            format!("{v}/git/status"),
            Some(r#"{"repo": "/nowhere"}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            format!("{v}/git/diff"),
            Some(r#"{"repo": 1}"#),
            400,
            "invalid_json",
        ),
        (
            Method::GET,
            format!("{v}/nope"),
            None,
            404,
            "route_not_found",
        ),
        (
            Method::DELETE,
            format!("{v}/exec"),
            None,
            405,
            "method_not_allowed",
        ),
    ];
    for (m, path, body, status, code) in cases {
        let mut req = srv.req(m.clone(), &path);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        assert_agent_error(
            send(req).await,
            status,
            code,
            &format!("{m} {path} {body:?}"),
        );
    }
    // A plain GET of the terminal WebSocket is refused by the agent, clearly.
    let (_, pty) = srv.post(&format!("{v}/pty"), json!({})).await;
    let tid = pty["id"].as_str().unwrap();
    assert_agent_error(
        srv.get(&format!("{v}/pty/{tid}/attach")).await,
        400,
        "invalid_argument",
        "plain GET attach",
    );
    // The orchestrator's own checks come first: the key, then the sandbox.
    let (s, e) = send(srv.http.post(format!("{}{v}/exec", srv.url)).body("{")).await;
    assert_eq!(s, 401, "{e}");
    assert!(e["detail"].is_string());
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_compatible_terminal_route_is_a_clear_400() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let d = assert_detail(
        srv.get(&format!("/sandboxes/{id}/exec/pty")).await,
        400,
        "plain GET",
    );
    assert!(d.contains("WebSocket"), "{d}");
    // And a real upgrade still works on the same route.
    let (mut ws, _) = ws_connect(
        &srv,
        &format!("/sandboxes/{id}/exec/pty?api_key={KEY}"),
        &[],
    )
    .await;
    send_json(&mut ws, json!({"type": "init", "cmd": ["true"]})).await;
    assert_eq!(next_json(&mut ws).await["type"], "ready");
    srv.finish().await;
}

/// `path` with its parameters filled in.
fn fill(path: &str, sandbox: &str, job: &str) -> String {
    if path.starts_with("/jobs/") {
        path.replace("{id}", job)
    } else {
        path.replace("{id}", sandbox)
            .replace("{pid}", "nope")
            .replace("{sid}", "nope")
            .replace("{tid}", "nope")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_known_to_the_router() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let (_, q) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "true", "wait": true}),
        )
        .await;
    let job = q["job_id"].as_str().unwrap().to_string();
    // Each DELETE gets a sandbox of its own; they come last.
    let mut routes: Vec<_> = orchard::server::openapi::ROUTES.iter().collect();
    routes.sort_by_key(|r| r.method == "DELETE");
    assert!(routes.len() >= 28);
    for r in routes {
        let sandbox = if r.method == "DELETE" && r.path.contains("{id}") {
            srv.sandbox().await
        } else {
            id.clone()
        };
        let path = fill(r.path, &sandbox, &job);
        let what = format!("{} {}", r.method, r.path);
        let method = Method::from_bytes(r.method.as_bytes()).unwrap();
        if matches!(r.request, orchard_protocol::openapi::Body::WebSocket) {
            let (mut ws, resp) = ws_connect(&srv, &format!("{path}?api_key={KEY}"), &[]).await;
            assert_eq!(resp.status(), 101, "{what}");
            send_json(&mut ws, json!({"type": "close"})).await;
            close_code(&mut ws).await;
            continue;
        }
        // The documented auth: no key is 401 exactly where one is needed.
        let (s, body) = send(
            srv.http
                .request(method.clone(), format!("{}{path}", srv.url)),
        )
        .await;
        if r.auth {
            assert_eq!(s, 401, "{what} without a key: {body}");
        } else {
            assert!(
                (200..300).contains(&s),
                "{what} is documented as open: {s} {body}"
            );
        }
        // With the key: the router knows the route (an empty body is fine: a 400 from
        // the route's own parsing still shows it was routed).
        let resp = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            srv.req(method, &path).send(),
        )
        .await
        .unwrap()
        .unwrap();
        let s = resp.status().as_u16();
        let body: Value =
            serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or(Value::Null);
        assert_ne!(s, 405, "{what}: {body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(
            !(s == 404 && detail.starts_with("no route")),
            "{what} is documented but not routed: {body}"
        );
        if s == 404 {
            assert!(
                !detail.is_empty(),
                "{what}: a 404 that the orchestrator did not answer: {body}"
            );
        }
        assert!(s < 500, "{what}: {s} {body}");
    }
    // The agent routes as documented under /v1/sandboxes/{id}: the agent knows each.
    for r in orchard::server::openapi::proxied_routes() {
        let path = fill(r.path, &id, &job);
        let what = format!("{} {}", r.method, r.path);
        let mut req = srv.req(Method::from_bytes(r.method.as_bytes()).unwrap(), &path);
        if matches!(r.request, orchard_protocol::openapi::Body::Json(_)) {
            req = req.json(&json!({}));
        }
        let (s, body) = send(req).await;
        assert_ne!(s, 405, "{what}: {body}");
        assert_ne!(
            body["code"], "route_not_found",
            "{what} is documented but the agent has no such route"
        );
        assert!(s < 500, "{what}: {s} {body}");
    }
    srv.finish().await;
}

/// Regression: the agent answered a bad query of its process routes with axum's
/// plain-text rejection (`Query` where its other routes used `ApiQuery`), so the proxied
/// answer was a 400 without the `{code, message}` body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_bad_process_query_values_are_answered_as_json() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let (_, p) = srv
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"command": "true"}),
        )
        .await;
    let pid = p["id"].as_str().unwrap();
    for q in [
        "output?stdout_offset=abc",
        "output?max_bytes=-1",
        "wait?timeout_ms=soon",
    ] {
        let path = format!("/v1/sandboxes/{id}/processes/{pid}/{q}");
        assert_agent_error(srv.get(&path).await, 400, "invalid_argument", &path);
    }
    srv.finish().await;
}
