//! HTTP transport: shared state, the router, token auth, JSON bodies with limits, and
//! the listeners. Handlers live in their capability's module (`exec`, `process`,
//! `files`, `health`); this module only wires them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, BodyDataStream};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use orchard_protocol::{ErrorCode, TOKEN_HEADER};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::error::ApiError;
use crate::process::ProcessTable;
use crate::pty::PtyTable;
use crate::reaper::Reaper;
use crate::session::SessionTable;

/// State shared by every handler.
pub struct AppState {
    /// Configuration and limits.
    pub config: Config,
    /// When the agent started.
    pub started: Instant,
    /// The one owner of `waitpid`.
    pub reaper: Arc<Reaper>,
    /// One permit per running command (sync, streamed or background).
    pub exec_slots: Arc<Semaphore>,
    /// Background processes.
    pub processes: ProcessTable,
    /// Persistent shell sessions.
    pub sessions: SessionTable,
    /// Terminals.
    pub ptys: PtyTable,
    /// Set once shutdown began; new work is refused.
    pub shutting_down: AtomicBool,
}

impl AppState {
    /// State for `config`, reaping through `reaper`.
    pub fn new(config: Config, reaper: Arc<Reaper>) -> Arc<Self> {
        let slots = config.limits.max_concurrent_execs as usize;
        Arc::new(Self {
            processes: ProcessTable::new(&config),
            sessions: SessionTable::default(),
            ptys: PtyTable::default(),
            config,
            started: Instant::now(),
            reaper,
            exec_slots: Arc::new(Semaphore::new(slots)),
            shutting_down: AtomicBool::new(false),
        })
    }
}

/// A JSON request body, read up to the body limit and parsed into `T`; failures are
/// answered as `body_too_large` or `invalid_json` with serde's description.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let limit = state.config.limits.max_body_bytes;
        let bytes = read_limited(req, limit).await?;
        // serde's derived structs also accept a JSON array, filling fields by position;
        // every request body of ours is an object.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::new(
                ErrorCode::InvalidJson,
                "invalid request body: expected a JSON object",
            ));
        }
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::new(ErrorCode::InvalidJson, format!("invalid request body: {e}"))
        })
    }
}

/// Reads a whole body, refusing more than `limit` bytes.
pub async fn read_limited(req: Request, limit: u64) -> Result<bytes::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("request body is larger than the limit of {limit} bytes"),
        )
    };
    if content_length(req.headers()).is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(req.into_body(), limit as usize);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(_) => Err(ApiError::invalid("the request body could not be read")),
    }
}

/// The Content-Length header, when present and valid.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

async fn require_token(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .or_else(|| {
            req.headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        });
    let ok = given.is_some_and(|t| constant_time_eq(t, state.config.token.as_bytes()));
    if !ok {
        return ApiError::new(
            ErrorCode::Unauthorized,
            format!("missing or wrong token: send it in the {TOKEN_HEADER} header"),
        )
        .into_response();
    }
    if state.shutting_down.load(Ordering::Relaxed) {
        return ApiError::new(ErrorCode::ShuttingDown, "the agent is shutting down")
            .into_response();
    }
    next.run(req).await
}

/// Most of a request body left unread by its handler that is still read (and dropped)
/// before the answer goes out, and for how long: hyper closes a connection whose request
/// body was not read, and a client still sending then fails its write before it reads
/// the answer (the server's proxy answered such a refused upload 502).
pub const DRAIN_MAX: u64 = 64 << 20;
/// See [`DRAIN_MAX`].
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Reads and drops the rest of a body, within [`DRAIN_MAX`] bytes and [`DRAIN_TIME`].
pub async fn drain(stream: &mut BodyDataStream) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut dropped = 0u64;
        while let Some(Ok(chunk)) = stream.next().await {
            dropped += chunk.len() as u64;
            if dropped > DRAIN_MAX {
                break;
            }
        }
    })
    .await;
}

/// Every request: the handler (or extractor, or fallback) reads the body through a
/// stand-in, and what it left unread is drained once it answered (see [`DRAIN_MAX`]),
/// whatever refused the request: a bad query, a wrong method, a failed write.
async fn drain_unread(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let real = Arc::new(tokio::sync::Mutex::new(body.into_data_stream()));
    let stand_in = futures_util::stream::unfold(real.clone(), |real| async move {
        let chunk = real.lock().await.next().await?;
        Some((chunk, real))
    });
    let response = next
        .run(Request::from_parts(parts, Body::from_stream(stand_in)))
        .await;
    drain(&mut *real.lock().await).await;
    response
}

async fn route_not_found() -> ApiError {
    ApiError::new(ErrorCode::RouteNotFound, "no such route")
}

async fn livez() -> &'static str {
    "ok"
}

/// The full router.
pub fn router(state: Arc<AppState>) -> Router {
    let authed = Router::new()
        .route("/v1/health", get(crate::health::health))
        .route("/v1/exec", post(crate::exec::exec_sync))
        .route("/v1/exec/stream", post(crate::exec::exec_stream))
        .merge(crate::process::routes())
        .merge(crate::session::routes())
        .merge(crate::pty::routes())
        .merge(crate::files::routes())
        .merge(crate::git::routes())
        .fallback(route_not_found)
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/livez", get(livez))
        .merge(authed)
        .layer(middleware::from_fn(drain_unread))
        .with_state(state)
}

/// Raw HTTP/1.1 over TCP against the router, for tests that need the connection itself.
#[cfg(test)]
pub(crate) mod test_http {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::{router, AppState};

    /// Serves the router with token `tok` on a fresh port.
    pub async fn serve() -> SocketAddr {
        let config = crate::config::Config::new("tok");
        let state = AppState::new(config, Arc::new(crate::reaper::Reaper::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        addr
    }

    /// Sends the whole request, body included, then reads the answer: a server that
    /// answers and closes before it read the body makes this fail (broken pipe or
    /// reset) instead of answering.
    pub async fn send(
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, serde_json::Value)> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nx-orchard-token: tok\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no answer"))?;
        let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap_or(0);
        let body = serde_json::from_slice(&raw[split + 4..]).unwrap_or_default();
        Ok((status, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unsupported_method_is_405_and_its_body_is_read_before_the_answer() {
        let addr = test_http::serve().await;
        let body = vec![b'x'; 8 << 20];
        let (status, answer) = test_http::send(addr, "PUT", "/v1/sessions/x/run", &body)
            .await
            .expect("answered, not cut off mid-body");
        assert_eq!(status, 405, "{answer}");
        assert_eq!(answer["code"], "method_not_allowed");
        let (status, answer) = test_http::send(addr, "PUT", "/v1/nope", &body)
            .await
            .expect("answered, not cut off mid-body");
        assert_eq!((status, &answer["code"]), (404, &"route_not_found".into()));
    }

    #[test]
    fn constant_time_eq_compares_content_and_length() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
        // Lengths differing by a multiple of 256 must still differ.
        assert!(!constant_time_eq(&[0u8; 256], b""));
    }
}
