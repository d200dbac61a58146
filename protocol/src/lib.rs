//! Wire types of Orchard Env.
//!
//! This crate owns every request, response, error body and event frame that crosses a
//! process boundary, so the agent, the orchestrator, the Rust client and the OpenAPI
//! documents cannot drift apart. It is types only: no runtime, no HTTP stack, so the
//! static agent stays small and anything can depend on it.
//!
//! - [`error`]: the agent's error body ([`ErrorBody`]) and its machine-readable
//!   [`ErrorCode`], and the orchestrator's codes ([`ServiceErrorCode`], the `code` of
//!   [`compat::Detail`]), with the HTTP status each code maps to.
//! - [`exec`]: synchronous and streamed command execution ([`ExecRequest`],
//!   [`ExecResult`], [`ExecEvent`]).
//! - [`process`]: background processes with buffered output.
//! - [`session`]: persistent shell sessions.
//! - [`pty`]: terminals over WebSocket, ours and the Orchard-compatible protocol.
//! - [`files`]: file and directory operations and tar transfer.
//! - [`git`]: status, diff, apply, commit and reset of a repository.
//! - [`health`]: liveness and resource usage.
//! - [`openapi`]: the OpenAPI document of the agent API, generated from these types.
//! - [`compat`]: the orchestrator's Orchard-compatible REST API; [`sandbox`]: its `/v1/`
//!   sandbox lifecycle and images.

pub mod compat;
pub mod error;
pub mod exec;
pub mod files;
pub mod frames;
pub mod git;
pub mod health;
pub mod login;
pub mod openapi;
pub mod output;
pub mod process;
pub mod pty;
pub mod route;
pub mod sandbox;
pub mod session;
pub mod signal;
pub mod snapshot;

pub use error::{ErrorBody, ErrorCode, ServiceErrorCode};
pub use exec::{Command, ExecEvent, ExecKept, ExecRequest, ExecResult};
pub use output::{Encoding, Output};

/// Header that carries the per-sandbox token on every agent request.
pub const TOKEN_HEADER: &str = "x-orchard-token";

/// Media type of streamed exec responses: one JSON [`ExecEvent`] per line.
pub const NDJSON: &str = "application/x-ndjson";
