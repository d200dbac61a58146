//! The agent's one API error type and its HTTP mapping.
//!
//! Every module has its own `thiserror` enum saying what went wrong in its terms; each
//! converts into [`ApiError`], which carries a wire [`ErrorCode`] and a message fit for
//! a client. The status code comes from [`ErrorCode::http_status`], in the protocol
//! crate, so the mapping lives in exactly one place.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use orchard_protocol::{ErrorBody, ErrorCode};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ApiError {
    /// Machine-readable code; decides the status.
    pub code: ErrorCode,
    /// Message for the client. Must not leak internals.
    pub message: String,
}

impl ApiError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An invalid query parameter or field.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// Maps an I/O error on `path` while doing `what` to the closest code.
    pub fn io(what: &str, path: &str, err: &std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let code = match err.kind() {
            NotFound => ErrorCode::NotFound,
            PermissionDenied | ReadOnlyFilesystem => ErrorCode::PermissionDenied,
            AlreadyExists => ErrorCode::AlreadyExists,
            NotADirectory => ErrorCode::NotADirectory,
            IsADirectory => ErrorCode::IsADirectory,
            DirectoryNotEmpty => ErrorCode::DirectoryNotEmpty,
            InvalidInput | InvalidFilename => ErrorCode::InvalidArgument,
            _ => ErrorCode::Internal,
        };
        // The OS message ("No such file or directory") is safe and useful to show.
        Self::new(code, format!("{what} {path}: {}", describe_io(err)))
    }

    /// The status code of this error.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The wire body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

/// The OS's description of an I/O error without the "(os error N)" suffix.
pub fn describe_io(err: &std::io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// Result of an API handler.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_codes_without_os_error_numbers() {
        let err = std::io::Error::from_raw_os_error(libc::ENOENT);
        let api = ApiError::io("read", "/nope", &err);
        assert_eq!(api.code, ErrorCode::NotFound);
        assert_eq!(api.status(), StatusCode::NOT_FOUND);
        assert_eq!(api.message, "read /nope: No such file or directory");
    }
}
