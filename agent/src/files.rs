//! File operations (placeholder: being written).

use std::sync::Arc;

use axum::Router;

use crate::server::AppState;

/// Routes of the files capability.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
}
