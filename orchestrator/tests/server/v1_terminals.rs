//! Terminals over WebSocket: the agent's terminals attached through the proxy
//! (`/v1/sandboxes/{id}/pty/...`), and the Orchard-compatible terminal
//! (`/sandboxes/{id}/exec/pty`) with its auth and close codes.

use orchard_protocol::output::{b64_decode, b64_encode};
use serde_json::{json, Value};

use super::v1_routes::{close_code, next_json, read_until, send_json, ws_connect, Ws};
use crate::util::server::{TestServer, KEY, OTHER_KEY};

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
