//! The agent's token: checked on every request but `/livez`, and replaceable once
//! (`PUT /v1/token`, itself authenticated) so that a warm pod started ahead with a pool
//! token can be claimed for one sandbox with a token of its own; the pool token is
//! refused from then on.
//!
//! The check reads the current token under a read lock (uncontended: a few ns per
//! request) and compares in constant time. [`Token`] is this capability's whole state,
//! shared with the server's gate, which checks every request against it.

use std::sync::{Arc, RwLock};

use axum::extract::{FromRef, State};
use axum::routing::put;
use axum::{Json, Router};
use orchard_protocol::error::ErrorCode;
use orchard_protocol::health::{TokenRotate, TokenRotated};

use crate::error::ApiError;

/// Shortest token accepted by a rotation.
pub const MIN_LEN: usize = 16;
/// Longest token accepted by a rotation.
pub const MAX_LEN: usize = 256;

/// The current token; clones share it, so a rotation is seen by every holder.
#[derive(Clone)]
pub struct Token(Arc<RwLock<Arc<[u8]>>>);

impl Token {
    /// Starts with `token`.
    pub fn new(token: &str) -> Token {
        Token(Arc::new(RwLock::new(token.as_bytes().into())))
    }

    fn current(&self) -> Arc<[u8]> {
        // A poisoned lock still holds a whole token: rotation swaps one Arc.
        match self.0.read() {
            Ok(t) => t.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether `given` is the current token (constant time in its contents).
    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(given, &self.current())
    }

    /// Replaces the token.
    pub fn replace(&self, token: &str) {
        let new: Arc<[u8]> = token.as_bytes().into();
        match self.0.write() {
            Ok(mut t) => *t = new,
            Err(p) => *p.into_inner() = new,
        }
    }
}

/// Compares two byte strings in time that does not depend on their contents (`subtle`
/// answers at once when the lengths differ; a token's length is no secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(a, b))
}

/// Whether `token` may become the agent's token.
pub fn acceptable(token: &str) -> Result<(), String> {
    if !(MIN_LEN..=MAX_LEN).contains(&token.len()) {
        return Err(format!(
            "the token must be {MIN_LEN} to {MAX_LEN} characters, not {}",
            token.len()
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token must be printable ASCII without spaces".into());
    }
    Ok(())
}

/// Routes of the token capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Token: FromRef<S>,
{
    Router::new().route("/v1/token", put(rotate))
}

/// `PUT /v1/token`.
async fn rotate(
    State(token): State<Token>,
    Json(req): Json<TokenRotate>,
) -> Result<Json<TokenRotated>, ApiError> {
    acceptable(&req.token).map_err(|m| ApiError::new(ErrorCode::InvalidArgument, m))?;
    token.replace(&req.token);
    Ok(Json(TokenRotated { rotated: true }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_token_refuses_the_old_one() {
        let t = Token::new("pool-token-0123456789");
        assert!(t.matches(b"pool-token-0123456789"));
        t.replace("claimed-token-abcdefghij");
        assert!(!t.matches(b"pool-token-0123456789"));
        assert!(t.matches(b"claimed-token-abcdefghij"));
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

    #[test]
    fn short_long_or_unprintable_tokens_are_refused() {
        assert!(acceptable("short").is_err());
        assert!(acceptable(&"x".repeat(257)).is_err());
        assert!(acceptable("has a space in it!!").is_err());
        assert!(acceptable(&"a".repeat(64)).is_ok());
    }
}
