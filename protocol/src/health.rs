//! Health and resource usage of a sandbox, as its agent sees it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Body of `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Health {
    /// Always `"ok"` when the agent answers.
    pub status: String,
    /// Agent version.
    pub version: String,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// Whether the agent has PID 1's duties in its sandbox: it is PID 1, or its parent,
    /// the agent's own init, is (see the agent's `init` module).
    pub pid1: bool,
    /// Processes visible in the sandbox, the agent included.
    pub processes: u64,
    /// Commands (sync or streamed) running right now.
    pub running_execs: u64,
    /// Background processes tracked (running or retained).
    pub tracked_processes: u64,
    /// Memory used by the sandbox in bytes (its cgroup when readable, else the sum of
    /// resident sets).
    pub memory_bytes: u64,
    /// CPU time used by the sandbox, in milliseconds.
    pub cpu_ms: u64,
    /// Where `memory_bytes` and `cpu_ms` come from: `"cgroup"` or `"procfs"`.
    pub usage_source: String,
    /// The limits in force.
    pub limits: Limits,
}

/// Limits an agent enforces; each has a default and its own error code when hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Limits {
    /// Largest JSON request body in bytes (`body_too_large`).
    pub max_body_bytes: u64,
    /// Largest uploaded file or archive in bytes (`body_too_large`).
    pub max_upload_bytes: u64,
    /// Commands running at once, sync, streamed and background (`too_many_execs`).
    pub max_concurrent_execs: u64,
    /// Per-stream output cap of a sync exec in bytes (`truncated` flag), when the
    /// request sets none.
    pub max_output_bytes: u64,
    /// Largest per-stream cap a request may ask for (`max_output_bytes` of the request);
    /// the output is held in the agent's memory, inside the sandbox's own limit.
    #[serde(default)]
    pub max_output_ceiling_bytes: u64,
    /// Ring buffer per stream of a background process in bytes (`lost_bytes`).
    pub process_buffer_bytes: u64,
    /// Timeout of a command that sets none, in milliseconds (`timed_out` flag).
    pub default_timeout_ms: u64,
    /// How long an exited background process stays retrievable, in milliseconds.
    pub process_retention_ms: u64,
}

/// Request body of `PUT /v1/token`: the token that replaces the agent's current one
/// (a warm pod claimed for a sandbox gets a token of its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRotate {
    /// The new token: 16 to 256 printable ASCII characters.
    pub token: String,
}

/// Answer of `PUT /v1/token`: from now on only the new token is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TokenRotated {
    /// Always true.
    pub rotated: bool,
}
