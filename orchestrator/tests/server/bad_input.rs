//! Bad input on every route of [`orchard::server::openapi::ROUTES`] and on a sample of
//! the proxied agent routes: each is answered with a clear 4xx and a JSON body that
//! says what is wrong (`{"detail", "code"}` from the orchestrator, the agent's
//! `{"code", "message"}` passed through on proxied routes). And every documented route
//! is called against the router, so the list cannot drift from it.

use reqwest::Method;
use serde_json::{json, Value};

use super::v1_routes::{close_code, next_json, send_json, ws_connect};
use crate::util::server::{send, TestServer, KEY, OTHER_KEY};

/// Asserts an orchestrator error: `status`, a non-empty `detail` and a `code`.
#[track_caller]
fn assert_detail(got: (u16, Value), status: u16, what: &str) -> String {
    let (s, body) = got;
    assert_eq!(s, status, "{what}: {body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(!detail.is_empty(), "{what}: no detail in {body}");
    assert!(body["code"].is_string(), "{what}: no code in {body}");
    detail.to_string()
}

/// Asserts an error the agent answered on a proxied route: `status`, `code`, a message.
#[track_caller]
fn assert_agent_error(got: (u16, Value), status: u16, code: &str, what: &str) {
    let (s, body) = got;
    assert_eq!(
        (s, body["code"].as_str()),
        (status, Some(code)),
        "{what}: {body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {body}"
    );
}

/// `method path` with a raw body and the key.
async fn raw(
    srv: &TestServer,
    method: Method,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, Value) {
    send(
        srv.req(method, path)
            .header("content-type", "application/json")
            .body(body),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_bodies_that_are_malformed_empty_or_misshapen_are_400_or_422() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    // (route, bodies of the wrong shape: wrong types, missing fields, unknown fields)
    let routes: Vec<(String, Vec<Value>)> = vec![
        (
            "/sandboxes".into(),
            vec![
                json!({"image": 5}),
                json!({}),
                json!({"image": "busybox:latest", "block_network": "yes"}),
                json!({"image": "busybox:latest", "timeout": -3}),
            ],
        ),
        (
            "/v1/sandboxes".into(),
            vec![
                json!({"image": 5}),
                json!({}),
                json!({"image": "busybox:latest", "bogus": 1}),
                json!({"image": "busybox:latest", "env": ["A=1"]}),
            ],
        ),
        (
            format!("/sandboxes/{id}/exec"),
            vec![
                json!({"command": 3}),
                json!({}),
                json!({"command": "true", "env": ["X"]}),
                json!({"command": [1, 2]}),
            ],
        ),
        (
            format!("/sandboxes/{id}/apply_patch"),
            vec![json!({"patch": 5}), json!({})],
        ),
        (
            format!("/sandboxes/{id}/files"),
            vec![
                json!({"path": "/tmp/x", "content": 5}),
                json!({"path": "/tmp/x"}),
                json!({"content": ""}),
            ],
        ),
        (
            "/v1/images/pull".into(),
            vec![json!({"reference": 5}), json!({})],
        ),
    ];
    for (path, misshapen) in &routes {
        for body in [
            "{\"image\": ",
            "not json",
            "{,}",
            "{\"a\": 1,}",
            "{\"image\": 5",
            "\u{feff}{}",
        ] {
            let d = assert_detail(
                raw(&srv, Method::POST, path, body).await,
                400,
                &format!("POST {path} {body:?}"),
            );
            assert!(d.contains("malformed JSON"), "{path}: {d}");
        }
        for body in ["", "  \n"] {
            let d = assert_detail(
                raw(&srv, Method::POST, path, body).await,
                400,
                &format!("POST {path} empty"),
            );
            assert!(d.contains("expected a JSON body"), "{d}");
        }
        for body in misshapen
            .iter()
            .chain(&[json!([]), json!(null), json!("image")])
        {
            let d = assert_detail(
                raw(&srv, Method::POST, path, body.to_string()).await,
                422,
                &format!("POST {path} {body}"),
            );
            assert!(d.starts_with("invalid request"), "{d}");
        }
    }
    let (_, list) = srv.get("/v1/sandboxes").await;
    assert_eq!(
        list["sandboxes"].as_array().unwrap().len(),
        1,
        "nothing was created"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_are_400_with_a_detail_that_names_them() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let job = srv.submit(&id, "true").await;
    let img = "busybox:latest";
    let creates = [
        (json!({"image": img, "cpu": "lots"}), "cpu"),
        (json!({"image": img, "cpu": "0"}), "cpu"),
        (json!({"image": img, "cpu": "-2"}), "cpu"),
        (json!({"image": img, "memory": "12 parsecs"}), "memory"),
        (json!({"image": img, "memory": "1Ki"}), "memory"),
        // Regression: 8Mi passed validation and failed later with a 502.
        (json!({"image": img, "memory": "8Mi"}), "memory"),
        // More than the host has is lowered to it (see `limits_above_the_host`).
        (json!({"image": img, "memory": ""}), "memory"),
        (json!({"image": ""}), "image"),
        (json!({"image": "  "}), "image"),
    ];
    for (body, field) in &creates {
        let d = assert_detail(
            srv.post("/sandboxes", body.clone()).await,
            400,
            &format!("{body}"),
        );
        assert!(d.contains(field), "{d}");
        let d = assert_detail(
            srv.post("/v1/sandboxes", body.clone()).await,
            400,
            &format!("v1 {body}"),
        );
        assert!(d.contains(field), "{d}");
    }
    for bad in [
        "UPPER/../x",
        "../etc",
        "",
        "-lead",
        "a b",
        &"x".repeat(64),
        "café",
    ] {
        let d = assert_detail(
            srv.post("/sandboxes", json!({"image": img, "sandbox_id": bad}))
                .await,
            400,
            &format!("sandbox_id {bad:?}"),
        );
        assert!(d.contains("invalid sandbox id"), "{d}");
        assert_detail(
            srv.post("/v1/sandboxes", json!({"image": img, "id": bad}))
                .await,
            400,
            &format!("id {bad:?}"),
        );
    }
    let d = assert_detail(
        srv.post(
            "/v1/sandboxes",
            json!({"image": img, "labels": {"orchard.tenant": "me"}}),
        )
        .await,
        400,
        "reserved label",
    );
    assert!(d.contains("reserved"), "{d}");
    // What the backend would refuse is refused before anything starts: a 400, not a
    // sandbox that failed (502).
    for (body, what) in [
        (json!({"env": {"": "x"}}), "env"),
        (json!({"env": {"A=B": "x"}}), "env"),
        (json!({"env": {"A\u{0}": "x"}}), "env"),
        (json!({"env": {"A": "x\u{0}y"}}), "env"),
        (json!({"env": {"ORCHARD_AGENT_TOKEN": "mine"}}), "reserved"),
        (json!({"labels": {"": "x"}}), "label key"),
        (json!({"labels": {"a b": "x"}}), "label key"),
        (json!({"labels": {"k": "v".repeat(1025)}}), "longer than"),
        (json!({"image": "busybox:latest\u{0}"}), "image reference"),
        (json!({"image": "Not A Reference!!"}), "image reference"),
        (json!({"image": "busybox@sha256:nothex"}), "image reference"),
    ] {
        let mut body = body;
        if body.get("image").is_none() {
            body["image"] = json!(img);
        }
        for wait in [true, false] {
            body["wait"] = json!(wait);
            let d = assert_detail(
                srv.post("/v1/sandboxes", body.clone()).await,
                400,
                &format!("{body}"),
            );
            assert!(d.contains(what), "{body}: {d}");
        }
    }
    let d = assert_detail(
        srv.post("/sandboxes", json!({"image": "Not A Reference!!"}))
            .await,
        400,
        "compat create of a bad reference",
    );
    assert!(d.contains("image reference"), "{d}");

    let exec = format!("/sandboxes/{id}/exec");
    for body in [
        json!({"command": "true", "timeout_seconds": -1}),
        json!({"command": "true", "timeout_seconds": 0}),
        json!({"command": ""}),
        json!({"command": "   "}),
        json!({"command": []}),
    ] {
        assert_detail(
            srv.post(&exec, body.clone()).await,
            400,
            &format!("exec {body}"),
        );
    }
    let files = format!("/sandboxes/{id}/files");
    let d = assert_detail(
        srv.post(&files, json!({"path": "/tmp/x", "content": "not base64!"}))
            .await,
        400,
        "bad base64",
    );
    assert!(d.contains("base64"), "{d}");
    assert_detail(
        srv.post(&files, json!({"path": "", "content": "aGk="}))
            .await,
        400,
        "empty path",
    );
    // Regression: a write to a read-only path was answered 502, as if the server failed.
    let d = assert_detail(
        srv.post(&files, json!({"path": "/.orchard/evil", "content": "aGk="}))
            .await,
        403,
        "read-only path",
    );
    assert!(!d.is_empty());
    // A download must name its file; a listing without ?path lists /workspace.
    let d = assert_detail(srv.get(&files).await, 400, "download without ?path");
    assert!(d.contains("path"), "{d}");

    // Query values.
    for (path, value) in [
        (format!("/sandboxes/{id}/wait"), "abc"),
        (format!("/sandboxes/{id}/wait"), "-1"),
        (format!("/sandboxes/{id}/wait"), "NaN"),
        (format!("/v1/sandboxes/{id}/wait"), "abc"),
        (format!("/v1/sandboxes/{id}/wait"), "inf"),
        (format!("/jobs/{job}/wait"), "-1"),
        (format!("/jobs/{job}/wait"), "1s"),
    ] {
        let d = assert_detail(
            srv.get(&format!("{path}?timeout={value}")).await,
            400,
            &format!("{path}?timeout={value}"),
        );
        assert!(d.contains("timeout"), "{d}");
    }
    // Waits longer than the longest allowed are cut to it, not refused (nor a panic).
    for path in [
        format!("/sandboxes/{id}/wait?timeout=1e20"),
        format!("/v1/sandboxes/{id}/wait?timeout=1e300"),
        format!("/jobs/{job}/wait?timeout=18446744073709551616"),
    ] {
        let (s, v) = srv.get(&path).await;
        assert_eq!(s, 200, "{path}: {v}");
    }
    // A lifetime past any clock is refused; a readiness limit is cut to the server's.
    let d = assert_detail(
        srv.post("/v1/sandboxes", json!({"image": img, "ttl_s": u64::MAX}))
            .await,
        400,
        "ttl_s u64::MAX",
    );
    assert!(d.contains("ttl_s"), "{d}");
    let (s, v) = srv
        .post("/sandboxes", json!({"image": img, "timeout": u64::MAX}))
        .await;
    assert_eq!(s, 200, "{v}");
    let sb = v["sandbox_id"].as_str().unwrap();
    let (s, v) = srv
        .get(&format!("/v1/sandboxes/{sb}/wait?timeout=60"))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(srv.delete(&format!("/v1/sandboxes/{sb}")).await.0, 200);

    // Images.
    let d = assert_detail(
        srv.delete("/v1/images").await,
        400,
        "DELETE /v1/images without reference",
    );
    assert!(d.contains("reference"), "{d}");
    assert_detail(
        srv.post("/v1/images/pull", json!({"reference": " "})).await,
        400,
        "empty reference",
    );
    assert_detail(
        raw(&srv, Method::POST, "/v1/images/import", "").await,
        400,
        "empty import",
    );
    assert_detail(
        raw(
            &srv,
            Method::POST,
            "/v1/images/import?name=x:1",
            vec![7u8; 4096],
        )
        .await,
        400,
        "import of garbage",
    );
    let (_, images) = srv.get("/v1/images").await;
    assert_eq!(images["images"].as_array().unwrap().len(), 1, "{images}");
    let (_, list) = srv.get("/v1/sandboxes").await;
    assert_eq!(
        list["sandboxes"].as_array().unwrap().len(),
        1,
        "nothing was created"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sandboxes_jobs_and_images_are_404_naming_them() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let nope = "nope-1";
    let job = "job-0123456789abcdef";
    let routes: Vec<(Method, String, Value)> = vec![
        (Method::GET, format!("/sandboxes/{nope}"), Value::Null),
        (Method::DELETE, format!("/sandboxes/{nope}"), Value::Null),
        (
            Method::GET,
            format!("/sandboxes/{nope}/wait?timeout=1"),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/sandboxes/{nope}/heartbeat"),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/sandboxes/{nope}/exec"),
            json!({"command": "true"}),
        ),
        (
            Method::POST,
            format!("/sandboxes/{nope}/apply_patch"),
            json!({"patch": ""}),
        ),
        (
            Method::POST,
            format!("/sandboxes/{nope}/files"),
            json!({"path": "/x", "content": ""}),
        ),
        (
            Method::GET,
            format!("/sandboxes/{nope}/files?path=/x"),
            Value::Null,
        ),
        (
            Method::GET,
            format!("/sandboxes/{nope}/files/list?path=/"),
            Value::Null,
        ),
        (Method::GET, format!("/jobs/{job}"), Value::Null),
        (
            Method::GET,
            format!("/jobs/{job}/wait?timeout=1"),
            Value::Null,
        ),
        (Method::GET, format!("/v1/sandboxes/{nope}"), Value::Null),
        (Method::DELETE, format!("/v1/sandboxes/{nope}"), Value::Null),
        (
            Method::GET,
            format!("/v1/sandboxes/{nope}/wait?timeout=1"),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{nope}/heartbeat"),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{nope}/exec"),
            json!({"command": "true"}),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{nope}/files?path=/etc/passwd"),
            Value::Null,
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{nope}/pty/t1/attach"),
            Value::Null,
        ),
        (
            Method::PUT,
            format!("/v1/sandboxes/{nope}/files?path=/x"),
            json!("bytes"),
        ),
    ];
    for (m, path, body) in routes {
        let mut req = srv.req(m.clone(), &path);
        if !body.is_null() {
            req = req.json(&body);
        }
        let d = assert_detail(send(req).await, 404, &format!("{m} {path}"));
        let named = if path.starts_with("/jobs") { job } else { nope };
        assert!(d.contains(named), "{m} {path}: {d}");
    }
    let d = assert_detail(
        srv.delete("/v1/images?reference=nope:latest").await,
        404,
        "unknown image",
    );
    assert!(d.contains("nope:latest"), "{d}");
    // Another tenant's sandbox is as unknown as one that does not exist.
    let id = srv.sandbox().await;
    let (s, e) = send(
        srv.http
            .get(format!(
                "{}/v1/sandboxes/{id}/files?path=/etc/passwd",
                srv.url
            ))
            .header("X-API-Key", OTHER_KEY),
    )
    .await;
    assert_eq!(s, 404, "{e}");
    assert!(e["detail"].as_str().unwrap().contains(&id));
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_sandbox_id_is_409_across_both_apis_and_keys() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let (s, _) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:latest", "id": "dup-1", "wait": false}),
        )
        .await;
    assert_eq!(s, 201);
    let (s, _) = srv
        .post(
            "/sandboxes",
            json!({"image": "busybox:latest", "sandbox_id": "dup-2"}),
        )
        .await;
    assert_eq!(s, 200);
    for dup in ["dup-1", "dup-2"] {
        let d = assert_detail(
            srv.post(
                "/v1/sandboxes",
                json!({"image": "busybox:latest", "id": dup}),
            )
            .await,
            409,
            &format!("v1 {dup}"),
        );
        assert!(d.contains(dup), "{d}");
        assert_detail(
            srv.post(
                "/sandboxes",
                json!({"image": "busybox:latest", "sandbox_id": dup}),
            )
            .await,
            409,
            &format!("compat {dup}"),
        );
        assert_detail(
            send(
                srv.http
                    .post(format!("{}/v1/sandboxes", srv.url))
                    .header("X-API-Key", OTHER_KEY)
                    .json(&json!({"image": "busybox:latest", "id": dup})),
            )
            .await,
            409,
            &format!("other key {dup}"),
        );
    }
    for dup in ["dup-1", "dup-2"] {
        let (s, v) = srv
            .get(&format!("/v1/sandboxes/{dup}/wait?timeout=60"))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let (_, list) = srv.get("/v1/sandboxes").await;
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 2);
    srv.finish().await;
}

/// A JSON object of about `n` bytes.
fn huge_json(n: usize) -> Vec<u8> {
    let mut v =
        br#"{"image": "busybox:latest", "command": "true", "reference": "x", "pad": ""#.to_vec();
    v.resize(n, b'a');
    v.extend_from_slice(b"\"}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_are_413_and_the_upload_route_takes_more() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let huge = huge_json(17 << 20);
    for path in [
        "/sandboxes".to_string(),
        "/v1/sandboxes".into(),
        format!("/sandboxes/{id}/exec"),
        "/v1/images/pull".into(),
    ] {
        let d = assert_detail(
            raw(&srv, Method::POST, &path, huge.clone()).await,
            413,
            &format!("17 MiB to {path}"),
        );
        assert!(d.contains("larger than"), "{d}");
    }
    // A proxied JSON route has the same limit (the agent's), answered before forwarding.
    for _ in 0..3 {
        let (s, e) = raw(
            &srv,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            huge.clone(),
        )
        .await;
        assert_eq!(
            (s, e["code"].as_str()),
            (413, Some("body_too_large")),
            "{e}"
        );
    }
    // Without a Content-Length (chunked), too.
    let stream = futures_util::stream::iter(
        huge.chunks(1 << 20)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    assert_detail(
        raw(
            &srv,
            Method::POST,
            "/v1/sandboxes",
            reqwest::Body::wrap_stream(stream),
        )
        .await,
        413,
        "17 MiB chunked",
    );
    // The compatible upload allows 512 MiB of JSON: 17 MiB of it is fine.
    let content = orchard_protocol::output::b64_encode(&vec![b'z'; 13 << 20]);
    let (s, up) = srv
        .post(
            &format!("/sandboxes/{id}/files"),
            json!({"path": "/tmp/big", "content": content}),
        )
        .await;
    assert_eq!((s, up["size"].as_u64()), (200, Some(13 << 20)), "{up}");
    let (s, _) = srv.get("/health").await;
    assert_eq!(s, 200, "the server is fine");
    srv.finish().await;
}

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
