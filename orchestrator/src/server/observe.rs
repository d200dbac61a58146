//! What wraps every request: a request id (`x-request-id`, echoed; a usable one from the
//! client is kept, otherwise 16 random hex digits), a `tracing` span named `request`
//! with `request_id`, `method`, `path` and, on the routes of a sandbox, `sandbox_id`,
//! one log line per answer and the request metrics. Built from `tower-http`'s
//! request-id and trace layers; only the span's fields, the id's format and the answer
//! line are ours.
//!
//! The span is made at level `warn`, so that whenever a warning can be written (the
//! quiet `ORCHARD_LOG=warn` too) it names the request; with `ORCHARD_LOG=off` it is
//! not made at all.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderValue, Request, Response};
use axum::Router;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

use super::error::{ErrorCodeExt, InternalDetail};
use crate::metrics::Metrics;

/// The request id header.
const REQUEST_ID: &str = "x-request-id";
/// Longest request id kept from a client.
const MAX_ID_LEN: usize = 128;

/// Wraps `router` (every route and the fallbacks) in the request id, span, log line and
/// metrics layers.
pub fn wrap<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    metrics: Arc<Metrics>,
) -> Router<S> {
    let trace = TraceLayer::new_for_http()
        .make_span_with(RequestSpan)
        .on_request(())
        .on_response(Answered(metrics))
        .on_body_chunk(())
        .on_eos(())
        // A 5xx is logged once, by `Answered`, at `warn`.
        .on_failure(());
    // The last layer added runs first: drop an unusable id, set one, open the span,
    // then echo the id on the answer.
    router
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(trace)
        .layer(SetRequestIdLayer::x_request_id(HexRequestId))
        .layer(tower::util::MapRequestLayer::new(drop_unusable_id))
}

/// Removes a client's request id that is empty, longer than [`MAX_ID_LEN`] or not
/// printable ASCII, so that one of ours replaces it (as before `tower-http`).
fn drop_unusable_id<B>(mut req: Request<B>) -> Request<B> {
    let usable = |v: &HeaderValue| {
        v.to_str()
            .is_ok_and(|s| !s.is_empty() && s.len() <= MAX_ID_LEN)
    };
    if req.headers().get(REQUEST_ID).is_some_and(|v| !usable(v)) {
        req.headers_mut().remove(REQUEST_ID);
    }
    req
}

/// Our request ids: 16 random hex digits.
#[derive(Clone, Copy)]
struct HexRequestId;

impl MakeRequestId for HexRequestId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        HeaderValue::from_str(&new_request_id())
            .ok()
            .map(RequestId::new)
    }
}

/// A request id for a request that came without one. Ids must be unique, not secret:
/// when the random generator fails, a process-wide counter stands in.
fn new_request_id() -> String {
    crate::random::hex(8).unwrap_or_else(|_| {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}-{n}", std::process::id())
    })
}

/// The span of one request.
#[derive(Clone, Copy)]
struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, req: &Request<B>) -> Span {
        let id = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let path = req.uri().path();
        match sandbox_id(path) {
            Some(sb) => tracing::warn_span!(
                "request",
                request_id = id,
                method = %req.method(),
                path,
                sandbox_id = sb
            ),
            // A create records the id it made ([`crate::service::Service::create`]).
            None => tracing::warn_span!(
                "request",
                request_id = id,
                method = %req.method(),
                path,
                sandbox_id = tracing::field::Empty
            ),
        }
    }
}

/// The sandbox id in `path`: every route of a sandbox is `/sandboxes/{id}...` or
/// `/v1/sandboxes/{id}...`.
fn sandbox_id(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1").unwrap_or(path);
    let rest = rest.strip_prefix("/sandboxes/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Counts an answer and writes its line: `info`, or `warn` for a 5xx.
#[derive(Clone)]
struct Answered(Arc<Metrics>);

impl<B> OnResponse<B> for Answered {
    fn on_response(self, resp: &Response<B>, latency: Duration, _: &Span) {
        let status = resp.status().as_u16();
        self.0.request(status);
        let code = resp
            .extensions()
            .get::<ErrorCodeExt>()
            .map(|c| c.0.as_str());
        if let Some(code) = code {
            self.0.error(code);
        }
        let internal = resp
            .extensions()
            .get::<InternalDetail>()
            .map(|d| d.0.as_str());
        let ms = latency.as_secs_f64() * 1e3;
        if status >= 500 {
            tracing::warn!(status, duration_ms = %format_args!("{ms:.3}"), error = code, internal, "request");
        } else {
            tracing::info!(status, duration_ms = %format_args!("{ms:.3}"), error = code, internal, "request");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_id_is_read_where_the_route_has_it() {
        let cases = [
            ("/sandboxes/s1", Some("s1")),
            ("/sandboxes/s-2/exec", Some("s-2")),
            ("/v1/sandboxes/a/files/x", Some("a")),
            ("/v1/sandboxes", None),
            ("/v1/sandboxes/", None),
            ("/sandboxes", None),
            ("/jobs/j1", None),
            ("/v1/images/pull", None),
        ];
        for (path, want) in cases {
            assert_eq!(sandbox_id(path), want, "{path}");
        }
    }

    #[test]
    fn unusable_client_ids_are_dropped_and_usable_ones_kept() {
        let with = |id: &str| {
            let req = Request::builder()
                .header(REQUEST_ID, id)
                .body(())
                .unwrap_or_default();
            drop_unusable_id(req)
                .headers()
                .get(REQUEST_ID)
                .map(|v| v.to_str().unwrap_or_default().to_string())
        };
        assert_eq!(with("r1").as_deref(), Some("r1"));
        assert_eq!(with(""), None);
        assert_eq!(with(&"x".repeat(129)), None);
        assert_eq!(with(&"x".repeat(128)).map(|s| s.len()), Some(128));
    }
}
