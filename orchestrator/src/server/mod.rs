//! The REST API: the Orchard-compatible routes ([`compat`]), our `/v1/` routes
//! ([`v1`]: lifecycle, [`snapshots`], [`proxy`]: every agent route of a sandbox,
//! [`images`]), and the operations routes (`/metrics`, `/openapi.json`).
//!
//! The routes parse, call the service and shape its answer. Requests are parsed into
//! typed values by the extractors of [`extract`] ([`ApiJson`](extract::ApiJson),
//! [`Auth`](extract::Auth)), bodies read by [`body`], and every failure is a
//! [`crate::service::Error`], turned into a response in one place ([`error`]: its
//! status, code and body). [`observe`] gives each request an id (`x-request-id`,
//! echoed) and a tracing span, logs it as one JSON line and counts it. This module only
//! builds the router.

pub mod body;
pub mod bulk;
pub mod compat;
pub mod error;
pub mod extract;
pub mod images;
pub mod job_body;
pub mod listen;
pub mod observe;
pub mod openapi;
pub mod proxy;
pub mod snapshots;
pub mod state;
pub mod v1;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::service::Error;
pub use state::AppState;

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
    let nodes = state.service.backend().nodes().unwrap_or_default().nodes;
    let body = state
        .service
        .metrics()
        .render(&state.service.counts().await, &nodes);
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
