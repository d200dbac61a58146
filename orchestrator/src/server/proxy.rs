//! Every agent route of a sandbox at `/v1/sandboxes/{id}/<rest>`: the request is
//! forwarded to the agent's `/v1/<rest>` with the sandbox token instead of the API key,
//! bodies streamed both ways (uploads and downloads of any size, NDJSON exec streams),
//! over pooled keep-alive connections to the agent's socket. WebSocket upgrades
//! (terminal attach) are bridged frame by frame, close codes included.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use orchard_client::Endpoint;
use orchard_protocol::TOKEN_HEADER;
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite;

use super::{ApiPath, AppState, Auth};
use crate::service::{Error, Live};

/// Connects to an agent by the host name the proxy gave its endpoint.
#[derive(Clone, Default)]
pub struct Connector {
    endpoints: Arc<Mutex<HashMap<String, Endpoint>>>,
}

/// A connection to an agent, over its Unix socket or TCP.
pub enum AgentStream {
    /// The local backend's socket.
    Unix(TokioIo<tokio::net::UnixStream>),
    /// A pod's IP.
    Tcp(TokioIo<tokio::net::TcpStream>),
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            AgentStream::Unix($s) => {
                let $s = Pin::new($s);
                $e
            }
            AgentStream::Tcp($s) => {
                let $s = Pin::new($s);
                $e
            }
        }
    };
}

impl hyper::rt::Read for AgentStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        both!(self, s => s.poll_read(cx, buf))
    }
}

impl hyper::rt::Write for AgentStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        both!(self, s => s.poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        both!(self, s => s.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        both!(self, s => s.poll_shutdown(cx))
    }
}

impl hyper_util::client::legacy::connect::Connection for AgentStream {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<AgentStream, std::io::Error>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = AgentStream;
    type Error = std::io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let endpoint = uri.host().and_then(|h| {
            self.endpoints
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(h)
                .cloned()
        });
        Box::pin(async move {
            match endpoint {
                Some(Endpoint::Unix(path)) => Ok(AgentStream::Unix(TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))),
                Some(Endpoint::Tcp(addr)) => {
                    let tcp = tokio::net::TcpStream::connect(addr).await?;
                    // Small request/answer pairs: no Nagle delay.
                    tcp.set_nodelay(true)?;
                    Ok(AgentStream::Tcp(TokioIo::new(tcp)))
                }
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "unknown agent endpoint",
                )),
            }
        })
    }
}

/// The pooled client of every agent.
#[derive(Clone)]
pub struct AgentProxy {
    connector: Connector,
    client: Client<Connector, Body>,
}

impl Default for AgentProxy {
    fn default() -> Self {
        let connector = Connector::default();
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build(connector.clone());
        AgentProxy { connector, client }
    }
}

impl AgentProxy {
    /// The host name that routes to `endpoint` (a digest, so it is a valid host).
    fn host(&self, endpoint: &Endpoint) -> String {
        let key = match endpoint {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Tcp(a) => a.to_string(),
        };
        let host = format!("a{}", hex::encode(&Sha256::digest(key.as_bytes())[..8]));
        self.connector
            .endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(host.clone())
            .or_insert_with(|| endpoint.clone());
        host
    }
}

impl AgentProxy {
    /// `PUT /v1/files?path=` on the sandbox's agent with a streamed body: the file is
    /// written atomically by the agent, never held whole here.
    pub async fn put_file(&self, live: &Live, path: &str, body: Body) -> Result<(), Error> {
        let host = self.host(live.agent.endpoint());
        let uri = format!(
            "http://{host}/v1/files?path={}",
            orchard_client::encode(path)
        );
        let mut req = Request::builder()
            .method(Method::PUT)
            .uri(uri)
            .header("content-type", "application/octet-stream")
            .body(body)
            .map_err(|e| Error::BadRequest(format!("cannot send this file: {e}")))?;
        if let Ok(token) = HeaderValue::from_str(live.agent.token()) {
            req.headers_mut()
                .insert(HeaderName::from_static(TOKEN_HEADER), token);
        }
        let resp = self.client.request(req).await.map_err(|e| {
            Error::Sandbox(format!("the sandbox's agent could not be reached: {e}"))
        })?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), 1 << 20)
            .collect()
            .await
            .map_err(|e| Error::Sandbox(format!("the sandbox's agent failed mid-answer: {e}")))?
            .to_bytes();
        if status.is_success() {
            return Ok(());
        }
        Err(match serde_json::from_slice(&body) {
            Ok(body) => orchard_client::ClientError::Api { status, body }.into(),
            Err(_) => Error::Sandbox(format!("the sandbox's agent answered {status}")),
        })
    }
}

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
    let agent_path = format!("/v1/{rest}");
    let (mut parts, body) = req.into_parts();
    if super::is_websocket(&parts.headers) {
        let (_, protocol) = super::compat::ws_key(&parts.headers, parts.uri.query());
        let mut ws = WebSocketUpgrade::from_request_parts(&mut parts, &state)
            .await
            .map_err(|e| Error::BadRequest(format!("bad WebSocket upgrade: {}", e.body_text())))?;
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
    let endpoint = live.agent.endpoint().clone();
    let host = state.proxy.host(&endpoint);
    let uri = match parts.uri.query() {
        Some(q) => format!("http://{host}{agent_path}?{q}"),
        None => format!("http://{host}{agent_path}"),
    };
    // The agent answers a body over its limit (16 MiB of JSON, as ours) before reading
    // it and closes, which breaks the forwarding of the rest: a 502 instead of its 413.
    // JSON bodies are small, so they are read here with our limit and forwarded whole;
    // raw uploads (PUT) stream.
    let body = if parts.method == Method::PUT {
        body
    } else {
        Body::from(super::read_limited(&parts.headers, body, super::MAX_JSON).await?)
    };
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(body)
        .map_err(|e| Error::BadRequest(format!("cannot forward this request: {e}")))?;
    for (name, value) in &parts.headers {
        if !HOP.contains(&name.as_str()) {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    if let Ok(token) = HeaderValue::from_str(live.agent.token()) {
        out.headers_mut()
            .insert(HeaderName::from_static(TOKEN_HEADER), token);
    }
    let started = Instant::now();
    let resp =
        state.proxy.client.request(out).await.map_err(|e| {
            Error::Sandbox(format!("the sandbox's agent could not be reached: {e}"))
        })?;
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

/// A connection to an agent: a Unix socket (local backend) or TCP (a pod's IP).
trait AgentIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AgentIo for T {}

type AgentSocket = tokio_tungstenite::WebSocketStream<Box<dyn AgentIo>>;

async fn connect_agent(live: &Live, path: &str) -> Result<AgentSocket, String> {
    let stream: Box<dyn AgentIo> = match live.agent.endpoint() {
        Endpoint::Unix(socket) => Box::new(
            tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| e.to_string())?,
        ),
        Endpoint::Tcp(addr) => {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            // Keystrokes go out at once.
            let _ = tcp.set_nodelay(true);
            Box::new(tcp)
        }
    };
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
