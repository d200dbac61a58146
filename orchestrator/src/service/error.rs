//! The service's error enum: what went wrong, in the service's terms. What the API
//! answers for each, its status and machine-readable code, is decided in one place, by
//! the server (`crate::server::error`), not here. Messages of internal failures are
//! logged, never sent: a 5xx body says what failed in user terms only.

use crate::backend::BackendError;

/// What went wrong, as the API reports it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input (malformed JSON, a bad value).
    #[error("{0}")]
    BadRequest(String),
    /// JSON of the wrong shape (missing field, wrong type).
    #[error("{0}")]
    Unprocessable(String),
    /// No or wrong API key.
    #[error("{0}")]
    Unauthorized(String),
    /// The sandbox's filesystem refused (a read-only path, a file the image user may
    /// not write).
    #[error("{0}")]
    Forbidden(String),
    /// No such sandbox, job, image or route (or not the caller's).
    #[error("{0}")]
    NotFound(String),
    /// A server-side wait ran out.
    #[error("{0}")]
    Timeout(String),
    /// The id is taken, or the sandbox is not in a state for this.
    #[error("{0}")]
    Conflict(String),
    /// The body is larger than the route allows.
    #[error("{0}")]
    TooLarge(String),
    /// A per-key quota.
    #[error("{0}")]
    Quota(String),
    /// The sandbox could not start or its agent could not be reached.
    #[error("{0}")]
    Sandbox(String),
    /// Overloaded: safe to retry.
    #[error("{0}")]
    Unavailable(String),
    /// A bug or a host failure: `public` is sent, `detail` only logged.
    #[error("{public}: {detail}")]
    Internal {
        /// What the client is told.
        public: String,
        /// What the log gets.
        detail: String,
    },
}

impl Error {
    /// What the client is told.
    pub fn public_message(&self) -> String {
        match self {
            Error::Internal { public, .. } => public.clone(),
            e => e.to_string(),
        }
    }

    /// An internal error: `public` for the client, `detail` for the log.
    pub fn internal(public: impl Into<String>, detail: impl std::fmt::Display) -> Error {
        Error::Internal {
            public: public.into(),
            detail: detail.to_string(),
        }
    }

    pub(crate) fn no_sandbox(id: &str) -> Error {
        Error::NotFound(format!("sandbox {id} not found"))
    }

    pub(crate) fn no_job(id: &str) -> Error {
        Error::NotFound(format!("job {id} not found"))
    }
}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::NotFound(id) => Error::no_sandbox(&id),
            BackendError::Invalid(m) => Error::BadRequest(m),
            BackendError::Exists(id) => Error::Conflict(format!("sandbox {id} already exists")),
            BackendError::Unavailable(m) => Error::Unavailable(m),
            BackendError::Failed(m) => Error::Sandbox(m),
        }
    }
}

/// The agent answered an error or could not be reached.
impl From<orchard_client::ClientError> for Error {
    fn from(e: orchard_client::ClientError) -> Self {
        match e {
            orchard_client::ClientError::Api { status, body } => match status.as_u16() {
                404 => Error::NotFound(body.message),
                400 | 422 => Error::BadRequest(body.message),
                // Regression: a write to a read-only path was a 502.
                403 => Error::Forbidden(body.message),
                408 => Error::Timeout(body.message),
                409 => Error::Conflict(body.message),
                413 => Error::TooLarge(body.message),
                429 | 503 => Error::Unavailable(body.message),
                _ => Error::Sandbox(format!("the sandbox's agent failed: {}", body.message)),
            },
            e => Error::Sandbox(format!("the sandbox's agent could not be reached: {e}")),
        }
    }
}
