//! The REST API: the Orchard-compatible routes ([`compat`]), our `/v1/` routes
//! ([`v1`]: lifecycle, [`proxy`]: every agent route of a sandbox, [`images`]), and the
//! operations routes (`/metrics`, `/openapi.json`).
//!
//! Requests are parsed into typed values by the extractors here ([`ApiJson`], [`Auth`])
//! and every failure is a [`crate::service::Error`], turned into a response in one
//! place ([`error`]: its status, code and body). [`observe`] gives each request an id
//! (`x-request-id`, echoed) and a tracing span, logs it as one JSON line and counts it.

pub mod bulk;
pub mod compat;
pub mod error;
pub mod images;
pub mod job_body;
pub mod listen;
pub mod observe;
pub mod openapi;
pub mod proxy;
pub mod snapshots;
pub mod spool;
pub mod upload;
pub mod v1;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::service::{Error, Keys, Service, Tenant};

/// Largest JSON body of most routes.
pub const MAX_JSON: usize = 16 << 20;
/// Largest body of the compatible file upload (base64 inflates by a third).
pub const MAX_UPLOAD_JSON: usize = 512 << 20;
/// Largest patch of `apply_patch`: the agent takes request bodies of at most 16 MiB.
pub const MAX_PATCH_BYTES: usize = 16 << 20;
/// Largest body of `apply_patch`: [`MAX_PATCH_BYTES`] of patch with room for JSON's
/// escapes (issue 30: four 450 MiB patches took the server to 5 GB).
pub const MAX_PATCH_JSON: usize = 2 * MAX_PATCH_BYTES + (64 << 10);
/// Largest WebSocket message (and frame) a client may send: a terminal's input or a
/// stream's stdin comes in pieces far below it (tungstenite's default, 64 MiB, let 16
/// connections take 1.8 GB).
pub const MAX_WS_MESSAGE: usize = 4 << 20;

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The service.
    pub service: Service,
    /// The accepted API keys.
    pub keys: Arc<Keys>,
    /// The compatible upload's spools and their bounds.
    pub spools: Arc<spool::Spools>,
    /// Each tenant's turn at sending a big job's output.
    pub reads: Arc<job_body::ReadShares>,
}

impl AppState {
    /// The state of a router over `service` with the default bounds of upload spools
    /// (`orchard serve` sets its own from the configuration).
    pub fn new(service: Service, keys: Keys) -> AppState {
        let host =
            crate::image::gc::Budget::parse(spool::DEFAULT_UPLOAD_SPOOL_BYTES).unwrap_or_default();
        let spools = spool::Spools::new(
            &service.config().data_dir,
            host,
            listen::DEFAULT_BODY_TIMEOUT,
        );
        AppState {
            service,
            keys: Arc::new(keys),
            spools: Arc::new(spools),
            reads: Arc::new(job_body::ReadShares::start()),
        }
    }
}

/// A JSON body of type `T`: malformed JSON is 400, the wrong shape 422, a body over
/// [`MAX_JSON`] 413, all with a `detail` saying what is wrong.
pub struct ApiJson<T, const LIMIT: usize = MAX_JSON>(pub T);

impl<S: Send + Sync, T: DeserializeOwned, const LIMIT: usize> FromRequest<S> for ApiJson<T, LIMIT> {
    type Rejection = Error;

    async fn from_request(req: Request, _: &S) -> Result<Self, Error> {
        let (parts, body) = req.into_parts();
        let bytes = read_limited(&parts.headers, body, LIMIT).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Reads a whole body of at most `limit` bytes; a larger one is 413 (and read to its end
/// first, within [`DRAIN_MAX`], so the client gets to see the answer).
pub async fn read_limited(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Vec<u8>, Error> {
    let too_large = || Error::TooLarge(format!("the body is larger than {limit} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        if declared.is_some_and(|n| n - limit <= DRAIN_MAX) {
            drain(body).await;
        }
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(MAX_JSON));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::BadRequest(format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            drain(body).await;
            return Err(too_large());
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes)
}

/// How much of a body over its limit is still read (and dropped) before the 413 is
/// answered, and for how long. A server that answers while the client still sends, then
/// closes, makes the client's write fail (broken pipe, reset) before it can read the
/// answer: with the body read, the client sees the 413. Larger bodies are cut off.
pub(super) const DRAIN_MAX: usize = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Reads and drops the rest of `body`, within [`DRAIN_MAX`] bytes and [`DRAIN_TIME`].
pub(super) async fn drain(mut body: Body) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut dropped = 0;
        while let Some(Ok(frame)) = body.frame().await {
            dropped += frame.data_ref().map_or(0, |d| d.len());
            if dropped > DRAIN_MAX {
                break;
            }
        }
    })
    .await;
}

/// A path parameter: one that cannot be decoded (not UTF-8 once percent-decoded) is a
/// 400 with a `detail`, like every other bad input, not axum's plain-text rejection.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Error> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e| Error::BadRequest(format!("invalid path: {}", e.body_text())))
    }
}

/// Parses a JSON body with the API's error classes.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::BadRequest("expected a JSON body".into()));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            // The typed parse stops at the first unknown or mistyped field, which may
            // come before a syntax error: a body that is not JSON at all is 400 either way.
            Category::Data => match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(syntax) => Error::BadRequest(format!("malformed JSON: {syntax}")),
                Ok(_) => Error::Unprocessable(format!("invalid request: {e}")),
            },
            _ => Error::BadRequest(format!("malformed JSON: {e}")),
        }
    })
}

/// The API key of a request: `X-API-Key`, or `Authorization: Bearer`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(k);
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Whether a request asks for a WebSocket upgrade.
pub fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The caller, authenticated.
pub struct Auth(pub Tenant);

impl FromRequestParts<AppState> for Auth {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Error> {
        let ws_key;
        let mut key = presented_key(&parts.headers);
        // Browsers cannot set headers on a WebSocket: `?api_key=` and the `api_key.<key>`
        // subprotocol are accepted there, on every WebSocket route (docs/api.md).
        if key.is_none() && is_websocket(&parts.headers) {
            ws_key = compat::ws_key(&parts.headers, parts.uri.query()).0;
            key = ws_key.as_deref();
        }
        match state.keys.authenticate(key) {
            Some(t) => Ok(Auth(t)),
            None if key.is_none() => Err(Error::Unauthorized(
                "missing API key: send the X-API-Key header".into(),
            )),
            None => Err(Error::Unauthorized("invalid API key".into())),
        }
    }
}

async fn no_route(req: Request) -> Error {
    Error::NotFound(format!("no route {} {}", req.method(), req.uri().path()))
}

async fn bad_method(req: Request) -> Response {
    let e = Error::BadRequest(format!(
        "method {} is not allowed on {}",
        req.method(),
        req.uri().path()
    ));
    let mut resp = e.into_response();
    *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    resp
}

async fn metrics(State(state): State<AppState>) -> Response {
    let body = state
        .service
        .metrics()
        .render(&state.service.counts().await);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn openapi_doc() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi::document_json(),
    )
        .into_response()
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_doc))
        .merge(compat::routes())
        .merge(v1::routes())
        .merge(snapshots::routes())
        .merge(images::routes())
        .merge(proxy::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(bad_method)
        .layer(axum::extract::DefaultBodyLimit::disable());
    observe::wrap(router, state.service.metrics().clone()).with_state(state)
}

/// A body from a JSON value.
pub fn json_body(v: &impl serde::Serialize) -> Body {
    Body::from(serde_json::to_vec(v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        image: String,
    }

    #[test]
    fn bodies_that_are_not_json_are_400_and_json_of_the_wrong_shape_422() {
        let status = |b: &str| {
            parse_json::<Body>(b.as_bytes())
                .map(|_| 200)
                .unwrap_or_else(|e| error::status(&e))
        };
        assert_eq!(status(r#"{"image": "x"}"#), 200);
        for malformed in [
            "",
            " \n",
            "{",
            "nope",
            r#"{"image": "#,
            r#"{"other": 1,}"#,
            r#"{"image": 5"#,
        ] {
            assert_eq!(status(malformed), 400, "{malformed:?}");
        }
        for misshapen in [r#"{"image": 5}"#, "{}", r#"{"other": 1}"#, "[]", "null"] {
            assert_eq!(status(misshapen), 422, "{misshapen:?}");
        }
    }
}
