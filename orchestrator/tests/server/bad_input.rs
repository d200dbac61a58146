//! Bad input on every route of [`orchard::server::openapi::ROUTES`] and on a sample of
//! the proxied agent routes: each is answered with a clear 4xx and a JSON body that
//! says what is wrong (`{"detail", "code"}` from the orchestrator, the agent's
//! `{"code", "message"}` passed through on proxied routes). And every documented route
//! is called against the router, so the list cannot drift from it: that, unknown routes
//! and methods, and the agent's errors on proxied routes are in
//! [`super::bad_input_routes`]; bodies, values, unknown ids and sizes are here.

use reqwest::Method;
use serde_json::{json, Value};

use crate::util::server::{send, TestServer, OTHER_KEY};

/// Asserts an orchestrator error: `status`, a non-empty `detail` and a `code`.
#[track_caller]
pub fn assert_detail(got: (u16, Value), status: u16, what: &str) -> String {
    let (s, body) = got;
    assert_eq!(s, status, "{what}: {body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(!detail.is_empty(), "{what}: no detail in {body}");
    assert!(body["code"].is_string(), "{what}: no code in {body}");
    detail.to_string()
}

/// Asserts an error the agent answered on a proxied route: `status`, `code`, a message.
#[track_caller]
pub fn assert_agent_error(got: (u16, Value), status: u16, code: &str, what: &str) {
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
pub async fn raw(
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
    assert_eq!(srv.sandbox_count().await, 1, "nothing was created");
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
    assert_eq!(srv.sandbox_count().await, 1, "nothing was created");
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
    assert_eq!(srv.sandbox_count().await, 2);
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
