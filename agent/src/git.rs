//! Git operations through libgit2 (placeholder: being written).

use std::sync::Arc;

use axum::Router;

use crate::server::AppState;

/// Routes of the git capability.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
}
