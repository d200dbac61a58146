//! The `/v1/` routes over a real server: the sandbox lifecycle, every agent route of a
//! sandbox as proxied at `/v1/sandboxes/{id}/...` (exec and its NDJSON stream,
//! processes, sessions, terminals over WebSocket, files raw and as archives, git),
//! direct access to the agent with the endpoint and token a sandbox answers, and the
//! Orchard-compatible terminal WebSocket with its auth and close codes.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orchard_client::{AgentClient, Endpoint};
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::{Command, ExecRequest};
use orchard_test_support::tar_gz;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use crate::util::server::{send, TestServer, KEY, OTHER_KEY};

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
async fn read_until(ws: &mut Ws, needle: &str) -> String {
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
async fn bytes(req: reqwest::RequestBuilder) -> (u16, Vec<u8>) {
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
    let (_, list) = srv.get("/v1/sandboxes").await;
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_attach_type_resize_detach_and_reattach_with_scrollback() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}/pty");
    let (s, pty) = srv
        .post(
            &base,
            json!({"command": ["sh"], "rows": 24, "cols": 80, "env": {"PS1": "$ "}}),
        )
        .await;
    assert_eq!(s, 200, "{pty}");
    assert_eq!(
        (pty["rows"].as_u64(), pty["alive"].as_bool()),
        (Some(24), Some(true))
    );
    let tid = pty["id"].as_str().unwrap().to_string();
    let attach = format!("{base}/{tid}/attach");

    let (mut ws, _) = ws_connect(&srv, &attach, &[("X-API-Key", KEY)]).await;
    let hello = next_json(&mut ws).await;
    assert_eq!(
        (hello["type"].as_str(), hello["pty"]["id"].as_str()),
        (Some("attached"), Some(tid.as_str())),
        "{hello}"
    );
    send_json(
        &mut ws,
        json!({"type": "stdin", "data": b64_encode(b"echo mark-$((6*7))\n")}),
    )
    .await;
    read_until(&mut ws, "mark-42").await;
    // A resize frame, seen by the program itself.
    send_json(&mut ws, json!({"type": "resize", "rows": 40, "cols": 100})).await;
    send_json(
        &mut ws,
        json!({"type": "stdin", "data": b64_encode(b"stty size\n")}),
    )
    .await;
    read_until(&mut ws, "40 100").await;
    // Detach: the agent closes this viewer, the terminal keeps running.
    send_json(&mut ws, json!({"type": "detach"})).await;
    close_code(&mut ws).await;
    let (s, info) = srv.get(&format!("{base}/{tid}")).await;
    assert_eq!(
        (s, info["alive"].as_bool(), info["rows"].as_u64()),
        (200, Some(true), Some(40)),
        "{info}"
    );
    // Resize over HTTP.
    let (s, info) = srv
        .post(
            &format!("{base}/{tid}/resize"),
            json!({"rows": 30, "cols": 90}),
        )
        .await;
    assert_eq!(
        (s, info["rows"].as_u64(), info["cols"].as_u64()),
        (200, Some(30), Some(90)),
        "{info}"
    );
    let (_, listed) = srv.get(&base).await;
    assert_eq!(listed["ptys"][0]["id"], tid.as_str());

    // Re-attach: the scrollback replays what was typed and printed.
    let (mut ws, _) = ws_connect(&srv, &attach, &[("X-API-Key", KEY)]).await;
    assert_eq!(next_json(&mut ws).await["type"], "attached");
    let replay = next_json(&mut ws).await;
    assert_eq!(
        (replay["type"].as_str(), replay["replay"].as_bool()),
        (Some("output"), Some(true)),
        "{replay}"
    );
    let text =
        String::from_utf8_lossy(&b64_decode(replay["data"].as_str().unwrap()).unwrap()).to_string();
    assert!(
        text.contains("mark-42") && text.contains("40 100"),
        "{text:?}"
    );
    send_json(
        &mut ws,
        json!({"type": "stdin", "data": b64_encode(b"exit 3\n")}),
    )
    .await;
    let exit = loop {
        let f = next_json(&mut ws).await;
        if f["type"] == "exit" {
            break f;
        }
        assert_eq!(f["type"], "output", "{f}");
    };
    assert_eq!(exit["code"], 3, "{exit}");
    close_code(&mut ws).await;
    let (s, gone) = srv.delete(&format!("{base}/{tid}")).await;
    assert_eq!((s, gone["alive"].as_bool()), (200, Some(false)), "{gone}");
    srv.finish().await;
}

/// Bytes that are not text and not repetitive.
fn noise(n: usize) -> Vec<u8> {
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
async fn files_raw_stat_list_mkdir_move_delete_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let f = format!("/v1/sandboxes/{id}/files");
    let big = noise(3 << 20);
    let (s, put) = send(
        srv.req(reqwest::Method::PUT, &format!("{f}?path=/tmp/up/big.bin"))
            .header("content-type", "application/octet-stream")
            .body(big.clone()),
    )
    .await;
    assert_eq!(s, 200, "{put}");
    assert_eq!(put, json!({"path": "/tmp/up/big.bin", "size": 3 << 20}));
    let (s, back) =
        bytes(srv.req(reqwest::Method::GET, &format!("{f}?path=/tmp/up/big.bin"))).await;
    assert_eq!(s, 200);
    assert!(
        back == big,
        "3 MiB came back altered ({} bytes)",
        back.len()
    );
    let (s, part) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{f}?path=/tmp/up/big.bin&offset=1000&length=24"),
    ))
    .await;
    assert_eq!((s, part.as_slice()), (200, &big[1000..1024]));

    let (s, st) = srv.get(&format!("{f}/stat?path=/tmp/up/big.bin")).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        (
            st["kind"].as_str(),
            st["size"].as_u64(),
            st["name"].as_str()
        ),
        (Some("file"), Some(3 << 20), Some("big.bin"))
    );
    let (s, d) = srv
        .post(&format!("{f}/mkdir"), json!({"path": "/tmp/d/e"}))
        .await;
    assert_eq!((s, d), (200, json!({"path": "/tmp/d/e"})));
    let (s, m) = srv
        .post(
            &format!("{f}/move"),
            json!({"from": "/tmp/up/big.bin", "to": "/tmp/d/e/moved.bin"}),
        )
        .await;
    assert_eq!(s, 200, "{m}");
    let (s, e) = srv.get(&format!("{f}/stat?path=/tmp/up/big.bin")).await;
    assert_eq!((s, e["code"].as_str()), (404, Some("not_found")));
    let (s, list) = srv.get(&format!("{f}/list?path=/tmp/d&depth=2")).await;
    assert_eq!(s, 200, "{list}");
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/tmp/d/e", "/tmp/d/e/moved.bin"]);
    // A non-empty directory needs `recursive`.
    let (s, e) = srv.delete(&format!("{f}?path=/tmp/d")).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (409, Some("directory_not_empty")),
        "{e}"
    );
    let (s, _) = srv.delete(&format!("{f}?path=/tmp/d&recursive=true")).await;
    assert_eq!(s, 200);
    let (s, _) = srv.get(&format!("{f}/stat?path=/tmp/d")).await;
    assert_eq!(s, 404);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_upload_and_download_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let f = format!("/v1/sandboxes/{id}/files");
    let blob = noise(200_000);
    let archive = tar_gz(&[
        ("a.txt", b"alpha\n"),
        ("sub/b.txt", b"beta\n"),
        ("sub/blob.bin", &blob),
    ]);
    let (s, up) = send(
        srv.req(reqwest::Method::PUT, &format!("{f}/archive?path=/tmp/arch"))
            .header("content-type", "application/gzip")
            .body(archive),
    )
    .await;
    assert_eq!(s, 200, "{up}");
    assert_eq!(up["path"], "/tmp/arch");
    assert_eq!(up["bytes"], 6 + 5 + 200_000, "{up}");
    let (s, b) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{f}?path=/tmp/arch/sub/b.txt"),
    ))
    .await;
    assert_eq!((s, b.as_slice()), (200, b"beta\n".as_slice()));

    let (s, down) =
        bytes(srv.req(reqwest::Method::GET, &format!("{f}/archive?path=/tmp/arch"))).await;
    assert_eq!(s, 200);
    assert_eq!(&down[..2], &[0x1f, 0x8b], "gzip");
    let mut files = std::collections::BTreeMap::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(down.as_slice()));
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let path = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(
                path.trim_start_matches("./")
                    .trim_start_matches("arch/")
                    .to_string(),
                data,
            );
        }
    }
    assert_eq!(files.len(), 3, "{:?}", files.keys().collect::<Vec<_>>());
    assert_eq!(files["a.txt"], b"alpha\n");
    assert_eq!(files["sub/b.txt"], b"beta\n");
    assert!(files["sub/blob.bin"] == blob);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_status_commit_diff_reset_apply_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}");
    // busybox has no git: a repository is a few files, made with exec.
    let (s, r) = srv
        .post(
            &format!("{base}/exec"),
            json!({"command": "mkdir -p /repo/.git/objects /repo/.git/refs/heads && cd /repo/.git && echo 'ref: refs/heads/main' > HEAD && printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n' > config"}),
        )
        .await;
    assert_eq!((s, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let put = |path: &str, body: &'static str| {
        srv.req(
            reqwest::Method::PUT,
            &format!("{base}/files?path=/repo/{path}"),
        )
        .body(body)
    };
    assert_eq!(send(put("a.txt", "one\ntwo\nthree\n")).await.0, 200);
    assert_eq!(send(put("dir/b.txt", "bee\n")).await.0, 200);
    let repo = json!({"repo": "/repo"});
    let (s, st) = srv.post(&format!("{base}/git/status"), repo.clone()).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        (st["branch"].as_str(), &st["head"], st["clean"].as_bool()),
        (Some("main"), &Value::Null, Some(false))
    );
    let untracked: Vec<(&str, &str)> = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        untracked,
        [("a.txt", "untracked"), ("dir/b.txt", "untracked")]
    );

    let (s, c) = srv
        .post(
            &format!("{base}/git/commit"),
            json!({"repo": "/repo", "message": "initial"}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["files_changed"], 2);
    let first = c["commit"].as_str().unwrap().to_string();
    let (_, st) = srv.post(&format!("{base}/git/status"), repo.clone()).await;
    assert_eq!(
        (st["head"].as_str(), st["clean"].as_bool()),
        (Some(first.as_str()), Some(true)),
        "{st}"
    );

    // Modify, diff, reset (the change is gone), apply the diff (it is back).
    assert_eq!(send(put("a.txt", "one\nTWO\nthree\n")).await.0, 200);
    assert_eq!(send(put("new.txt", "fresh\n")).await.0, 200);
    let (s, diff) = srv.post(&format!("{base}/git/diff"), repo.clone()).await;
    assert_eq!(s, 200, "{diff}");
    assert_eq!(
        (
            diff["files_changed"].as_u64(),
            diff["insertions"].as_u64(),
            diff["deletions"].as_u64()
        ),
        (Some(2), Some(2), Some(1))
    );
    let patch = diff["patch"].as_str().unwrap().to_string();
    assert!(
        patch.contains("-two\n+TWO\n") && patch.contains("+fresh\n"),
        "{patch}"
    );
    let (s, reset) = srv.post(&format!("{base}/git/reset"), repo.clone()).await;
    assert_eq!(s, 200, "{reset}");
    assert_eq!(reset["head"], first.as_str());
    assert_eq!(reset["removed"], json!(["new.txt"]));
    let (_, a) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{base}/files?path=/repo/a.txt"),
    ))
    .await;
    assert_eq!(a, b"one\ntwo\nthree\n");
    let (s, applied) = srv
        .post(
            &format!("{base}/git/apply"),
            json!({"repo": "/repo", "patch": patch}),
        )
        .await;
    assert_eq!(s, 200, "{applied}");
    assert_eq!(
        (applied["applied"].as_bool(), &applied["files"]),
        (Some(true), &json!(["a.txt", "new.txt"]))
    );
    let (_, a) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{base}/files?path=/repo/a.txt"),
    ))
    .await;
    assert_eq!(a, b"one\nTWO\nthree\n");
    // Applying it again conflicts and writes nothing.
    let (s, again) = srv
        .post(
            &format!("{base}/git/apply"),
            json!({"repo": "/repo", "patch": patch}),
        )
        .await;
    assert_eq!(
        (s, again["applied"].as_bool()),
        (200, Some(false)),
        "{again}"
    );
    assert!(!again["conflicts"].as_array().unwrap().is_empty());
    let (_, st) = srv.post(&format!("{base}/git/status"), repo).await;
    let changed: Vec<(&str, &str)> = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(changed, [("a.txt", "modified"), ("new.txt", "untracked")]);
    srv.finish().await;
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

/// The compatible init frame for `sh`.
fn init_sh() -> Value {
    json!({"type": "init", "cmd": ["sh"], "env": {}, "cwd": "/", "rows": 24, "cols": 80, "login_shell": false})
}

/// Runs `echo hi` then `exit` on a compatible terminal; asserts the frames.
async fn compat_echo_hi(ws: &mut Ws) {
    send_json(ws, init_sh()).await;
    let ready = next_json(ws).await;
    assert_eq!(ready["type"], "ready", "{ready}");
    assert!(ready["pid"].as_u64().is_some_and(|p| p > 0));
    send_json(
        ws,
        json!({"type": "stdin", "data": b64_encode(b"echo hi\n")}),
    )
    .await;
    send_json(ws, json!({"type": "stdin", "data": b64_encode(b"exit\n")})).await;
    let mut out = String::new();
    loop {
        let f = next_json(ws).await;
        match f["type"].as_str() {
            Some("stdout") => out.push_str(&String::from_utf8_lossy(
                &b64_decode(f["data"].as_str().unwrap()).unwrap(),
            )),
            Some("exit") => {
                assert_eq!(f, json!({"type": "exit", "code": 0}));
                break;
            }
            _ => panic!("unexpected frame {f}"),
        }
    }
    assert!(out.contains("hi\r\n"), "{out:?}");
    close_code(ws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compatible_terminal_websocket_auth_frames_and_close_codes() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let path = format!("/sandboxes/{id}/exec/pty");

    let (mut ws, _) = ws_connect(&srv, &format!("{path}?api_key={KEY}"), &[]).await;
    compat_echo_hi(&mut ws).await;

    let proto = format!("api_key.{KEY}");
    let (mut ws, resp) = ws_connect(&srv, &path, &[("Sec-WebSocket-Protocol", &proto)]).await;
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        proto.as_str(),
        "the subprotocol is chosen"
    );
    compat_echo_hi(&mut ws).await;

    // Wrong keys: 4401, by query and by subprotocol; no key at all, too.
    let (mut ws, _) = ws_connect(&srv, &format!("{path}?api_key=wrong"), &[]).await;
    assert_eq!(close_code(&mut ws).await, Some(4401));
    let (mut ws, _) = ws_connect(&srv, &path, &[("Sec-WebSocket-Protocol", "api_key.wrong")]).await;
    assert_eq!(close_code(&mut ws).await, Some(4401));
    let (mut ws, _) = ws_connect(&srv, &path, &[]).await;
    assert_eq!(close_code(&mut ws).await, Some(4401));
    // Unknown sandbox, and another tenant's: 4404.
    let (mut ws, _) = ws_connect(
        &srv,
        &format!("/sandboxes/nope-1/exec/pty?api_key={KEY}"),
        &[],
    )
    .await;
    assert_eq!(close_code(&mut ws).await, Some(4404));
    let (mut ws, _) = ws_connect(&srv, &format!("{path}?api_key={OTHER_KEY}"), &[]).await;
    assert_eq!(close_code(&mut ws).await, Some(4404));
    // A first frame that is not `init`: 4400, from the agent through the bridge.
    let (mut ws, _) = ws_connect(&srv, &format!("{path}?api_key={KEY}"), &[]).await;
    send_json(&mut ws, json!({"type": "stdin", "data": "aGk="})).await;
    assert_eq!(close_code(&mut ws).await, Some(4400));
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_terminal_attach_takes_the_key_as_a_query_or_a_subprotocol() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}/pty");
    let (s, pty) = srv.post(&base, json!({"command": ["sh"]})).await;
    assert_eq!(s, 200, "{pty}");
    let attach = format!("{base}/{}/attach", pty["id"].as_str().unwrap());
    // A browser cannot set X-API-Key on a WebSocket: `?api_key=` ...
    let (mut ws, _) = ws_connect(&srv, &format!("{attach}?api_key={KEY}"), &[]).await;
    assert_eq!(next_json(&mut ws).await["type"], "attached");
    drop(ws);
    // ... or the `api_key.<key>` subprotocol, which the handshake names back.
    let (mut ws, resp) = ws_connect(
        &srv,
        &attach,
        &[("Sec-WebSocket-Protocol", &format!("api_key.{KEY}"))],
    )
    .await;
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        format!("api_key.{KEY}").as_str()
    );
    assert_eq!(next_json(&mut ws).await["type"], "attached");
    drop(ws);
    // A wrong key is still refused before any upgrade.
    let url = format!(
        "{}{attach}?api_key=wrong",
        srv.url.replacen("http://", "ws://", 1)
    );
    let e = tokio_tungstenite::connect_async(url).await.unwrap_err();
    assert!(e.to_string().contains("401"), "{e}");
    srv.finish().await;
}
