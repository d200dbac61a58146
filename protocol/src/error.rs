//! Error codes and the status code of each, for both servers.
//!
//! - The agent answers [`ErrorBody`] (`{"code", "message"}`) with an [`ErrorCode`].
//! - The orchestrator answers [`crate::compat::Detail`] (`{"detail", "code"}`) with a
//!   [`ServiceErrorCode`]; proxied agent routes pass the agent's body through.
//!
//! Each server maps its internal errors to a code in one place; the status then follows
//! from the code's `http_status`, so a code always means the same status.

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

/// Machine-readable error codes of the orchestrator: the `code` of its error body
/// (`Detail`). The description of each code opens with its HTTP status, the one
/// `http_status` answers (a test holds them together; the SDK's tests read the statuses
/// from here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceErrorCode {
    /// HTTP 400: the request is wrong: malformed JSON, a bad value or query, an invalid
    /// sandbox id, environment variable or label, limits no sandbox here can have. A
    /// method a route does not have is answered with this code too, with status 405.
    BadRequest,
    /// HTTP 401: the API key is missing or wrong.
    Unauthorized,
    /// HTTP 403: the sandbox's filesystem refused (a read-only path, a file the image
    /// user may not write), or the key may not change the shared images.
    PermissionDenied,
    /// HTTP 404: no such sandbox, job, image, file or route, or not the caller's.
    NotFound,
    /// HTTP 408: a server-side wait ran out (a sandbox not ready in time).
    Timeout,
    /// HTTP 409: the id is taken, or the sandbox is not in a state for this (not ready yet).
    Conflict,
    /// HTTP 413: the body is larger than the route allows.
    BodyTooLarge,
    /// HTTP 422: the body is JSON of the wrong shape (a missing field, a wrong type).
    Unprocessable,
    /// HTTP 429: a quota of the API key (sandboxes held, creates per minute).
    QuotaExceeded,
    /// HTTP 500: the server failed; the message says what was attempted, not how it failed.
    Internal,
    /// HTTP 502: the sandbox could not start, or its agent failed or could not be reached.
    SandboxFailed,
    /// HTTP 503: overloaded, safe to retry; the answer carries `Retry-After`.
    Unavailable,
    /// HTTP 501: this server's backend cannot do this (snapshots on Kubernetes, process
    /// checkpoints).
    NotImplemented,
}

impl ServiceErrorCode {
    /// Every code, in the order of the enum.
    pub const ALL: [ServiceErrorCode; 13] = [
        ServiceErrorCode::BadRequest,
        ServiceErrorCode::Unauthorized,
        ServiceErrorCode::PermissionDenied,
        ServiceErrorCode::NotFound,
        ServiceErrorCode::Timeout,
        ServiceErrorCode::Conflict,
        ServiceErrorCode::BodyTooLarge,
        ServiceErrorCode::Unprocessable,
        ServiceErrorCode::QuotaExceeded,
        ServiceErrorCode::Internal,
        ServiceErrorCode::SandboxFailed,
        ServiceErrorCode::Unavailable,
        ServiceErrorCode::NotImplemented,
    ];

    /// The HTTP status code this error is answered with.
    pub fn http_status(self) -> u16 {
        use ServiceErrorCode::*;
        match self {
            BadRequest => 400,
            Unauthorized => 401,
            PermissionDenied => 403,
            NotFound => 404,
            Timeout => 408,
            Conflict => 409,
            BodyTooLarge => 413,
            Unprocessable => 422,
            QuotaExceeded => 429,
            Internal => 500,
            SandboxFailed => 502,
            Unavailable => 503,
            NotImplemented => 501,
        }
    }

    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        use ServiceErrorCode::*;
        match self {
            BadRequest => "bad_request",
            Unauthorized => "unauthorized",
            PermissionDenied => "permission_denied",
            NotFound => "not_found",
            Timeout => "timeout",
            Conflict => "conflict",
            BodyTooLarge => "body_too_large",
            Unprocessable => "unprocessable",
            QuotaExceeded => "quota_exceeded",
            Internal => "internal",
            SandboxFailed => "sandbox_failed",
            Unavailable => "unavailable",
            NotImplemented => "not_implemented",
        }
    }

    /// The code of a wire name; `None` for a name this version does not know.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl std::fmt::Display for ServiceErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The orchestrator's codes are a wire contract (docs/api.md, the SDK's error
    /// classes): every name and status is pinned here, literally.
    #[test]
    fn every_service_code_has_its_pinned_name_and_status() {
        use ServiceErrorCode::*;
        let pinned = [
            (BadRequest, "bad_request", 400),
            (Unauthorized, "unauthorized", 401),
            (PermissionDenied, "permission_denied", 403),
            (NotFound, "not_found", 404),
            (Timeout, "timeout", 408),
            (Conflict, "conflict", 409),
            (BodyTooLarge, "body_too_large", 413),
            (Unprocessable, "unprocessable", 422),
            (QuotaExceeded, "quota_exceeded", 429),
            (Internal, "internal", 500),
            (SandboxFailed, "sandbox_failed", 502),
            (Unavailable, "unavailable", 503),
            (NotImplemented, "not_implemented", 501),
        ];
        assert_eq!(ServiceErrorCode::ALL.len(), pinned.len());
        for (code, (pinned_code, name, status)) in ServiceErrorCode::ALL.into_iter().zip(pinned) {
            assert_eq!(code, pinned_code);
            assert_eq!(code.as_str(), name);
            assert_eq!(code.to_string(), name);
            assert_eq!(code.http_status(), status, "{name}");
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{name}\""));
            let back: ServiceErrorCode = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!(back, code);
            assert_eq!(ServiceErrorCode::from_name(name), Some(code));
        }
        assert_eq!(ServiceErrorCode::from_name("no_such_code"), None);
    }

    /// [`ServiceErrorCode::ALL`] lists every variant, and each variant's documentation in
    /// the schema (what the OpenAPI document and the SDK's test read) opens with its
    /// status. The schema is derived from the enum itself, so a variant missing from
    /// `ALL` shows here.
    #[test]
    fn the_schema_names_every_service_code_with_its_status() {
        let schema = serde_json::to_value(schemars::schema_for!(ServiceErrorCode)).unwrap();
        let variants = schema["oneOf"].as_array().expect("one schema per code");
        assert_eq!(variants.len(), ServiceErrorCode::ALL.len());
        for v in variants {
            let name = v["enum"][0].as_str().unwrap();
            let code = ServiceErrorCode::from_name(name).expect("a code of ALL");
            let description = v["description"].as_str().unwrap();
            let opening = format!("HTTP {}: ", code.http_status());
            assert!(description.starts_with(&opening), "{name}: {description}");
        }
    }

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
    fn the_orchestrators_body_is_detail_and_code() {
        let body = crate::compat::Detail::new(ServiceErrorCode::QuotaExceeded, "delete one");
        let v = serde_json::to_value(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"detail": "delete one", "code": "quota_exceeded"})
        );
        let bare: crate::compat::Detail = serde_json::from_str(r#"{"detail": "x"}"#).unwrap();
        assert_eq!(bare.code, None);
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
