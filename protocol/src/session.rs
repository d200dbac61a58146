//! Persistent shell sessions: one long-lived shell per session, where `cd`, `export`
//! and shell functions survive between commands, as SWE-style agents expect.
//!
//! `POST /v1/sessions` starts one, `POST /v1/sessions/{id}/run` runs a command in it and
//! answers when the command is done (completion is detected by a per-command marker,
//! never by waiting), `DELETE /v1/sessions/{id}` ends it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::output::Output;

/// Body of `POST /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCreate {
    /// Shell to run; default `/bin/bash` when the image has it, else `/bin/sh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Starting directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables added to the agent's environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Brings back a captured session (`GET /v1/sessions/{id}/state`, as a snapshot keeps
    /// it): the same id, shell, directory and exact environment, then its functions
    /// defined. `shell`, `cwd` and `env` must be absent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<SessionState>,
}

/// A session's state between commands: what `GET /v1/sessions/{id}/state` answers and
/// what [`SessionCreate::restore`] takes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionState {
    /// The session's id.
    pub id: String,
    /// Its shell program.
    pub shell: String,
    /// Its shell's working directory.
    pub cwd: String,
    /// Its exported variables, exactly (variables that are not valid UTF-8 are left out).
    pub env: BTreeMap<String, String>,
    /// Its shell functions as shell text that defines them again (`declare -f` in bash;
    /// empty for shells that cannot list them, such as busybox sh).
    pub functions: String,
}

/// A session, as created and listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    /// Agent-assigned id.
    pub id: String,
    /// Pid of the shell.
    pub pid: u32,
    /// The shell program.
    pub shell: String,
    /// False once the shell has exited (for example after `exit`).
    pub alive: bool,
    /// Commands run so far.
    pub commands: u64,
}

/// Body of `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionList {
    /// Every session.
    pub sessions: Vec<SessionInfo>,
}

/// Body of `POST /v1/sessions/{id}/run`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRun {
    /// Shell text, run in the session's shell (multi-line is fine). Its stdin is
    /// `/dev/null`.
    pub command: String,
    /// Time limit in milliseconds; default the agent's default timeout. On expiry the
    /// command's processes get SIGINT (then SIGKILL), and the session stays usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Result of `POST /v1/sessions/{id}/run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionRunResult {
    /// The command's exit status as the shell saw it (`$?`); 130 after an interrupt.
    /// `None` when the shell itself ended.
    pub exit_code: Option<i32>,
    /// True when the time limit expired and the command was interrupted.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: f64,
    /// Captured stdout.
    pub stdout: Output,
    /// Captured stderr.
    pub stderr: Output,
    /// False when the shell has exited (the command ran `exit`, or it could only be
    /// stopped by killing the shell); the session must then be deleted.
    pub session_alive: bool,
}
