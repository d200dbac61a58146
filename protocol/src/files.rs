//! Files and directories inside the sandbox.
//!
//! File contents travel as raw request and response bodies (`application/octet-stream`),
//! never as JSON, so they stream and cost no base64. Metadata and the small operations
//! (mkdir, move, remove) are JSON. Directory trees travel as tar (upload: plain or
//! gzip, detected from the bytes) and tar.gz (download).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (never followed by stat or list).
    Symlink,
    /// Anything else: device, fifo, socket.
    Other,
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileStat {
    /// The path, as asked for (list: the full path of the entry).
    pub path: String,
    /// Last path component.
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o7777` part of the mode).
    pub mode: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub modified_ms: i64,
    /// Target of a symbolic link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// Body of `GET /v1/files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileList {
    /// The listed directory.
    pub path: String,
    /// Entries, sorted by path; with `depth > 1`, entries of subdirectories follow
    /// their directory.
    pub entries: Vec<FileStat>,
    /// True when the listing stopped at the entry limit.
    pub truncated: bool,
}

/// Answer of `PUT /v1/files` (write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WriteResult {
    /// The written path.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// Body of `POST /v1/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Directory to create, with its missing parents.
    pub path: String,
    /// Permission bits of created directories; default `0o755`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// Body of `POST /v1/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// Existing path.
    pub from: String,
    /// New path; its parent directories are created.
    pub to: String,
    /// Replace `to` when it exists (default false: `already_exists`).
    #[serde(default)]
    pub overwrite: bool,
}

/// Answer of `PUT /v1/files/archive` (tar upload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtractResult {
    /// Directory the archive was extracted into.
    pub path: String,
    /// Entries extracted.
    pub entries: u64,
    /// Bytes of file content extracted.
    pub bytes: u64,
}

/// Answer of operations that return nothing else (mkdir, move, remove).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Done {
    /// The path acted on.
    pub path: String,
}
