//! Every agent route of a sandbox at `/v1/sandboxes/{id}/<rest>`: the request is
//! forwarded to the agent's `/v1/<rest>` with the sandbox token instead of the API key,
//! bodies streamed both ways (uploads and downloads of any size, NDJSON exec streams),
//! over the service's pool of keep-alive connections to agents (`orchard_client::Pool`,
//! shared with the compatible jobs). WebSocket upgrades
//! (terminal attach) are bridged frame by frame, close codes included.

use std::time::Instant;

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use orchard_client::pool::{dial, AgentStream};
use orchard_client::PoolBody;
use orchard_protocol::TOKEN_HEADER;
use tokio_tungstenite::tungstenite;

use super::body::{read_limited, MAX_JSON};
use super::extract::{is_websocket, ws_key, ApiPath, Auth, MAX_WS_MESSAGE};
use super::state::AppState;
use crate::service::files::agent_unreachable;
use crate::service::{Error, Live};

/// `body` as the agent pool sends it.
fn pool_body(body: Body) -> PoolBody {
    body.map_err(Into::into).boxed_unsync()
}

/// The agent route the proxy refuses: `PUT /v1/token` (the server's to use).
pub const NOT_PROXIED: &str = "token";

/// The proxy route.
pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/sandboxes/{id}/{*rest}", any(forward))
}

/// Request headers that belong to one hop (and the caller's credentials).
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "host",
    "x-api-key",
    "authorization",
];

async fn forward(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath((id, rest)): ApiPath<(String, String)>,
    req: Request,
) -> Result<Response, Error> {
    let live = state.service.ready(&tenant, &id).await?;
    if rest.trim_end_matches('/') == NOT_PROXIED {
        // The server keeps the sandbox's token; changing it under the server would cut
        // the sandbox off from its jobs, proxy and adoption.
        return Err(Error::Forbidden(
            "the sandbox's agent token is managed by the server".into(),
        ));
    }
    let agent_path = format!("/v1/{rest}");
    let (mut parts, body) = req.into_parts();
    if is_websocket(&parts.headers) {
        let (_, protocol) = ws_key(&parts.headers, parts.uri.query());
        let mut ws = WebSocketUpgrade::from_request_parts(&mut parts, &state)
            .await
            .map_err(|e| Error::BadRequest(format!("bad WebSocket upgrade: {}", e.body_text())))?
            .max_message_size(MAX_WS_MESSAGE)
            .max_frame_size(MAX_WS_MESSAGE);
        if let Some(p) = protocol {
            // The client offered its key as a subprotocol; the handshake names it back.
            ws = ws.protocols([p]);
        }
        // The caller's key stays here: the agent has its own token.
        let query: Vec<String> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("api_key="))
            .map(str::to_string)
            .collect();
        let path = if query.is_empty() {
            agent_path
        } else {
            format!("{agent_path}?{}", query.join("&"))
        };
        return Ok(ws.on_upgrade(move |socket| async move { bridge(socket, &live, &path).await }));
    }
    let uri = match parts.uri.query() {
        Some(q) => live.agent.uri(&format!("{agent_path}?{q}")),
        None => live.agent.uri(&agent_path),
    };
    // The agent answers a body over its limit (16 MiB of JSON, as ours) before reading
    // it and closes, which breaks the forwarding of the rest: a 502 instead of its 413.
    // JSON bodies are small, so they are read here with our limit and forwarded whole;
    // raw uploads (PUT) stream.
    let body = if parts.method == Method::PUT {
        body
    } else {
        Body::from(read_limited(&parts.headers, body, MAX_JSON).await?)
    };
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(pool_body(body))
        .map_err(|e| Error::BadRequest(format!("cannot forward this request: {e}")))?;
    for (name, value) in &parts.headers {
        if !HOP.contains(&name.as_str()) {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    let started = Instant::now();
    let resp = live.agent.forward(out).await.map_err(agent_unreachable)?;
    if rest == "exec" {
        state
            .service
            .metrics()
            .exec_v1_seconds
            .observe(started.elapsed().as_secs_f64());
    }
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)).into_response())
}

fn to_agent(m: Message) -> Option<tungstenite::Message> {
    Some(match m {
        Message::Text(t) => tungstenite::Message::Text(t.as_str().into()),
        Message::Binary(b) => tungstenite::Message::Binary(b),
        Message::Ping(b) => tungstenite::Message::Ping(b),
        // Answers to our keep-alive pings: the agent never asked.
        Message::Pong(_) => return None,
        Message::Close(c) => {
            tungstenite::Message::Close(c.map(|c| tungstenite::protocol::CloseFrame {
                code: c.code.into(),
                reason: c.reason.as_str().into(),
            }))
        }
    })
}

fn from_agent(m: tungstenite::Message) -> Option<Message> {
    Some(match m {
        tungstenite::Message::Text(t) => Message::Text(t.as_str().into()),
        tungstenite::Message::Binary(b) => Message::Binary(b),
        tungstenite::Message::Ping(b) => Message::Ping(b),
        tungstenite::Message::Pong(b) => Message::Pong(b),
        tungstenite::Message::Close(c) => Message::Close(c.map(|c| CloseFrame {
            code: c.code.into(),
            reason: c.reason.as_str().into(),
        })),
        tungstenite::Message::Frame(_) => return None,
    })
}

/// How often a bridged WebSocket pings its client: well under the 60 s idle timeout
/// common in load balancers.
pub const WS_PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);

/// How long a client gets to answer our Close frame with its own.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Sends a Close frame with `code`, then completes the closing handshake: reads (and
/// drops) what the client still sends until its own Close, for [`CLOSE_WAIT`] at most.
/// Dropping the connection right after our Close would make the kernel answer the
/// client's next frame (an init frame sent right after connecting) with a reset, and a
/// reset client loses the close code: websocket-client, used by Orchard's sync SDK,
/// then reports a broken pipe instead of 4401.
pub async fn close_gracefully(mut socket: WebSocket, code: u16, reason: String) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    if socket.send(Message::Close(Some(frame))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(m)) = socket.recv().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// Bridges a client WebSocket to the agent's WebSocket at `path`. A Close from the
/// agent (its close code) is passed on, and the client's answer still read, so the
/// closing handshake completes on both sides.
pub async fn bridge(client: WebSocket, live: &Live, path: &str) {
    let agent = match connect_agent(live, path).await {
        Ok(a) => a,
        Err(e) => {
            let reason = format!("the sandbox's agent could not be reached: {e}");
            return close_gracefully(client, 1011, reason).await;
        }
    };
    let (mut agent_tx, mut agent_rx) = agent.split();
    let (mut client_tx, mut client_rx) = client.split();
    let up = async {
        let mut agent_open = true;
        while let Some(Ok(m)) = client_rx.next().await {
            let closing = matches!(m, Message::Close(_));
            if agent_open {
                if let Some(m) = to_agent(m) {
                    if agent_tx.send(m).await.is_err() {
                        agent_open = false;
                    }
                }
            }
            if closing {
                break;
            }
        }
        let _ = agent_tx.close().await;
    };
    let down = async {
        // Pings keep a quiet terminal (a model thinking for minutes) from looking idle to
        // the load balancers and proxies between client and server, which close idle
        // connections (60 s is common); clients answer them on their own.
        let mut ping = tokio::time::interval_at(
            tokio::time::Instant::now() + WS_PING_INTERVAL,
            WS_PING_INTERVAL,
        );
        loop {
            let m = tokio::select! {
                m = agent_rx.next() => m,
                _ = ping.tick() => {
                    if client_tx.send(Message::Ping(Default::default())).await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let Some(Ok(m)) = m else { break };
            let closing = matches!(m, tungstenite::Message::Close(_));
            if let Some(m) = from_agent(m) {
                if client_tx.send(m).await.is_err() {
                    break;
                }
            }
            if closing {
                break;
            }
        }
        let _ = client_tx.close().await;
    };
    // When one side ends, the other gets a moment to deliver what is in flight (the
    // program's last output and exit frame, the client's close) before both go.
    tokio::pin!(up, down);
    tokio::select! {
        _ = &mut up => {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut down).await;
        }
        _ = &mut down => {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut up).await;
        }
    }
}

type AgentSocket = tokio_tungstenite::WebSocketStream<AgentStream>;

async fn connect_agent(live: &Live, path: &str) -> Result<AgentSocket, String> {
    let stream = dial(live.agent.endpoint())
        .await
        .map_err(|e| e.to_string())?;
    let mut req =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://agent{path}"))
            .map_err(|e| e.to_string())?;
    let token = HeaderValue::from_str(live.agent.token()).map_err(|e| e.to_string())?;
    req.headers_mut()
        .insert(HeaderName::from_static(TOKEN_HEADER), token);
    let (ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ws)
}
