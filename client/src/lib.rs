//! Async Rust client of the `orchard-agent` API.
//!
//! [`AgentClient`] talks to one agent over its Unix socket or TCP address, keeping
//! HTTP/1.1 connections alive in a [`Pool`] so a call costs one round trip; many
//! clients (one per sandbox) can share one pool. Every typed method uses the wire types
//! of `orchard-protocol`; failures come back as [`ClientError`], with the agent's
//! [`ErrorBody`] when it answered one.

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use orchard_protocol::files::{
    Done, ExtractResult, FileList, FileStat, MkdirRequest, MoveRequest, WriteResult,
};
use orchard_protocol::health::Health;
use orchard_protocol::process::{
    ProcessInfo, ProcessList, ProcessOutput, SignalRequest, StdinWrite,
};
use orchard_protocol::pty::{PtyCreate, PtyInfo, PtyResize};
use orchard_protocol::session::{SessionCreate, SessionInfo, SessionRun, SessionRunResult};
use orchard_protocol::{ErrorBody, ExecEvent, ExecKept, ExecRequest, ExecResult, TOKEN_HEADER};
use serde::de::DeserializeOwned;
use serde::Serialize;

mod endpoint;
pub mod pool;
pub use pool::{Pool, PoolBody};

/// Where an agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent answered with an error.
    #[error("agent answered {status}: {} ({:?})", body.message, body.code)]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The error body.
        body: ErrorBody,
    },
    /// The agent could not be reached or the connection broke.
    #[error("transport: {message}")]
    Transport {
        /// What went wrong, as the caller is told (it quotes the cause).
        message: String,
        /// The cause: hyper's or the pool's error (down to the `io::Error` of a
        /// refused connect), or the timeout that ran out.
        #[source]
        source: BoxError,
    },
    /// The answer could not be decoded.
    #[error("decoding the answer: {message}")]
    Decode {
        /// What was wrong with the answer, as the caller is told.
        message: String,
        /// The parser's error, when one found the fault (none for an answer of the
        /// wrong kind, such as a success status where an error was due).
        #[source]
        source: Option<BoxError>,
    },
}

/// The cause behind a [`ClientError`], of whatever type it has.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl ClientError {
    /// The error code, when the agent answered one.
    pub fn code(&self) -> Option<orchard_protocol::ErrorCode> {
        match self {
            ClientError::Api { body, .. } => Some(body.code),
            _ => None,
        }
    }

    /// [`ClientError::Transport`] saying `message`, caused by `source`.
    pub fn transport(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        ClientError::Transport {
            message: message.into(),
            source: source.into(),
        }
    }

    /// [`ClientError::Decode`] saying `message`, with no parser error behind it.
    pub fn decode(message: impl Into<String>) -> Self {
        ClientError::Decode {
            message: message.into(),
            source: None,
        }
    }

    /// [`ClientError::Decode`] saying what the parser's error `source` says.
    fn parse(source: serde_json::Error) -> Self {
        ClientError::Decode {
            message: source.to_string(),
            source: Some(source.into()),
        }
    }
}

type Result<T> = std::result::Result<T, ClientError>;

/// [`ClientError::Transport`] saying what its cause `e` says.
fn transport<E: std::error::Error + Send + Sync + 'static>(e: E) -> ClientError {
    ClientError::transport(e.to_string(), e)
}

/// A client of one agent.
pub struct AgentClient {
    endpoint: Endpoint,
    token: String,
    /// `http://<authority>`: what the pool knows the endpoint by.
    base: String,
    /// Keep-alive connections, possibly shared with other clients.
    pool: Pool,
    /// Largest answer read whole; a longer one is an error, never held in memory.
    max_response: usize,
}

/// Default of [`AgentClient::with_max_response`]: 1 GiB.
pub const DEFAULT_MAX_RESPONSE: usize = 1 << 30;

/// A raw answer: status, headers and the whole body.
#[derive(Debug)]
pub struct RawResponse {
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: hyper::HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl AgentClient {
    /// A client for `endpoint` sending `token`, with a pool of its own.
    pub fn new(endpoint: Endpoint, token: impl Into<String>) -> Self {
        Self::with_pool(Pool::new(), endpoint, token)
    }

    /// A client for `endpoint` sending `token` over the connections of `pool`.
    pub fn with_pool(pool: Pool, endpoint: Endpoint, token: impl Into<String>) -> Self {
        Self {
            base: format!("http://{}", pool::authority(&endpoint)),
            endpoint,
            token: token.into(),
            pool,
            max_response: DEFAULT_MAX_RESPONSE,
        }
    }

    /// A client with another token (for auth tests), on the same pool.
    pub fn with_token(&self, token: impl Into<String>) -> Self {
        Self::with_pool(self.pool.clone(), self.endpoint.clone(), token)
            .with_max_response(self.max_response)
    }

    /// Caps the answers this client reads whole (JSON results, whole files): a longer
    /// answer fails with [`ClientError::Transport`] after reading at most `bytes`.
    pub fn with_max_response(mut self, bytes: usize) -> Self {
        self.max_response = bytes;
        self
    }

    /// The absolute URI of `path_and_query` on this agent, as the pool routes it.
    pub fn uri(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    /// Sends `req` (an absolute URI from [`AgentClient::uri`]; the token is added here)
    /// and returns the answer with its body unread. The connection returns to the pool
    /// once the body is read to its end.
    pub async fn forward(&self, mut req: Request<PoolBody>) -> Result<Response<Incoming>> {
        let token = hyper::header::HeaderValue::from_str(&self.token).map_err(transport)?;
        req.headers_mut().insert(TOKEN_HEADER, token);
        self.pool
            .request(req)
            .await
            .map_err(|e| ClientError::transport(pool::chain(&e), e))
    }

    fn build(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<Request<PoolBody>> {
        Request::builder()
            .method(method)
            .uri(self.uri(path))
            .header(hyper::header::HOST, "agent")
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(
                Full::new(body)
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .map_err(transport)
    }

    /// Sends a request and returns the response with its body unread. The connection
    /// is reused once the body is read to its end.
    pub async fn send_streaming(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<Response<Incoming>> {
        self.forward(self.build(method, path, body, content_type)?)
            .await
    }

    /// Sends a request and reads the whole answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<RawResponse> {
        let resp = self
            .send_streaming(method, path, body, content_type)
            .await?;
        let (parts, body) = resp.into_parts();
        let body = http_body_util::Limited::new(body, self.max_response)
            .collect()
            .await
            .map_err(|e| {
                let message = format!(
                    "the agent's answer could not be read whole (at most {} bytes): {e}",
                    self.max_response
                );
                ClientError::transport(message, e)
            })?
            .to_bytes();
        Ok(RawResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    fn decode<T: DeserializeOwned>(raw: RawResponse) -> Result<T> {
        if !raw.status.is_success() {
            let body = serde_json::from_slice(&raw.body).map_err(|e| {
                let message = format!(
                    "status {} with a non-error body ({e}): {}",
                    raw.status,
                    String::from_utf8_lossy(&raw.body)
                );
                ClientError::Decode {
                    message,
                    source: Some(e.into()),
                }
            })?;
            return Err(ClientError::Api {
                status: raw.status,
                body,
            });
        }
        serde_json::from_slice(&raw.body).map_err(ClientError::parse)
    }

    fn bytes_or_error(raw: RawResponse) -> Result<Bytes> {
        if raw.status.is_success() {
            Ok(raw.body)
        } else {
            Self::decode::<serde_json::Value>(raw).map(|_| Bytes::new())
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T> {
        let body = serde_json::to_vec(body).map_err(ClientError::parse)?;
        Self::decode(
            self.send(method, path, body.into(), "application/json")
                .await?,
        )
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Self::decode(
            self.send(Method::GET, path, Bytes::new(), "application/json")
                .await?,
        )
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<Health> {
        self.get("/v1/health").await
    }

    /// `PUT /v1/token`: replaces the agent's token. This client's token is refused from
    /// then on: make a new client with the new one.
    pub async fn rotate_token(
        &self,
        token: &str,
    ) -> Result<orchard_protocol::health::TokenRotated> {
        let req = orchard_protocol::health::TokenRotate {
            token: token.to_string(),
        };
        self.json(Method::PUT, "/v1/token", &req).await
    }

    /// `POST /v1/exec`.
    pub async fn exec(&self, req: &ExecRequest) -> Result<ExecResult> {
        self.json(Method::POST, "/v1/exec", req).await
    }

    /// A streaming answer whose status is a success, or its error decoded.
    async fn streaming_ok(resp: Response<Incoming>) -> Result<Response<Incoming>> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(transport)?
            .to_bytes();
        Err(Self::decode::<serde_json::Value>(RawResponse {
            status,
            headers: Default::default(),
            body,
        })
        .err()
        .unwrap_or_else(|| ClientError::decode(format!("status {status}"))))
    }

    /// `POST /v1/exec/stream` in binary framing (see [`orchard_protocol::frames`]):
    /// output as the bytes it was, no base64.
    pub async fn exec_frames(&self, req: &ExecRequest) -> Result<ExecFrames> {
        let body = serde_json::to_vec(req).map_err(ClientError::parse)?;
        let mut request = self.build(
            Method::POST,
            "/v1/exec/stream",
            body.into(),
            "application/json",
        )?;
        request.headers_mut().insert(
            hyper::header::ACCEPT,
            hyper::header::HeaderValue::from_static(orchard_protocol::frames::EXEC_FRAMES),
        );
        let resp = Self::streaming_ok(self.forward(request).await?).await?;
        // An agent that does not know the framing answers NDJSON: refuse to read that
        // as frames (its first bytes would announce a frame of hundreds of MB).
        let ct = resp
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct != orchard_protocol::frames::EXEC_FRAMES {
            return Err(ClientError::decode(format!(
                "asked for binary frames, the agent answered {ct:?} (an older agent?)"
            )));
        }
        Ok(ExecFrames::new(resp.into_body()))
    }

    /// `POST /v1/exec/stream`: the frames as they come.
    pub async fn exec_stream(&self, req: &ExecRequest) -> Result<ExecStream> {
        let body = serde_json::to_vec(req).map_err(ClientError::parse)?;
        let resp = self
            .send_streaming(
                Method::POST,
                "/v1/exec/stream",
                body.into(),
                "application/json",
            )
            .await?;
        let resp = Self::streaming_ok(resp).await?;
        Ok(ExecStream {
            body: resp.into_body(),
            buf: Vec::new(),
            scanned: 0,
        })
    }

    /// `GET /v1/exec/results/{id}`: the command run with `result_id` `id`, waiting up to
    /// `timeout_ms` while it runs.
    pub async fn exec_result(&self, id: &str, timeout_ms: u64) -> Result<ExecKept> {
        self.get(&format!(
            "/v1/exec/results/{}?timeout_ms={timeout_ms}",
            encode(id)
        ))
        .await
    }

    /// `POST /v1/processes`.
    pub async fn start_process(&self, req: &ExecRequest) -> Result<ProcessInfo> {
        self.json(Method::POST, "/v1/processes", req).await
    }

    /// `GET /v1/processes`.
    pub async fn list_processes(&self) -> Result<ProcessList> {
        self.get("/v1/processes").await
    }

    /// `GET /v1/processes/{id}`.
    pub async fn process(&self, id: &str) -> Result<ProcessInfo> {
        self.get(&format!("/v1/processes/{id}")).await
    }

    /// `GET /v1/processes/{id}/output`.
    pub async fn process_output(
        &self,
        id: &str,
        stdout_offset: u64,
        stderr_offset: u64,
    ) -> Result<ProcessOutput> {
        self.get(&format!(
            "/v1/processes/{id}/output?stdout_offset={stdout_offset}&stderr_offset={stderr_offset}"
        ))
        .await
    }

    /// `POST /v1/processes/{id}/stdin`.
    pub async fn write_stdin(&self, id: &str, write: &StdinWrite) -> Result<ProcessInfo> {
        self.json(Method::POST, &format!("/v1/processes/{id}/stdin"), write)
            .await
    }

    /// `POST /v1/processes/{id}/signal`.
    pub async fn signal(&self, id: &str, req: &SignalRequest) -> Result<ProcessInfo> {
        self.json(Method::POST, &format!("/v1/processes/{id}/signal"), req)
            .await
    }

    /// `GET /v1/processes/{id}/wait`.
    pub async fn wait_process(&self, id: &str, timeout_ms: u64) -> Result<ProcessInfo> {
        self.get(&format!("/v1/processes/{id}/wait?timeout_ms={timeout_ms}"))
            .await
    }

    /// `DELETE /v1/processes/{id}`.
    pub async fn delete_process(&self, id: &str) -> Result<ProcessInfo> {
        Self::decode(
            self.send(
                Method::DELETE,
                &format!("/v1/processes/{id}"),
                Bytes::new(),
                "application/json",
            )
            .await?,
        )
    }

    /// `POST /v1/sessions`.
    pub async fn create_session(&self, req: &SessionCreate) -> Result<SessionInfo> {
        self.json(Method::POST, "/v1/sessions", req).await
    }

    /// `GET /v1/sessions`.
    pub async fn list_sessions(&self) -> Result<orchard_protocol::session::SessionList> {
        self.get("/v1/sessions").await
    }

    /// `GET /v1/sessions/{id}/state`: the session's directory, exported variables and
    /// functions, between two of its commands.
    pub async fn session_state(&self, id: &str) -> Result<orchard_protocol::session::SessionState> {
        self.get(&format!("/v1/sessions/{}/state", encode(id)))
            .await
    }

    /// `POST /v1/sessions/{id}/run`.
    pub async fn session_run(&self, id: &str, req: &SessionRun) -> Result<SessionRunResult> {
        self.json(Method::POST, &format!("/v1/sessions/{id}/run"), req)
            .await
    }

    /// `DELETE /v1/sessions/{id}`.
    pub async fn delete_session(&self, id: &str) -> Result<SessionInfo> {
        Self::decode(
            self.send(
                Method::DELETE,
                &format!("/v1/sessions/{id}"),
                Bytes::new(),
                "application/json",
            )
            .await?,
        )
    }

    /// `POST /v1/pty`.
    pub async fn create_pty(&self, req: &PtyCreate) -> Result<PtyInfo> {
        self.json(Method::POST, "/v1/pty", req).await
    }

    /// `GET /v1/pty/{id}`.
    pub async fn pty(&self, id: &str) -> Result<PtyInfo> {
        self.get(&format!("/v1/pty/{id}")).await
    }

    /// `POST /v1/pty/{id}/resize`.
    pub async fn resize_pty(&self, id: &str, rows: u16, cols: u16) -> Result<PtyInfo> {
        self.json(
            Method::POST,
            &format!("/v1/pty/{id}/resize"),
            &PtyResize { rows, cols },
        )
        .await
    }

    /// `DELETE /v1/pty/{id}`.
    pub async fn delete_pty(&self, id: &str) -> Result<PtyInfo> {
        Self::decode(
            self.send(
                Method::DELETE,
                &format!("/v1/pty/{id}"),
                Bytes::new(),
                "application/json",
            )
            .await?,
        )
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The token this client sends.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `GET /v1/files`: the whole file.
    pub async fn read_file(&self, path: &str) -> Result<Bytes> {
        self.read_range(path, None, None).await
    }

    /// `GET /v1/files` as a stream: the agent's error when it answers one, else the
    /// body unread (for callers that must not hold the file in memory).
    pub async fn read_stream(&self, path: &str) -> Result<Incoming> {
        let q = format!("/v1/files?path={}", encode(path));
        let resp = self
            .send_streaming(Method::GET, &q, Bytes::new(), "application/json")
            .await?;
        let (parts, body) = resp.into_parts();
        if parts.status.is_success() {
            return Ok(body);
        }
        let body = http_body_util::Limited::new(body, 1 << 20)
            .collect()
            .await
            .map_err(|e| ClientError::transport(e.to_string(), e))?
            .to_bytes();
        Err(Self::decode::<serde_json::Value>(RawResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
        .err()
        .unwrap_or_else(|| ClientError::decode("an error status with a success body")))
    }

    /// `GET /v1/files` with a byte range.
    pub async fn read_range(
        &self,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<Bytes> {
        let mut q = format!("/v1/files?path={}", encode(path));
        if let Some(o) = offset {
            q += &format!("&offset={o}");
        }
        if let Some(l) = length {
            q += &format!("&length={l}");
        }
        Self::bytes_or_error(
            self.send(Method::GET, &q, Bytes::new(), "application/json")
                .await?,
        )
    }

    /// `PUT /v1/files`.
    pub async fn write_file(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        mode: Option<u32>,
    ) -> Result<WriteResult> {
        let mut q = format!("/v1/files?path={}", encode(path));
        if let Some(m) = mode {
            q += &format!("&mode={m:o}");
        }
        Self::decode(
            self.send(Method::PUT, &q, data.into(), "application/octet-stream")
                .await?,
        )
    }

    /// `GET /v1/files/stat`.
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        self.get(&format!("/v1/files/stat?path={}", encode(path)))
            .await
    }

    /// `GET /v1/files/list`.
    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<FileList> {
        self.get(&format!(
            "/v1/files/list?path={}&depth={depth}",
            encode(path)
        ))
        .await
    }

    /// `POST /v1/files/mkdir`.
    pub async fn mkdir(&self, path: &str) -> Result<Done> {
        self.json(
            Method::POST,
            "/v1/files/mkdir",
            &MkdirRequest {
                path: path.into(),
                mode: None,
            },
        )
        .await
    }

    /// `POST /v1/files/move`.
    pub async fn rename(&self, from: &str, to: &str, overwrite: bool) -> Result<Done> {
        self.json(
            Method::POST,
            "/v1/files/move",
            &MoveRequest {
                from: from.into(),
                to: to.into(),
                overwrite,
            },
        )
        .await
    }

    /// `DELETE /v1/files`.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<Done> {
        let q = format!("/v1/files?path={}&recursive={recursive}", encode(path));
        Self::decode(
            self.send(Method::DELETE, &q, Bytes::new(), "application/json")
                .await?,
        )
    }

    /// `PUT /v1/files/archive`: extract a tar or tar.gz into `dir`.
    pub async fn upload_tar(&self, dir: &str, archive: impl Into<Bytes>) -> Result<ExtractResult> {
        let q = format!("/v1/files/archive?path={}", encode(dir));
        Self::decode(
            self.send(Method::PUT, &q, archive.into(), "application/x-tar")
                .await?,
        )
    }

    /// `POST /v1/git/apply`: a patch, all or nothing.
    pub async fn git_apply(
        &self,
        req: &orchard_protocol::git::GitApplyRequest,
    ) -> Result<orchard_protocol::git::GitApplyResult> {
        self.json(Method::POST, "/v1/git/apply", req).await
    }

    /// `GET /v1/files/archive`: `path` as tar.gz.
    pub async fn download_tar(&self, path: &str) -> Result<Bytes> {
        let q = format!("/v1/files/archive?path={}", encode(path));
        Self::bytes_or_error(
            self.send(Method::GET, &q, Bytes::new(), "application/json")
                .await?,
        )
    }
}

/// Percent-encodes a query value.
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Largest event (or unknown) frame a reader puts together; events are small JSON.
const MAX_EVENT_FRAME: usize = 16 << 20;

/// One frame of a binary exec stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Bytes the command wrote to stdout.
    Stdout(Bytes),
    /// Bytes the command wrote to stderr.
    Stderr(Bytes),
    /// Any other event (start, exit, error, keepalive).
    Event(ExecEvent),
}

/// A streamed exec in binary framing: [`Frame`]s as they come. A large output frame
/// is handed on in the pieces it arrives in (several `Stdout` frames for one on the
/// wire), without copying them.
pub struct ExecFrames {
    body: Incoming,
    /// Received bytes not yet handed on.
    pending: Bytes,
    /// A header or event frame split across received chunks, being put together.
    partial: bytes::BytesMut,
    /// The output frame being handed on: its kind and the bytes still to come.
    output: Option<(bool, usize)>,
}

impl ExecFrames {
    fn new(body: Incoming) -> ExecFrames {
        ExecFrames {
            body,
            pending: Bytes::new(),
            partial: bytes::BytesMut::new(),
            output: None,
        }
    }

    /// The next frame, or `None` at the end of the stream. Frames of unknown kinds
    /// are skipped.
    pub async fn next(&mut self) -> Result<Option<Frame>> {
        use orchard_protocol::frames::{parse_header, FrameKind, HEADER_LEN};
        loop {
            // Inside an output frame: hand on what has arrived of it, as it is.
            if let Some((stdout, left)) = self.output {
                if left == 0 {
                    self.output = None;
                    continue;
                }
                if !self.pending.is_empty() {
                    let piece = self.pending.split_to(left.min(self.pending.len()));
                    self.output = Some((stdout, left - piece.len()));
                    return Ok(Some(if stdout {
                        Frame::Stdout(piece)
                    } else {
                        Frame::Stderr(piece)
                    }));
                }
            } else {
                // Headers and events are small: put them together in `partial`, the
                // header first, then (for an event) its payload.
                let need = |partial: &[u8]| match parse_header(partial) {
                    Some((FrameKind::Stdout | FrameKind::Stderr, _)) => HEADER_LEN,
                    Some((_, len)) => HEADER_LEN + len,
                    None => HEADER_LEN,
                };
                for _ in 0..2 {
                    let want = need(&self.partial);
                    let take = want
                        .saturating_sub(self.partial.len())
                        .min(self.pending.len());
                    self.partial.extend_from_slice(&self.pending.split_to(take));
                }
                if need(&self.partial) > MAX_EVENT_FRAME {
                    return Err(ClientError::decode(format!(
                        "an event frame of {} bytes: the stream is not in this framing",
                        need(&self.partial)
                    )));
                }
                if self.partial.len() >= need(&self.partial) {
                    if let Some((kind, len)) = parse_header(&self.partial) {
                        let frame = self.partial.split().freeze();
                        match kind {
                            FrameKind::Stdout => self.output = Some((true, len)),
                            FrameKind::Stderr => self.output = Some((false, len)),
                            FrameKind::Event => {
                                return serde_json::from_slice(&frame[HEADER_LEN..])
                                    .map(|e| Some(Frame::Event(e)))
                                    .map_err(ClientError::parse)
                            }
                            FrameKind::Unknown(_) => {}
                        }
                        continue;
                    }
                }
            }
            if !self.pending.is_empty() {
                continue;
            }
            match self.body.frame().await {
                None if self.partial.is_empty() && self.output.is_none() => return Ok(None),
                None => return Err(ClientError::decode("the stream ended inside a frame")),
                Some(Err(e)) => return Err(transport(e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending = data;
                    }
                }
            }
        }
    }
}

/// The frames of a streamed exec.
pub struct ExecStream {
    body: Incoming,
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a newline (a long line arrives in many
    /// chunks; searching it from its start each time would be quadratic).
    scanned: usize,
}

impl ExecStream {
    /// The next frame, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>> {
        loop {
            if let Some(at) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                let nl = self.scanned + at;
                self.scanned = 0;
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                return serde_json::from_slice(&line[..nl])
                    .map(Some)
                    .map_err(ClientError::parse);
            }
            self.scanned = self.buf.len();
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(transport(e)),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// The first error of type `E` in `e`'s chain of sources.
    fn cause<E: std::error::Error + 'static>(e: &ClientError) -> Option<&E> {
        let mut next = e.source();
        while let Some(s) = next {
            if let Some(found) = s.downcast_ref::<E>() {
                return Some(found);
            }
            next = s.source();
        }
        None
    }

    /// A refused connect keeps the OS's error under the pool's: a caller can tell a
    /// missing socket from a reset without reading the message.
    #[test]
    fn a_failed_connect_keeps_its_io_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = AgentClient::new(
            Endpoint::Unix("/nonexistent/orchard-client-test/agent.sock".into()),
            "token",
        );
        let err = rt.block_on(client.health()).unwrap_err();
        assert!(matches!(err, ClientError::Transport { .. }), "{err:?}");
        let io = cause::<std::io::Error>(&err).expect("an io::Error in the chain");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound, "{io}");
        // The message is what it always was: the pool's error and its causes.
        assert!(err.to_string().starts_with("transport: "), "{err}");
        assert!(err.to_string().contains(&io.to_string()), "{err}");
    }

    /// A body that is not the JSON asked for keeps serde's error, with its position.
    #[test]
    fn a_bad_answer_keeps_the_parsers_error() {
        let raw = RawResponse {
            status: StatusCode::OK,
            headers: Default::default(),
            body: Bytes::from_static(b"{"),
        };
        let err = AgentClient::decode::<Health>(raw).unwrap_err();
        let ClientError::Decode { message, .. } = &err else {
            panic!("{err:?}")
        };
        let json = cause::<serde_json::Error>(&err).expect("serde's error in the chain");
        assert_eq!(message, &json.to_string());
        assert_eq!(err.to_string(), format!("decoding the answer: {json}"));
        assert!(json.is_eof(), "{json}");
    }

    /// A decode fault no parser found has no cause to show.
    #[test]
    fn an_error_status_without_an_error_body_has_no_cause() {
        let err = ClientError::decode("an error status with a success body");
        assert!(err.source().is_none());
        assert_eq!(
            err.to_string(),
            "decoding the answer: an error status with a success body"
        );
    }
}
