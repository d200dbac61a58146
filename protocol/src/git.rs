//! Git operations on a repository inside the sandbox (placeholder: being written).

use crate::openapi::Route;

/// Routes of the git capability.
pub const GIT_ROUTES: &[Route] = &[];
