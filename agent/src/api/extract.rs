//! Request extractors and body helpers shared by the capability modules: JSON bodies
//! and query strings refused with the API's own error body, and bodies read within a
//! limit.
//!
//! [`JsonBody`] reads its limit from whatever state the router serves, through
//! [`BodyLimit`]'s `FromRef`, so a capability needs to know nothing of that state
//! beyond the limit.

use axum::extract::{FromRef, FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use http_body_util::BodyExt;
use orchard_protocol::ErrorCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// The largest JSON request body, in bytes (`--max-body-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimit(pub u64);

/// A JSON request body, read up to the [`BodyLimit`] and parsed into `T`; failures are
/// answered as `body_too_large` or `invalid_json` with serde's description.
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
    BodyLimit: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let BodyLimit(limit) = BodyLimit::from_ref(state);
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

/// Query parameters parsed like `Query`, but refused with the API's own error body.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(value)| ApiQuery(value))
            .map_err(|err| ApiError::invalid(err.body_text()))
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
