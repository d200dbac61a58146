//! Running a command: the request, the synchronous result, and the frames of a streamed
//! run.
//!
//! `POST /v1/exec` answers one [`ExecResult`] when the command ends.
//! `POST /v1/exec/stream` answers `application/x-ndjson`: one [`ExecEvent`] per line,
//! `start` first, then `stdout`/`stderr` chunks in the order they were read, `keepalive`
//! frames while nothing happens, and `exit` (or `error`) last.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::output::Output;
use crate::ErrorCode;

/// What to run: an argv vector (run directly, no shell needed) or a shell string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Command {
    /// Program and arguments; the program is looked up on `PATH` when it has no `/`.
    Argv(Vec<String>),
    /// A string run as `<shell> -c <string>`.
    Shell(String),
}

/// Request body of `POST /v1/exec`, `POST /v1/exec/stream` and `POST /v1/processes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The command.
    pub command: Command,
    /// Shell for a string command; default `/bin/sh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Working directory; default the agent's own (the image's WorkingDir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables added to (and overriding) the agent's environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Bytes written to stdin as UTF-8 text, then stdin is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Bytes written to stdin, base64; alternative to `stdin` for binary input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_b64: Option<String>,
    /// Time limit in milliseconds; default the agent's `--default-timeout-ms`. On
    /// expiry the process group gets SIGTERM, then SIGKILL after a grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Cap per stream in bytes (head and tail are kept); default the agent's
    /// `--max-output-bytes`, and never above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Streamed exec only: kill the process group when the client goes away.
    /// Default false: a dropped client kills nothing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub kill_on_disconnect: bool,
    /// Report a time-out as Orchard (and coreutils `timeout`) do: `exit_code` 124 and
    /// a last stderr line `Command timed out after Ns and was killed`. `timed_out` and
    /// `signal` are set as always. Default false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub timeout_exit_124: bool,
    /// `POST /v1/exec` only: run the command to its end whether or not the caller
    /// stays, under this id (1 to 128 of `A-Z a-z 0-9 . _ -`). While it runs,
    /// `GET /v1/exec/results/{id}` waits for it; if the caller went away before it
    /// ended, its result is kept for that route (the newest
    /// [`KEPT_RESULTS`] for [`KEPT_FOR_SECS`] seconds). A result its caller received
    /// is not kept. An id in use (running or kept) is refused (`already_exists`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_id: Option<String>,
}

/// How many results of `POST /v1/exec` calls whose caller went away the agent keeps.
pub const KEPT_RESULTS: usize = 4;

/// How long the agent keeps such a result, in seconds.
pub const KEPT_FOR_SECS: u64 = 600;

/// Body of `GET /v1/exec/results/{id}`: a command run with a `result_id`, running or
/// ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecKept {
    /// The `result_id` it was run with.
    pub id: String,
    /// Running, or exited (then `result` is set).
    pub state: ProcessState,
    /// Its result, once it ended: what `POST /v1/exec` answered or would have.
    pub result: Option<ExecResult>,
}

/// Exit code of a command killed by its time limit, under the Orchard convention.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// `N` in Orchard's time-out messages: whole seconds without a fraction (`300`),
/// others as short as they print (`0.5`).
fn limit_secs(limit: Duration) -> String {
    let s = limit.as_secs_f64();
    if limit.subsec_nanos() == 0 {
        format!("{}", limit.as_secs())
    } else {
        format!("{s}")
    }
}

/// The job `error` of a command killed by its time limit: `Command timed out after Ns`.
pub fn timeout_error(limit: Duration) -> String {
    format!("Command timed out after {}s", limit_secs(limit))
}

/// The line that ends the stderr of a command killed by its time limit:
/// `Command timed out after Ns and was killed`.
pub fn timeout_stderr_line(limit: Duration) -> String {
    format!("{} and was killed\n", timeout_error(limit))
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for Command {
    fn default() -> Self {
        Command::Argv(Vec::new())
    }
}

/// Result of `POST /v1/exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecResult {
    /// Exit code when the process exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the process was killed by a signal.
    pub signal: Option<i32>,
    /// True when the time limit expired and the process group was killed.
    pub timed_out: bool,
    /// Wall time from spawn to exit, in milliseconds.
    pub duration_ms: f64,
    /// Process id of the command inside the sandbox.
    pub pid: u32,
    /// Captured stdout.
    pub stdout: Output,
    /// Captured stderr.
    pub stderr: Output,
}

// Here, beside `ExitInfo`, so that `process` builds on `exec` and not both ways.
/// Whether a background process is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// Still running.
    Running,
    /// Ended; `exit` says how.
    Exited,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExitInfo {
    /// Exit code when the process exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the process was killed by a signal.
    pub signal: Option<i32>,
    /// True when the time limit expired and the process group was killed.
    pub timed_out: bool,
    /// Wall time from spawn to exit, in milliseconds.
    pub duration_ms: f64,
}

/// One line of a streamed exec (`application/x-ndjson`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The process started.
    Start {
        /// Its pid inside the sandbox.
        pid: u32,
    },
    /// Bytes read from stdout, base64.
    Stdout {
        /// Standard base64.
        data: String,
    },
    /// Bytes read from stderr, base64.
    Stderr {
        /// Standard base64.
        data: String,
    },
    /// Sent when nothing else was for a while, so proxies keep the connection.
    Keepalive,
    /// The process ended; always the last frame of a successful stream.
    Exit {
        /// How it ended.
        #[serde(flatten)]
        exit: ExitInfo,
        /// Bytes written to stdout in total.
        stdout_bytes: u64,
        /// Bytes written to stderr in total.
        stderr_bytes: u64,
    },
    /// The stream failed; last frame.
    Error {
        /// Machine-readable reason.
        code: ErrorCode,
        /// Human-readable explanation.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_is_a_string_or_an_array() {
        let r: ExecRequest = serde_json::from_str(r#"{"command":"echo hi"}"#).unwrap();
        assert_eq!(r.command, Command::Shell("echo hi".into()));
        let r: ExecRequest = serde_json::from_str(r#"{"command":["ls","-l"]}"#).unwrap();
        assert_eq!(r.command, Command::Argv(vec!["ls".into(), "-l".into()]));
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused() {
        assert!(serde_json::from_str::<ExecRequest>(r#"{"command":"x","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<ExecRequest>(r#"{"command":5}"#).is_err());
        assert!(serde_json::from_str::<ExecRequest>(r#"{}"#).is_err());
    }

    #[test]
    fn timeout_messages_are_orchards() {
        assert_eq!(
            timeout_error(Duration::from_secs(300)),
            "Command timed out after 300s"
        );
        assert_eq!(
            timeout_stderr_line(Duration::from_millis(500)),
            "Command timed out after 0.5s and was killed\n"
        );
    }

    #[test]
    fn exit_frame_is_flat() {
        let ev = ExecEvent::Exit {
            exit: ExitInfo {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                duration_ms: 1.5,
            },
            stdout_bytes: 3,
            stderr_bytes: 0,
        };
        let v = serde_json::to_value(&ev).unwrap();
        assert_eq!(v["type"], "exit");
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["stdout_bytes"], 3);
        let back: ExecEvent = serde_json::from_value(v).unwrap();
        assert_eq!(back, ev);
    }
}
