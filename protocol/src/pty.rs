//! Terminals (PTYs): created over HTTP, used over WebSocket.
//!
//! `POST /v1/pty` starts a program on a new terminal and answers its id. Any number of
//! viewers then attach with `GET /v1/pty/{id}/attach` (WebSocket, JSON text frames):
//! each first gets the bounded scrollback, then live output; all may type, resize and
//! signal. A viewer that detaches (or vanishes) leaves the terminal running; a terminal
//! nobody watches is closed after its idle timeout. `DELETE /v1/pty/{id}` closes it.
//!
//! `GET /v1/pty/compat` speaks the Orchard-compatible protocol instead (an `init` frame
//! creates the terminal; `ready`, `stdout`, `exit`, `error` come back), so the
//! orchestrator's `/sandboxes/{id}/exec/pty` route is a plain proxy.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::exec::Command;

/// Body of `POST /v1/pty`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyCreate {
    /// What to run; default an interactive shell (bash when present, else sh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Command>,
    /// A login shell as Orchard runs one: `bash --login -i` (`-c` with `~/.bashrc`
    /// sourced first for a string command); `sh -l` in images without bash.
    #[serde(default)]
    pub login_shell: bool,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables added to the agent's environment (`TERM` defaults to `xterm-256color`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Rows; default 24.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    /// Columns; default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
    /// Close the terminal after this long without any viewer; default 10 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
}

/// A terminal, as created and listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PtyInfo {
    /// Agent-assigned id.
    pub id: String,
    /// Pid of the program (the terminal's session leader).
    pub pid: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Current rows.
    pub rows: u16,
    /// Current columns.
    pub cols: u16,
    /// False once the program has exited.
    pub alive: bool,
    /// Exit code, once exited normally.
    pub exit_code: Option<i32>,
    /// Signal, once killed by one.
    pub signal: Option<i32>,
    /// Viewers attached now.
    pub viewers: u32,
}

/// Body of `GET /v1/pty`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PtyList {
    /// Every terminal.
    pub ptys: Vec<PtyInfo>,
}

/// Body of `POST /v1/pty/{id}/resize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyResize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Client -> agent frame on `/v1/pty/{id}/attach`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyClientFrame {
    /// Keystrokes, base64.
    Stdin {
        /// Standard base64.
        data: String,
    },
    /// New window size.
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// A signal for the terminal's foreground process group (`"INT"`, `"TERM"`, ...).
    Signal {
        /// Signal name or number.
        sig: crate::signal::Signal,
    },
    /// Leave; the terminal keeps running.
    Detach,
    /// Close the terminal (its processes get SIGHUP, then SIGKILL).
    Close,
}

/// Agent -> client frame on `/v1/pty/{id}/attach`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyServerFrame {
    /// First frame: the terminal as of attaching.
    Attached {
        /// The terminal.
        pty: PtyInfo,
    },
    /// Output, base64. The first one after `attached` may be the scrollback replay.
    Output {
        /// Standard base64.
        data: String,
        /// True for the scrollback replayed on attach.
        #[serde(default)]
        replay: bool,
    },
    /// The program exited; last frame.
    Exit {
        /// Exit code, when it exited normally.
        code: Option<i32>,
        /// Signal, when killed by one.
        signal: Option<i32>,
    },
    /// A frame could not be handled; the connection stays open.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// Client -> agent frame of the Orchard-compatible protocol (`/v1/pty/compat`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CompatClientFrame {
    /// First frame: what to start.
    Init {
        /// Program and arguments; default an interactive shell.
        #[serde(default)]
        cmd: Option<Vec<String>>,
        /// Extra environment.
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// Working directory.
        #[serde(default)]
        cwd: Option<String>,
        /// Rows.
        #[serde(default)]
        rows: Option<u16>,
        /// Columns.
        #[serde(default)]
        cols: Option<u16>,
        /// Run under a login shell.
        #[serde(default)]
        login_shell: bool,
    },
    /// Keystrokes, base64.
    Stdin {
        /// Standard base64.
        data: String,
    },
    /// New window size.
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// A signal for the foreground process group.
    Signal {
        /// Signal name or number.
        sig: crate::signal::Signal,
    },
    /// Close the terminal.
    Close,
}

/// Agent -> client frame of the Orchard-compatible protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CompatServerFrame {
    /// The program started.
    Ready {
        /// Its pid.
        pid: u32,
    },
    /// Output, base64.
    Stdout {
        /// Standard base64.
        data: String,
    },
    /// The program exited.
    Exit {
        /// Exit code (128 + signal when killed by one).
        code: i32,
    },
    /// Something failed.
    Error {
        /// What.
        message: String,
    },
}

/// WebSocket close codes of the compatible protocol.
pub mod close_code {
    /// Bad token.
    pub const UNAUTHORIZED: u16 = 4401;
    /// Unknown sandbox or terminal.
    pub const NOT_FOUND: u16 = 4404;
    /// Sandbox not ready.
    pub const NOT_READY: u16 = 4409;
    /// The first frame was not a valid `init`.
    pub const BAD_FIRST_FRAME: u16 = 4400;
    /// The program could not be started.
    pub const SPAWN_FAILED: u16 = 4500;
}
