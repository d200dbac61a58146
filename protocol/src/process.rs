//! Background processes: started with an [`crate::ExecRequest`], then listed, read,
//! written to, signalled and waited for by id.
//!
//! Each stream's output is kept in a bounded ring buffer addressed by absolute byte
//! offsets, so a reader asks "everything after offset N" and learns both where the
//! returned bytes start and how many it missed when the buffer wrapped.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::exec::ExitInfo;
pub use crate::exec::ProcessState;
use crate::signal::Signal;

/// A background process, as listed and as returned by start and wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessInfo {
    /// Agent-assigned id, used in every `/v1/processes/{id}` route.
    pub id: String,
    /// Process id inside the sandbox.
    pub pid: u32,
    /// The command as started (a shell string is shown as `[shell, "-c", string]`).
    pub argv: Vec<String>,
    /// Running or exited.
    pub state: ProcessState,
    /// How it ended, once it has.
    pub exit: Option<ExitInfo>,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Bytes written to stdout so far.
    pub stdout_bytes: u64,
    /// Bytes written to stderr so far.
    pub stderr_bytes: u64,
    /// False once stdin was closed (by the client or because the process exited).
    pub stdin_open: bool,
}

/// Body of `GET /v1/processes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessList {
    /// Running processes and exited ones still retained.
    pub processes: Vec<ProcessInfo>,
}

/// Bytes of one stream after a requested offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputChunk {
    /// Absolute offset (bytes since the process started) of the first returned byte.
    pub offset: u64,
    /// The bytes, base64.
    pub data: String,
    /// Offset to ask for next time.
    pub next_offset: u64,
    /// Bytes between the requested offset and `offset` that the ring buffer had
    /// already dropped.
    pub lost_bytes: u64,
}

/// Body of `GET /v1/processes/{id}/output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessOutput {
    /// The process, as of this read.
    pub process: ProcessInfo,
    /// Stdout after `stdout_offset`.
    pub stdout: OutputChunk,
    /// Stderr after `stderr_offset`.
    pub stderr: OutputChunk,
}

/// Body of `POST /v1/processes/{id}/stdin`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinWrite {
    /// Text to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Bytes to write, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
    /// Close stdin after writing.
    #[serde(default)]
    pub eof: bool,
}

/// Body of `POST /v1/processes/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// The signal to send.
    pub signal: Signal,
    /// Send it to the whole process group (default) or only the leader.
    #[serde(default = "default_true")]
    pub group: bool,
}

fn default_true() -> bool {
    true
}
