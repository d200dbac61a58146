//! The `/v1/` routes over a real server: the sandbox lifecycle, the agent's exec (and
//! its NDJSON stream), processes and sessions as proxied at `/v1/sandboxes/{id}/...`,
//! and direct access to the agent with the endpoint and token a sandbox answers. Files
//! and git through the proxy are in [`super::v1_files`], terminals over WebSocket in
//! [`super::v1_terminals`]; the WebSocket helpers here serve every module.

use std::path::PathBuf;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orchard_client::{AgentClient, Endpoint};
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::{Command, ExecRequest};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use crate::util::server::{send, TestServer, OTHER_KEY};

/// A WebSocket client of the test server.
pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Longest wait for one WebSocket frame.
const FRAME_LIMIT: Duration = Duration::from_secs(15);

/// Opens a WebSocket to `path` of the server with extra request `headers`; answers the
/// socket and the handshake response.
pub async fn ws_connect(
    srv: &TestServer,
    path: &str,
    headers: &[(&str, &str)],
) -> (
    Ws,
    tokio_tungstenite::tungstenite::handshake::client::Response,
) {
    let url = format!("{}{path}", srv.url.replacen("http://", "ws://", 1));
    let mut req = url.into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    tokio::time::timeout(FRAME_LIMIT, tokio_tungstenite::connect_async(req))
        .await
        .expect("WebSocket handshake timed out")
        .unwrap_or_else(|e| panic!("WebSocket to {path}: {e}"))
}

/// What the server sent next: a JSON text frame, or the close code (`None` when the
/// connection ended without a close frame).
#[derive(Debug)]
pub enum Frame {
    /// A text frame's JSON.
    Json(Value),
    /// A close frame's code.
    Closed(Option<u16>),
}

/// The next frame other than ping/pong.
pub async fn next_frame(ws: &mut Ws) -> Frame {
    loop {
        let msg = tokio::time::timeout(FRAME_LIMIT, ws.next())
            .await
            .expect("no WebSocket frame within the limit");
        match msg {
            None | Some(Err(_)) => return Frame::Closed(None),
            Some(Ok(Message::Text(t))) => {
                return Frame::Json(serde_json::from_str(t.as_str()).expect("a JSON text frame"))
            }
            Some(Ok(Message::Close(c))) => return Frame::Closed(c.map(|c| u16::from(c.code))),
            Some(Ok(Message::Binary(b))) => panic!("unexpected binary frame: {b:?}"),
            Some(Ok(_)) => continue,
        }
    }
}

/// The next frame, which must be JSON.
pub async fn next_json(ws: &mut Ws) -> Value {
    match next_frame(ws).await {
        Frame::Json(v) => v,
        Frame::Closed(c) => panic!("the socket closed ({c:?}) where a frame was expected"),
    }
}

/// Sends one JSON text frame.
pub async fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// Reads frames until the close, answering its code.
pub async fn close_code(ws: &mut Ws) -> Option<u16> {
    loop {
        if let Frame::Closed(c) = next_frame(ws).await {
            return c;
        }
    }
}

/// Reads terminal frames (`output`/`stdout` with base64 `data`) until the text seen
/// contains `needle`; answers everything seen.
pub async fn read_until(ws: &mut Ws, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let f = next_json(ws).await;
        match f["type"].as_str() {
            Some("output" | "stdout") => {
                let bytes = b64_decode(f["data"].as_str().unwrap()).unwrap();
                seen.push_str(&String::from_utf8_lossy(&bytes));
            }
            _ => panic!("unexpected frame {f} while waiting for {needle:?}; seen {seen:?}"),
        }
    }
    seen
}

/// The bytes of a non-JSON answer.
pub async fn bytes(req: reqwest::RequestBuilder) -> (u16, Vec<u8>) {
    let resp = tokio::time::timeout(Duration::from_secs(60), req.send())
        .await
        .expect("request timed out")
        .expect("request failed");
    (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
}

/// A direct client of a sandbox's agent, from what the API answers about it.
async fn direct_client(srv: &TestServer, id: &str) -> AgentClient {
    let (s, sb) = srv.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(s, 200, "{sb}");
    let socket = sb["agent"]["socket"]
        .as_str()
        .expect("a local sandbox has a socket");
    let token = sb["agent"]["token"].as_str().unwrap();
    AgentClient::new(Endpoint::Unix(PathBuf::from(socket)), token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_wait_get_list_heartbeat_delete() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let (s, ready) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:latest", "labels": {"team": "a"}, "env": {"FOO": "bar baz"}}),
        )
        .await;
    assert_eq!(s, 201, "{ready}");
    assert_eq!(
        (ready["status"].as_str(), ready["ready"].as_bool()),
        (Some("running"), Some(true))
    );
    assert!(
        ready["agent"]["socket"]
            .as_str()
            .is_some_and(|p| p.ends_with(".sock")),
        "{ready}"
    );
    assert!(
        ready["agent"]["token"]
            .as_str()
            .is_some_and(|t| t.len() >= 16),
        "{ready}"
    );
    assert_eq!(ready["labels"], json!({"team": "a"}));
    assert_eq!(ready["block_network"], true);
    assert!(ready["ready_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let a = ready["id"].as_str().unwrap().to_string();

    // wait=false answers at once, pending and without an agent; /wait blocks until ready.
    let (s, pending) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:latest", "id": "v1-later", "wait": false, "cpu": "500m", "memory": "128Mi"}),
        )
        .await;
    assert_eq!(s, 201, "{pending}");
    assert_eq!(pending["id"], "v1-later");
    assert_eq!(pending["status"], "pending");
    assert_eq!(
        (pending["ready"].as_bool(), &pending["agent"]),
        (Some(false), &Value::Null)
    );
    let (s, waited) = srv.get("/v1/sandboxes/v1-later/wait?timeout=60").await;
    assert_eq!(s, 200, "{waited}");
    assert_eq!(waited["status"], "running");
    assert!(waited["agent"]["token"].is_string());
    assert_eq!(
        (waited["cpu"].as_str(), waited["memory"].as_str()),
        (Some("500m"), Some("128Mi"))
    );
    let (s, got) = srv.get("/v1/sandboxes/v1-later").await;
    assert_eq!((s, &got), (200, &waited));

    // The sandbox's env reaches its commands.
    let (s, out) = srv
        .post(
            &format!("/v1/sandboxes/{a}/exec"),
            json!({"command": "echo \"$FOO\""}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    assert_eq!(out["stdout"]["data"], "bar baz\n");

    let (s, list) = srv.get("/v1/sandboxes").await;
    assert_eq!(s, 200);
    let ids: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [a.as_str(), "v1-later"], "oldest first");
    let (_, theirs) = srv.get_as(OTHER_KEY, "/v1/sandboxes").await;
    assert_eq!(theirs, json!({"sandboxes": []}));

    let (s, hb) = srv
        .post(&format!("/v1/sandboxes/{a}/heartbeat"), json!({}))
        .await;
    assert_eq!(s, 200, "{hb}");
    assert_eq!(
        (hb["id"].as_str(), hb["status"].as_str()),
        (Some(a.as_str()), Some("ok"))
    );
    assert!(
        hb["expires_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{hb}"
    );
    let (_, after) = srv.get(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(after["expires_at"], hb["expires_at"]);

    let (s, del) = srv.delete(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!((s, del), (200, json!({"id": a, "status": "deleted"})));
    let (s, gone) = srv.get(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(s, 404, "{gone}");
    let (s, gone) = srv
        .post(
            &format!("/v1/sandboxes/{a}/exec"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(s, 404, "the proxy forgets a deleted sandbox: {gone}");
    assert_eq!(srv.sandbox_count().await, 1);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_its_ndjson_stream_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}");
    let (s, r) = srv
        .post(
            &format!("{base}/exec"),
            json!({"command": ["sh", "-c", "echo out; echo err >&2; exit 3"], "cwd": "/tmp"}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(
        (r["stdout"]["data"].as_str(), r["stderr"]["data"].as_str()),
        (Some("out\n"), Some("err\n"))
    );
    assert_eq!(r["timed_out"], false);

    // The stream: `start`, then output as it is written (the command blocks on a fifo
    // after its first line until a second request writes to it), then `exit`.
    let (s, _) = srv
        .post(
            &format!("{base}/exec"),
            json!({"command": "mkfifo /tmp/go"}),
        )
        .await;
    assert_eq!(s, 200);
    let mut resp = srv
        .req(reqwest::Method::POST, &format!("{base}/exec/stream"))
        .json(&json!({"command": "echo first; read x < /tmp/go; echo \"then $x\"; echo e >&2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], orchard_protocol::NDJSON);
    let mut buf = Vec::new();
    let mut events: Vec<Value> = Vec::new();
    let mut stdout = String::new();
    let mut released = false;
    loop {
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let ev: Value = serde_json::from_slice(&line).expect("one JSON object per line");
            if ev["type"] == "stdout" {
                stdout.push_str(
                    &String::from_utf8(b64_decode(ev["data"].as_str().unwrap()).unwrap()).unwrap(),
                );
            }
            events.push(ev);
        }
        if events.last().is_some_and(|e| e["type"] == "exit") {
            break;
        }
        if stdout.contains("first\n") && !released {
            // The first line came through while the command still runs.
            released = true;
            let (s, w) = srv
                .post(
                    &format!("{base}/exec"),
                    json!({"command": "echo go > /tmp/go"}),
                )
                .await;
            assert_eq!((s, &w["exit_code"]), (200, &json!(0)), "{w}");
        }
        let chunk = tokio::time::timeout(FRAME_LIMIT, resp.chunk())
            .await
            .expect("the stream stalled")
            .unwrap()
            .expect("the stream ended before its exit frame");
        buf.extend_from_slice(&chunk);
    }
    assert!(released);
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .filter(|t| *t != "keepalive")
        .collect();
    assert_eq!(types.first(), Some(&"start"), "{events:?}");
    assert!(events[0]["pid"].as_u64().is_some_and(|p| p > 0));
    assert!(types.contains(&"stderr"));
    assert_eq!(stdout, "first\nthen go\n");
    let exit = events.last().unwrap();
    assert_eq!(
        (exit["exit_code"].as_i64(), exit["stdout_bytes"].as_u64()),
        (Some(0), Some(14)),
        "{exit}"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let p = format!("/v1/sandboxes/{id}/processes");
    let (s, reader) = srv
        .post(
            &p,
            json!({"command": "while read l; do echo got:$l; done; echo bye >&2; exit 5"}),
        )
        .await;
    assert_eq!(s, 200, "{reader}");
    assert_eq!(reader["state"], "running");
    let rid = reader["id"].as_str().unwrap().to_string();
    let (s, sleeper) = srv.post(&p, json!({"command": ["sleep", "30"]})).await;
    assert_eq!(s, 200, "{sleeper}");
    let sid = sleeper["id"].as_str().unwrap().to_string();

    let (s, list) = srv.get(&p).await;
    assert_eq!(s, 200);
    let mut listed: Vec<&str> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    let mut want = vec![rid.as_str(), sid.as_str()];
    want.sort_unstable();
    assert_eq!(listed, want);
    let (s, one) = srv.get(&format!("{p}/{rid}")).await;
    assert_eq!(
        (s, one["state"].as_str(), one["stdin_open"].as_bool()),
        (200, Some("running"), Some(true))
    );

    // stdin, then EOF; the wait answers once it exits, the output then holds it all.
    let (s, w) = srv
        .post(
            &format!("{p}/{rid}/stdin"),
            json!({"data": "hello\nworld\n"}),
        )
        .await;
    assert_eq!(s, 200, "{w}");
    let (s, w) = srv
        .post(
            &format!("{p}/{rid}/stdin"),
            json!({"data_b64": b64_encode(b"!\n"), "eof": true}),
        )
        .await;
    assert_eq!((s, w["stdin_open"].as_bool()), (200, Some(false)), "{w}");
    let (s, done) = srv.get(&format!("{p}/{rid}/wait?timeout_ms=15000")).await;
    assert_eq!(s, 200);
    assert_eq!(done["state"], "exited", "{done}");
    assert_eq!(done["exit"]["exit_code"], 5);
    let (s, out) = srv.get(&format!("{p}/{rid}/output")).await;
    assert_eq!(s, 200, "{out}");
    let text = |chunk: &Value| {
        String::from_utf8(b64_decode(chunk["data"].as_str().unwrap()).unwrap()).unwrap()
    };
    assert_eq!(text(&out["stdout"]), "got:hello\ngot:world\ngot:!\n");
    assert_eq!(text(&out["stderr"]), "bye\n");
    assert_eq!(out["stdout"]["next_offset"], 26);
    let (_, tail) = srv.get(&format!("{p}/{rid}/output?stdout_offset=10")).await;
    assert_eq!(
        (
            tail["stdout"]["offset"].as_u64(),
            text(&tail["stdout"]).as_str()
        ),
        (Some(10), "got:world\ngot:!\n")
    );

    // A signal ends the sleeper; a short wait on a running process answers it running.
    let (_, still) = srv.get(&format!("{p}/{sid}/wait?timeout_ms=50")).await;
    assert_eq!(still["state"], "running");
    let (s, sig) = srv
        .post(&format!("{p}/{sid}/signal"), json!({"signal": "TERM"}))
        .await;
    assert_eq!(s, 200, "{sig}");
    let (_, ended) = srv.get(&format!("{p}/{sid}/wait?timeout_ms=15000")).await;
    assert_eq!(
        (ended["state"].as_str(), ended["exit"]["signal"].as_i64()),
        (Some("exited"), Some(15)),
        "{ended}"
    );

    for pid in [&rid, &sid] {
        let (s, gone) = srv.delete(&format!("{p}/{pid}")).await;
        assert_eq!((s, gone["id"].as_str()), (200, Some(pid.as_str())));
        let (s, e) = srv.get(&format!("{p}/{pid}")).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (404, Some("not_found")),
            "the agent's error passes through: {e}"
        );
    }
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_cd_and_export_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}/sessions");
    let (s, session) = srv.post(&base, json!({"env": {"GREETING": "hi"}})).await;
    assert_eq!(s, 200, "{session}");
    assert_eq!(session["alive"], true);
    let sid = session["id"].as_str().unwrap().to_string();
    let (s, r) = srv
        .post(
            &format!("{base}/{sid}/run"),
            json!({"command": "mkdir -p /tmp/s && cd /tmp/s && export X=42"}),
        )
        .await;
    assert_eq!((s, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let (_, r) = srv
        .post(
            &format!("{base}/{sid}/run"),
            json!({"command": "pwd; echo $X $GREETING; false"}),
        )
        .await;
    assert_eq!(r["stdout"]["data"], "/tmp/s\n42 hi\n", "{r}");
    assert_eq!(
        (r["exit_code"].as_i64(), r["session_alive"].as_bool()),
        (Some(1), Some(true))
    );
    let (s, list) = srv.get(&base).await;
    assert_eq!(s, 200);
    assert_eq!(list["sessions"][0]["id"], sid.as_str());
    let (_, one) = srv.get(&format!("{base}/{sid}")).await;
    assert_eq!(one["commands"], 2);
    let (s, _) = srv.delete(&format!("{base}/{sid}")).await;
    assert_eq!(s, 200);
    let (s, e) = srv.get(&format!("{base}/{sid}")).await;
    assert_eq!((s, e["code"].as_str()), (404, Some("not_found")));
    srv.finish().await;
}

/// Bytes that are not text and not repetitive.
pub fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_agent_access_answers_what_the_proxy_answers() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}");
    let agent = direct_client(&srv, &id).await;

    let req = ExecRequest {
        command: Command::Shell("echo $((40+2)); cat /etc/hostname >&2; exit 4".into()),
        ..Default::default()
    };
    let direct = agent.exec(&req).await.unwrap();
    let (s, proxied) = srv
        .post(&format!("{base}/exec"), serde_json::to_value(&req).unwrap())
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        proxied["exit_code"].as_i64(),
        direct.exit_code.map(i64::from)
    );
    assert_eq!(
        proxied["stdout"],
        serde_json::to_value(&direct.stdout).unwrap()
    );
    assert_eq!(
        proxied["stderr"],
        serde_json::to_value(&direct.stderr).unwrap()
    );
    assert_eq!(direct.stdout.data, "42\n");

    // Written through the proxy, read directly, and the other way round.
    let (s, _) = send(
        srv.req(
            reqwest::Method::PUT,
            &format!("{base}/files?path=/tmp/x.bin"),
        )
        .body(noise(70_000)),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        agent.read_file("/tmp/x.bin").await.unwrap().to_vec(),
        noise(70_000)
    );
    agent
        .write_file("/tmp/y.txt", b"direct\n".to_vec(), None)
        .await
        .unwrap();
    let (_, y) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{base}/files?path=/tmp/y.txt"),
    ))
    .await;
    assert_eq!(y, b"direct\n");

    let (_, stat) = srv.get(&format!("{base}/files/stat?path=/tmp/x.bin")).await;
    assert_eq!(
        stat,
        serde_json::to_value(agent.stat("/tmp/x.bin").await.unwrap()).unwrap()
    );
    let (_, list) = srv.get(&format!("{base}/files/list?path=/etc")).await;
    assert_eq!(
        list,
        serde_json::to_value(agent.list_dir("/etc", 1).await.unwrap()).unwrap()
    );
    let (_, procs) = srv.get(&format!("{base}/processes")).await;
    assert_eq!(
        procs,
        serde_json::to_value(agent.list_processes().await.unwrap()).unwrap()
    );
    // The same error, too.
    let (s, e) = srv.get(&format!("{base}/files/stat?path=/nope")).await;
    let err = agent.stat("/nope").await.unwrap_err();
    assert_eq!(s, 404);
    assert_eq!(e["code"].as_str(), err.code().map(|c| c.as_str()));
    // The token is the sandbox's own: another one is refused by the agent.
    let wrong = agent.with_token("not-the-token");
    assert!(matches!(
        wrong.stat("/etc").await,
        Err(orchard_client::ClientError::Api { status, .. }) if status == 401
    ));
    srv.finish().await;
}
