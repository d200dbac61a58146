//! The one error body every Orchard server answers with, and the status code of each
//! error code. Servers map their internal errors to an [`ErrorCode`] in one place; the
//! status code then follows from [`ErrorCode::http_status`], so two servers never
//! disagree on what a code means.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// JSON body of every non-2xx response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// Machine-readable reason; stable across versions.
    pub code: ErrorCode,
    /// Human-readable explanation. Never contains internals such as stack traces.
    pub message: String,
}

impl ErrorBody {
    /// Builds an error body.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The token is missing or wrong.
    Unauthorized,
    /// The body is not valid JSON or does not match the expected shape.
    InvalidJson,
    /// A query parameter or field has an invalid value.
    InvalidArgument,
    /// The request body is larger than the configured limit.
    BodyTooLarge,
    /// The route does not exist.
    RouteNotFound,
    /// The route exists, but not with this method.
    MethodNotAllowed,
    /// The path, process or resource does not exist.
    NotFound,
    /// The target exists and the request asked not to overwrite it.
    AlreadyExists,
    /// A directory was expected.
    NotADirectory,
    /// A regular file was expected.
    IsADirectory,
    /// A directory is not empty and `recursive` was not set.
    DirectoryNotEmpty,
    /// The filesystem refused the operation.
    PermissionDenied,
    /// An archive entry or path would land outside its target directory.
    UnsafePath,
    /// An uploaded archive could not be read.
    InvalidArchive,
    /// Too many commands are running at once; retry later.
    TooManyExecs,
    /// Too many background processes are tracked at once.
    TooManyProcesses,
    /// A shell-string command was given but the image has no shell.
    NoShell,
    /// The program of an argv command does not exist or is not executable.
    CommandNotFound,
    /// The working directory does not exist.
    CwdNotFound,
    /// The process could not be started (for example, the pids limit was hit).
    SpawnFailed,
    /// The process has already exited.
    ProcessExited,
    /// The process's stdin is already closed.
    StdinClosed,
    /// The agent is shutting down.
    ShuttingDown,
    /// An unexpected failure; the message says what was attempted, not how it failed inside.
    Internal,
}

impl ErrorCode {
    /// The HTTP status code this error is answered with.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            Unauthorized => 401,
            InvalidJson | InvalidArgument | UnsafePath | InvalidArchive | NoShell
            | CommandNotFound | CwdNotFound | NotADirectory | IsADirectory => 400,
            PermissionDenied => 403,
            NotFound | RouteNotFound => 404,
            MethodNotAllowed => 405,
            AlreadyExists | DirectoryNotEmpty | ProcessExited | StdinClosed => 409,
            BodyTooLarge => 413,
            // The sandbox's own pids or memory limit: its code's doing, not the agent's.
            TooManyExecs | TooManyProcesses | SpawnFailed => 429,
            Internal => 500,
            ShuttingDown => 503,
        }
    }

    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        ALL.iter()
            .find(|(code, _)| *code == self)
            .map_or("internal", |(_, name)| name)
    }
}

/// Every code with its wire name, for documentation and tests.
pub const ALL: &[(ErrorCode, &str)] = &[
    (ErrorCode::Unauthorized, "unauthorized"),
    (ErrorCode::InvalidJson, "invalid_json"),
    (ErrorCode::InvalidArgument, "invalid_argument"),
    (ErrorCode::BodyTooLarge, "body_too_large"),
    (ErrorCode::RouteNotFound, "route_not_found"),
    (ErrorCode::MethodNotAllowed, "method_not_allowed"),
    (ErrorCode::NotFound, "not_found"),
    (ErrorCode::AlreadyExists, "already_exists"),
    (ErrorCode::NotADirectory, "not_a_directory"),
    (ErrorCode::IsADirectory, "is_a_directory"),
    (ErrorCode::DirectoryNotEmpty, "directory_not_empty"),
    (ErrorCode::PermissionDenied, "permission_denied"),
    (ErrorCode::UnsafePath, "unsafe_path"),
    (ErrorCode::InvalidArchive, "invalid_archive"),
    (ErrorCode::TooManyExecs, "too_many_execs"),
    (ErrorCode::TooManyProcesses, "too_many_processes"),
    (ErrorCode::NoShell, "no_shell"),
    (ErrorCode::CommandNotFound, "command_not_found"),
    (ErrorCode::CwdNotFound, "cwd_not_found"),
    (ErrorCode::SpawnFailed, "spawn_failed"),
    (ErrorCode::ProcessExited, "process_exited"),
    (ErrorCode::StdinClosed, "stdin_closed"),
    (ErrorCode::ShuttingDown, "shutting_down"),
    (ErrorCode::Internal, "internal"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_with_its_listed_name() {
        for (code, name) in ALL {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(code.as_str(), *name);
            let status = code.http_status();
            assert!((400..600).contains(&status), "{name} -> {status}");
        }
    }

    #[test]
    fn error_body_shape_is_code_and_message() {
        let body = ErrorBody::new(ErrorCode::NoShell, "no /bin/sh in this image");
        let v = serde_json::to_value(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"code": "no_shell", "message": "no /bin/sh in this image"})
        );
    }
}
