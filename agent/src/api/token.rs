//! The agent's token: checked on every request but `/livez`, and replaceable once
//! (`PUT /v1/token`, itself authenticated) so that a warm pod started ahead with a pool
//! token can be claimed for one sandbox with a token of its own; the pool token is
//! refused from then on.
//!
//! The check reads the current token under a read lock (uncontended: a few ns per
//! request) and compares in constant time.

use std::sync::{Arc, RwLock};

use axum::extract::State;
use axum::Json;
use orchard_protocol::error::ErrorCode;
use orchard_protocol::health::{TokenRotate, TokenRotated};

use crate::error::ApiError;
use crate::server::state::AppState;

/// Shortest token accepted by a rotation.
pub const MIN_LEN: usize = 16;
/// Longest token accepted by a rotation.
pub const MAX_LEN: usize = 256;

/// The current token.
pub struct Token(RwLock<Arc<[u8]>>);

impl Token {
    /// Starts with `token`.
    pub fn new(token: &str) -> Token {
        Token(RwLock::new(token.as_bytes().into()))
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
        crate::server::router::constant_time_eq(given, &self.current())
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

/// `PUT /v1/token`.
pub async fn rotate(
    State(state): State<Arc<AppState>>,
    Json(req): Json<TokenRotate>,
) -> Result<Json<TokenRotated>, ApiError> {
    acceptable(&req.token).map_err(|m| ApiError::new(ErrorCode::InvalidArgument, m))?;
    state.token.replace(&req.token);
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
    fn short_long_or_unprintable_tokens_are_refused() {
        assert!(acceptable("short").is_err());
        assert!(acceptable(&"x".repeat(257)).is_err());
        assert!(acceptable("has a space in it!!").is_err());
        assert!(acceptable(&"a".repeat(64)).is_ok());
    }
}
