//! HTTP transport: the router, the gate every request passes (token, shutdown), and
//! draining what a handler left unread. Handlers live in their capability's module
//! under [`crate::api`], each with its own routes and state; this module only merges
//! them over [`AppState`] ([`super::state`]), which hands each its part.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use orchard_protocol::{ErrorCode, TOKEN_HEADER};

use super::state::{AppState, Gate};
use crate::api;
use crate::error::ApiError;

async fn require_token(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .or_else(|| {
            req.headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        });
    let ok = given.is_some_and(|t| gate.token.matches(t));
    if !ok {
        return ApiError::new(
            ErrorCode::Unauthorized,
            format!("missing or wrong token: send it in the {TOKEN_HEADER} header"),
        )
        .into_response();
    }
    if gate.shutting_down.load(Ordering::Relaxed) {
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
pub fn router(state: AppState) -> Router {
    let authed = Router::new()
        .merge(api::health::routes())
        .merge(api::token::routes())
        .merge(api::exec::routes())
        .merge(api::process::routes())
        .merge(api::session::routes())
        .merge(api::pty::routes())
        .merge(api::files::routes())
        .merge(api::git::routes())
        .fallback(route_not_found)
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(middleware::from_fn_with_state(
            state.gate.clone(),
            require_token,
        ));
    Router::new()
        .route("/livez", get(livez))
        .merge(authed)
        .layer(middleware::from_fn(drain_unread))
        .with_state(Arc::new(state))
}

#[cfg(test)]
mod tests {
    use crate::server::test_http;

    #[tokio::test]
    async fn regression_an_unsupported_method_is_405_and_its_body_is_read_before_the_answer() {
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
}
