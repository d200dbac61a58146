//! What the routes take from a request, typed: JSON bodies ([`ApiJson`]), path
//! parameters ([`ApiPath`]), queries ([`ApiQuery`], [`WaitQuery`]) and the caller
//! ([`Auth`]: the API key from a header, or on a WebSocket from `?api_key=` or a
//! subprotocol). Each refusal is a [`crate::service::Error`] with a `detail`, like every
//! other bad input, never axum's plain-text rejection.

use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::body::{read_limited, MAX_JSON};
use super::state::AppState;
use crate::service::json::parse_json;
use crate::service::{Error, Tenant};

/// Largest WebSocket message (and frame) a client may send: a terminal's input or a
/// stream's stdin comes in pieces far below it (tungstenite's default, 64 MiB, let 16
/// connections take 1.8 GB).
pub const MAX_WS_MESSAGE: usize = 4 << 20;

/// Longest server-side wait a request may ask for.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// A JSON body of type `T`: malformed JSON is 400, the wrong shape 422, a body over
/// `LIMIT` ([`MAX_JSON`] by default) 413, all with a `detail` saying what is wrong.
pub struct ApiJson<T, const LIMIT: usize = MAX_JSON>(pub T);

impl<S: Send + Sync, T: DeserializeOwned, const LIMIT: usize> FromRequest<S> for ApiJson<T, LIMIT> {
    type Rejection = Error;

    async fn from_request(req: Request, _: &S) -> Result<Self, Error> {
        let (parts, body) = req.into_parts();
        let bytes = read_limited(&parts.headers, body, LIMIT).await?;
        parse_json(&bytes).map(ApiJson)
    }
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

/// A query parsed with the API's errors.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Error> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|q| ApiQuery(q.0))
            .map_err(|e| Error::BadRequest(format!("invalid query: {}", e.body_text())))
    }
}

/// `?timeout=S` (seconds, fractional allowed), clamped to `MAX_WAIT` (an hour).
#[derive(Deserialize)]
pub struct WaitQuery {
    timeout: Option<String>,
}

impl WaitQuery {
    /// The wait, or `default`.
    pub fn duration(&self, default: Duration) -> Result<Duration, Error> {
        match &self.timeout {
            None => Ok(default),
            Some(t) => {
                let s: f64 = t.trim().parse().map_err(|_| {
                    Error::BadRequest(format!("timeout {t:?}: expected seconds, like 30 or 0.5"))
                })?;
                if !s.is_finite() || s < 0.0 {
                    return Err(Error::BadRequest(format!(
                        "timeout {t:?}: must be zero or more seconds"
                    )));
                }
                // Cut before converting: a Duration cannot hold 1e20 seconds.
                Ok(Duration::from_secs_f64(s.min(MAX_WAIT.as_secs_f64())))
            }
        }
    }
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

/// The API key of a WebSocket upgrade: header, `?api_key=`, or subprotocol
/// `api_key.<key>` (answered back as the chosen subprotocol).
pub fn ws_key(headers: &HeaderMap, query: Option<&str>) -> (Option<String>, Option<String>) {
    if let Some(k) = presented_key(headers) {
        return (Some(k.to_string()), None);
    }
    if let Some(q) = query {
        for (k, v) in url_pairs(q) {
            if k == "api_key" {
                return (Some(v), None);
            }
        }
    }
    let protocols = headers
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    for p in protocols.split(',').map(str::trim) {
        if let Some(k) = p.strip_prefix("api_key.") {
            return (Some(k.to_string()), Some(p.to_string()));
        }
    }
    (None, None)
}

/// `a=b&c=d` decoded as `application/x-www-form-urlencoded` (`+` is a space), the way
/// every other query of the API is read ([`ApiQuery`]).
pub fn url_pairs(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The caller, authenticated.
pub struct Auth(pub Tenant);

impl FromRequestParts<AppState> for Auth {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Error> {
        let ws_key_owned;
        let mut key = presented_key(&parts.headers);
        // Browsers cannot set headers on a WebSocket: `?api_key=` and the `api_key.<key>`
        // subprotocol are accepted there, on every WebSocket route (docs/api.md).
        if key.is_none() && is_websocket(&parts.headers) {
            ws_key_owned = ws_key(&parts.headers, parts.uri.query()).0;
            key = ws_key_owned.as_deref();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        url_pairs(q)
    }

    fn p(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn query_pairs_decode_like_every_other_query_odd_input_included() {
        assert_eq!(
            pairs("api_key=a%2Bb+c&x=%41"),
            [p("api_key", "a+b c"), p("x", "A")]
        );
        // Empty pieces are skipped; a key without `=` has an empty value.
        assert_eq!(pairs("&&k&=v&"), [p("k", ""), p("", "v")]);
        // Malformed escapes stay as they are; bytes that are not UTF-8 become U+FFFD.
        assert_eq!(
            pairs("a=%zz&b=%4&c=%"),
            [p("a", "%zz"), p("b", "%4"), p("c", "%")]
        );
        assert_eq!(pairs("a=%ff%fe"), [p("a", "\u{fffd}\u{fffd}")]);
        assert_eq!(pairs("a=%C3%A9"), [p("a", "é")]);
        assert_eq!(pairs("a=b=c"), [p("a", "b=c")]);
        assert!(pairs("").is_empty());
    }

    #[test]
    fn a_websocket_key_comes_from_a_header_then_the_query_then_a_subprotocol() {
        let headers = |h: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in h {
                m.insert(*k, v.parse().unwrap());
            }
            m
        };
        let proto = [("sec-websocket-protocol", "chat, api_key.k3")];
        assert_eq!(
            ws_key(&headers(&[("x-api-key", "k1")]), Some("api_key=k2")),
            (Some("k1".into()), None)
        );
        assert_eq!(
            ws_key(&headers(&[("authorization", "Bearer k1")]), None),
            (Some("k1".into()), None)
        );
        assert_eq!(
            ws_key(&headers(&proto), Some("x=1&api_key=k%202&api_key=other")),
            (Some("k 2".into()), None)
        );
        assert_eq!(
            ws_key(&headers(&proto), Some("x=1")),
            (Some("k3".into()), Some("api_key.k3".into()))
        );
        assert_eq!(ws_key(&headers(&[]), None), (None, None));
    }
}
