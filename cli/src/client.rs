//! HTTP to the orchard server: every request carries `X-API-Key`, every non-2xx answer
//! becomes a [`CliError::Api`] with the server's own message, streamed answers are read
//! as NDJSON [`Lines`], and terminals are attached over a WebSocket ([`Client::websocket`]).

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, Url};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use orchard_protocol::{ErrorCode, ServiceErrorCode};

use super::{CliError, Connect};

/// Header of the API key (docs/api.md, "Auth").
pub const API_KEY_HEADER: &str = "x-api-key";

/// Longest NDJSON line accepted; a frame of a stream is a few KiB, so anything near this
/// means the answer is not what we think it is (and must not grow memory unbounded).
const MAX_LINE: usize = 16 << 20;

/// Time allowed to open a connection. There is no overall request timeout: exec, pull
/// and import streams last as long as they last.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A WebSocket to the server.
pub type WebSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A client of one server with one key.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The base URL without a trailing slash; paths (`/v1/...`) are appended to it, so a
    /// server behind a path prefix works.
    base: String,
    key: Option<HeaderValue>,
}

impl Client {
    /// A client of the server `connect` names.
    pub fn new(connect: &Connect) -> Result<Self, CliError> {
        let given = connect.url.trim();
        let bad = |reason: &str| CliError::BadUrl {
            url: connect.url.clone(),
            reason: reason.to_string(),
        };
        let url = Url::parse(given).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("only http:// and https:// are supported"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("a base URL has no query or fragment"));
        }
        let key = match &connect.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(key.trim()).map_err(|_| {
                    CliError::Usage(
                        "the API key holds characters an HTTP header cannot carry".into(),
                    )
                })?;
                // Keeps the key out of reqwest's debug output.
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let mut headers = HeaderMap::new();
        if let Some(key) = &key {
            headers.insert(API_KEY_HEADER, key.clone());
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .default_headers(headers)
            .user_agent(concat!("orchard-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CliError::Transport {
                url: given.to_string(),
                reason: causes(&e),
            })?;
        Ok(Self {
            http,
            base: url.as_str().trim_end_matches('/').to_string(),
            key,
        })
    }

    /// The server's base URL, as used in messages.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request to `path` (which starts with `/`), with the key.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// Sends `request`; a non-2xx answer is an error carrying the server's message.
    pub async fn send(&self, request: RequestBuilder) -> Result<Response, CliError> {
        let response = request.send().await.map_err(|e| self.transport(e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        // An unreadable error body still leaves the status to report.
        let body = response.bytes().await.unwrap_or_default();
        Err(error_from_body(status, &body))
    }

    /// Sends `request` and parses its JSON answer; `what` names it in errors.
    pub async fn json<T: DeserializeOwned>(
        &self,
        request: RequestBuilder,
        what: &str,
    ) -> Result<T, CliError> {
        let response = self.send(request).await?;
        let body = response.bytes().await.map_err(|e| self.transport(e))?;
        serde_json::from_slice(&body).map_err(|e| CliError::protocol(what, e))
    }

    /// The answer's body as NDJSON lines.
    pub fn lines(&self, response: Response) -> Lines {
        Lines {
            stream: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
            base: self.base.clone(),
        }
    }

    /// Turns a reqwest error into "cannot reach" (nothing connected) or "connection
    /// failed" (it broke later).
    pub fn transport(&self, err: reqwest::Error) -> CliError {
        transport_error(&self.base, &err, err.is_connect())
    }

    /// Opens a WebSocket to `path`, authenticated by the `X-API-Key` header of the
    /// upgrade request (never the query string, which ends up in logs).
    pub async fn websocket(&self, path: &str) -> Result<WebSocket, CliError> {
        use tungstenite::client::IntoClientRequest;
        let url = ws_url(&self.base, path);
        let mut request = url.into_client_request().map_err(|e| CliError::BadUrl {
            url: self.base.clone(),
            reason: e.to_string(),
        })?;
        if let Some(key) = &self.key {
            request.headers_mut().insert(API_KEY_HEADER, key.clone());
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((socket, _)) => Ok(socket),
            Err(tungstenite::Error::Http(response)) => {
                let body = response.body().as_deref().unwrap_or_default();
                Err(error_from_body(response.status().as_u16(), body))
            }
            // Only an I/O error before the handshake means nothing was reachable; the
            // rest happened on an open connection.
            Err(tungstenite::Error::Io(e)) => Err(transport_error(&self.base, &e, true)),
            Err(e) => Err(transport_error(&self.base, &e, false)),
        }
    }
}

/// `http(s)://host/prefix` + `path` as `ws(s)://host/prefix/path`.
fn ws_url(base: &str, path: &str) -> String {
    let rest = base
        .strip_prefix("https://")
        .map(|rest| format!("wss://{rest}"))
        .or_else(|| {
            base.strip_prefix("http://")
                .map(|rest| format!("ws://{rest}"))
        })
        .unwrap_or_else(|| base.to_string());
    format!("{rest}{path}")
}

fn transport_error(base: &str, err: &dyn std::error::Error, connecting: bool) -> CliError {
    let reason = causes(err);
    if connecting {
        CliError::Unreachable {
            url: base.to_string(),
            reason,
        }
    } else {
        CliError::Transport {
            url: base.to_string(),
            reason,
        }
    }
}

/// The useful part of an error chain: the causes under reqwest's "error sending request
/// for url (...)" wrapper, which repeats the URL we print anyway.
fn causes(err: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = err.source();
    if next.is_none() {
        parts.push(err.to_string());
    }
    while let Some(e) = next {
        let text = e.to_string();
        // hyper and io repeat the inner message in the outer one at times.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// The machine-readable code of an error answer, of whichever server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiCode {
    /// The orchestrator's own, of a `{"detail", "code"}` body.
    Service(ServiceErrorCode),
    /// The agent's, of a `{"code", "message"}` body (passed through on proxied routes).
    Agent(ErrorCode),
    /// A code this CLI does not know (a newer server's), as it was sent.
    Other(String),
}

impl ApiCode {
    /// The code `name` of an orchestrator's body (`agent` false) or an agent's (true).
    pub fn parse(name: &str, agent: bool) -> ApiCode {
        let known = if agent {
            orchard_protocol::error::ALL
                .iter()
                .find(|(_, n)| *n == name)
                .map(|(c, _)| ApiCode::Agent(*c))
        } else {
            ServiceErrorCode::from_name(name).map(ApiCode::Service)
        };
        known.unwrap_or_else(|| ApiCode::Other(name.to_string()))
    }

    /// The code as it was sent.
    pub fn as_str(&self) -> &str {
        match self {
            ApiCode::Service(c) => c.as_str(),
            ApiCode::Agent(c) => c.as_str(),
            ApiCode::Other(s) => s,
        }
    }
}

impl std::fmt::Display for ApiCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A [`CliError::Api`] from an error answer: the orchestrator's `{"detail", "code"}`, the
/// agent's `{"code", "message"}` (passed through on proxied routes), or plain text.
pub fn error_from_body(status: u16, body: &[u8]) -> CliError {
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        detail: Option<serde_json::Value>,
        #[serde(default)]
        message: Option<String>,
        // A string, not a code: an unknown one must not lose the message.
        #[serde(default)]
        code: Option<String>,
    }
    let parsed = serde_json::from_slice::<Body>(body).ok();
    let code = parsed.as_ref().and_then(|b| {
        let agent = b.detail.is_none() && b.message.is_some();
        b.code.as_deref().map(|c| ApiCode::parse(c, agent))
    });
    let detail = parsed
        .and_then(|b| match b.detail {
            Some(serde_json::Value::String(s)) => Some(s),
            // FastAPI-style validation errors carry a list; show it rather than nothing.
            Some(other) if !other.is_null() => Some(other.to_string()),
            _ => b.message,
        })
        .or_else(|| {
            let text = String::from_utf8_lossy(body).trim().to_string();
            (!text.is_empty()).then(|| truncate(&text, 500))
        })
        .unwrap_or_else(|| {
            reqwest::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("error")
                .to_string()
        });
    CliError::Api {
        status,
        code,
        detail,
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// The lines of a streamed answer (NDJSON), read as they arrive.
pub struct Lines {
    stream: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buf: Vec<u8>,
    base: String,
}

impl Lines {
    /// The next non-empty line without its newline; `None` at the end of the body. A last
    /// line without a newline is returned too.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, CliError> {
        loop {
            if let Some(line) = take_line(&mut self.buf) {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.buf.len() > MAX_LINE {
                return Err(CliError::protocol(
                    "a streamed answer",
                    format!("a line is longer than {MAX_LINE} bytes"),
                ));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(transport_error(&self.base, &e, false)),
                None => {
                    let rest = std::mem::take(&mut self.buf);
                    if rest.iter().all(u8::is_ascii_whitespace) {
                        return Ok(None);
                    }
                    return Ok(Some(rest));
                }
            }
        }
    }
}

/// Removes and returns the first complete line of `buf`, without its `\n` (or `\r\n`).
fn take_line(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let end = buf.iter().position(|&b| b == b'\n')?;
    let mut line: Vec<u8> = buf.drain(..=end).collect();
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Some(line)
}

/// `s` as one path segment: everything but unreserved characters percent-encoded, so an
/// id or a name typed by a person cannot change the route.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(err: CliError) -> (u16, Option<ApiCode>, String) {
        match err {
            CliError::Api {
                status,
                code,
                detail,
            } => (status, code, detail),
            other => panic!("not an API error: {other:?}"),
        }
    }

    #[test]
    fn error_bodies_of_the_orchestrator_the_agent_and_others() {
        let e = error_from_body(
            401,
            br#"{"detail":"missing or wrong API key","code":"unauthorized"}"#,
        );
        assert_eq!(e.to_string(), "401: missing or wrong API key");
        assert_eq!(
            api(e).1,
            Some(ApiCode::Service(ServiceErrorCode::Unauthorized))
        );
        let e = error_from_body(400, br#"{"code":"cwd_not_found","message":"no /nope"}"#);
        assert_eq!(e.to_string(), "400: no /nope");
        assert_eq!(api(e).1, Some(ApiCode::Agent(ErrorCode::CwdNotFound)));
        // A code both servers have is read as the one of the server whose body it is.
        let e = error_from_body(
            404,
            br#"{"detail":"sandbox x not found","code":"not_found"}"#,
        );
        assert_eq!(api(e).1, Some(ApiCode::Service(ServiceErrorCode::NotFound)));
        let e = error_from_body(404, br#"{"code":"not_found","message":"no /x"}"#);
        assert_eq!(api(e).1, Some(ApiCode::Agent(ErrorCode::NotFound)));
        // A newer server's code keeps its message and its name.
        let e = error_from_body(409, br#"{"detail":"busy","code":"sandbox_paused"}"#);
        assert_eq!(e.to_string(), "409: busy");
        let code = api(e).1.unwrap();
        assert_eq!(code, ApiCode::Other("sandbox_paused".into()));
        assert_eq!(code.to_string(), "sandbox_paused");
        assert_eq!(api(error_from_body(500, b"oops")).1, None);
        let e = error_from_body(422, br#"{"detail":[{"loc":["body"],"msg":"x"}]}"#);
        assert!(e.to_string().starts_with("422: [{"), "{e}");
        assert_eq!(
            error_from_body(502, b"bad gateway from a proxy\n").to_string(),
            "502: bad gateway from a proxy"
        );
        assert_eq!(
            error_from_body(503, b"").to_string(),
            "503: Service Unavailable"
        );
        let long = "x".repeat(2000);
        assert!(error_from_body(500, long.as_bytes()).to_string().len() < 520);
    }

    #[test]
    fn lines_are_split_on_newlines_and_crlf() {
        let mut buf = b"{\"a\":1}\r\n{\"b\":2}\n{\"c\"".to_vec();
        assert_eq!(take_line(&mut buf).unwrap(), b"{\"a\":1}");
        assert_eq!(take_line(&mut buf).unwrap(), b"{\"b\":2}");
        assert_eq!(take_line(&mut buf), None);
        assert_eq!(buf, b"{\"c\"");
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("sb-12ab_x.y"), "sb-12ab_x.y");
        assert_eq!(segment("../admin?x=1"), "..%2Fadmin%3Fx%3D1");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn websocket_urls_follow_the_scheme_and_keep_a_prefix() {
        assert_eq!(ws_url("http://h:1", "/v1/x"), "ws://h:1/v1/x");
        assert_eq!(ws_url("https://h/orchard", "/v1/x"), "wss://h/orchard/v1/x");
    }

    fn connect(url: &str, key: Option<&str>) -> Connect {
        Connect {
            url: url.to_string(),
            api_key: key.map(str::to_string),
        }
    }

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        let c = Client::new(&connect("http://127.0.0.1:8000/", None)).unwrap();
        assert_eq!(c.base(), "http://127.0.0.1:8000");
        let c = Client::new(&connect("https://h.example/prefix/", Some("k"))).unwrap();
        assert_eq!(c.base(), "https://h.example/prefix");
        for bad in ["127.0.0.1:8000", "ftp://h", "http://h/?a=b", ""] {
            let err = Client::new(&connect(bad, None)).unwrap_err();
            assert!(matches!(err, CliError::BadUrl { .. }), "{bad}: {err:?}");
        }
        let err = Client::new(&connect("http://h", Some("bad\nkey"))).unwrap_err();
        assert!(matches!(err, CliError::Usage(_)), "{err:?}");
    }

    #[tokio::test]
    async fn nothing_listening_is_cannot_reach() {
        // A port that was just free: bound, its number taken, and released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let c = Client::new(&connect(&format!("http://127.0.0.1:{port}"), None)).unwrap();
        let err = c
            .send(c.request(Method::GET, "/v1/sandboxes"))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "cannot reach the server at http://127.0.0.1:{port}: "
            )),
            "{text}"
        );
        assert!(text.contains("refused"), "{text}");
        let err = c.websocket("/v1/x").await.unwrap_err();
        assert!(matches!(err, CliError::Unreachable { .. }), "{err:?}");
    }
}
