//! Wire types of the Orchard-compatible REST API the orchestrator serves (see
//! `../shared/COMPAT.md`): field names, optionality and defaults are the contract that
//! users' existing code speaks, so they are spelled exactly as there.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ServiceErrorCode;

fn yes() -> bool {
    true
}

fn thirty() -> u64 {
    30
}

/// Body of `POST /sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateSandbox {
    /// Image reference (`python:3.11-slim`).
    pub image: String,
    /// Deny all egress (default true).
    #[serde(default = "yes")]
    pub block_network: bool,
    /// The id to give it; generated when absent.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// CPU limit like `"4"` or `"2000m"`.
    #[serde(default)]
    pub cpu: Option<String>,
    /// Memory limit like `"16Gi"` or `"512Mi"`.
    #[serde(default)]
    pub memory: Option<String>,
    /// Seconds allowed for the sandbox to become ready.
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// Answer of `POST /sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreatedSandbox {
    /// Its id.
    pub sandbox_id: String,
    /// Where it runs (`local` on the local backend).
    pub namespace: String,
    /// The image as asked for.
    pub image: String,
    /// Egress denied.
    pub block_network: bool,
    /// CPU limit: as asked for, or the server's default (`"4"` unless the operator
    /// set another), lowered to the host's CPUs on the local backend.
    pub cpu: String,
    /// Memory limit: as asked for, or the server's default (`"16Gi"` unless the
    /// operator set another), lowered to the host's memory on the local backend.
    pub memory: String,
    /// Readiness time limit in seconds.
    pub timeout: u64,
    /// Always `pending`.
    pub status: String,
    /// What the create has to say (an extra of ours): a limit above what the host has,
    /// lowered to it (then `cpu` and `memory` are the lowered values). Left out when
    /// there is nothing to say, so the answer keeps Orchard's exact shape.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status_message: String,
    /// Default working directory of its commands and relative paths (an extra of ours:
    /// the operator's default, `/workspace` unless set otherwise).
    pub working_dir: String,
}

/// Answer of `GET /sandboxes/{id}` and `GET /sandboxes/{id}/wait`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxStatus {
    /// Its id.
    pub sandbox_id: String,
    /// Where it runs.
    pub namespace: String,
    /// The image as asked for.
    pub image: String,
    /// Name of the pod (the sandbox id on the local backend).
    pub pod_name: String,
    /// Egress denied.
    pub block_network: bool,
    /// CPU limit (as asked for, or the default).
    pub cpu: String,
    /// Memory limit (as asked for, or the default).
    pub memory: String,
    /// Unix epoch seconds.
    pub created_at: f64,
    /// True once commands can run.
    pub ready: bool,
    /// [`SandboxPhase`]: `pending`, `ready`, `unschedulable` or `failed`.
    pub status: SandboxPhase,
    /// Why it failed, or what it waits for; empty when there is nothing to say.
    pub status_message: String,
    /// Default working directory of its commands (an extra of ours).
    pub working_dir: String,
}

/// Where a sandbox is, as Orchard reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxPhase {
    /// Being created (image pull, start, waiting for the agent).
    Pending,
    /// Commands run.
    Ready,
    /// No node can hold it (`status_message` says why).
    Unschedulable,
    /// Could not start, or stopped on its own.
    Failed,
}

/// A command: a shell string or an argv list quoted element by element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CompatCommand {
    /// Run by the shell as is.
    Shell(String),
    /// Quoted element by element, then run by the shell.
    Argv(Vec<String>),
}

/// Body of `POST /sandboxes/{id}/exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecJob {
    /// The command.
    pub command: CompatCommand,
    /// Time limit in seconds.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Working directory; default `/workspace` when it exists, else `/`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Run under `bash -lc` (else `bash -c`; `sh` when there is no bash).
    #[serde(default)]
    pub login_shell: bool,
    /// Answer the finished job instead of `{job_id, status: "queued"}`.
    #[serde(default)]
    pub wait: bool,
}

/// Answer of `POST /sandboxes/{id}/exec` with `wait=false`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueuedJob {
    /// The job's id.
    pub job_id: String,
    /// Always `queued`.
    pub status: String,
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting for the jobs before it on its sandbox.
    Queued,
    /// Running.
    Running,
    /// Ran and exited 0.
    Succeeded,
    /// Exited non-zero, or could not run (`error` says why), or timed out.
    Failed,
}

impl JobStatus {
    /// Succeeded or failed.
    pub fn is_finished(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed)
    }
}

/// A job: `GET /jobs/{id}`, `GET /jobs/{id}/wait`, and exec with `wait=true`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Job {
    /// Its id.
    pub job_id: String,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// The command as submitted.
    pub command: CompatCommand,
    /// Where it is.
    pub status: JobStatus,
    /// Output so far (all of it once finished), UTF-8 with invalid bytes replaced.
    pub stdout: String,
    /// Error output.
    pub stderr: String,
    /// Exit code (128 + signal when killed by one, 124 when killed by its time limit);
    /// null until finished or when the command could not run.
    pub exit_code: Option<i32>,
    /// When it was submitted, Unix epoch seconds.
    pub created_at: f64,
    /// When it started running, Unix epoch seconds.
    pub started_at: Option<f64>,
    /// When it finished, Unix epoch seconds.
    pub completed_at: Option<f64>,
    /// Set only when the command could not be run or timed out.
    pub error: Option<String>,
    /// An extra of ours: true when a stream passed the server's per-job output cap
    /// (64 MiB per stream unless the operator set another); its first and last halves
    /// are kept, joined by a line saying how much was left out.
    #[serde(default)]
    pub output_truncated: bool,
}

/// Body of `POST /sandboxes/{id}/apply_patch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApplyPatch {
    /// A unified diff, as `git diff` prints it.
    pub patch: String,
    /// Time limit in seconds.
    #[serde(default = "thirty")]
    pub timeout_seconds: u64,
}

/// Answer of `POST /sandboxes/{id}/apply_patch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PatchResult {
    /// The whole patch applied.
    pub success: bool,
    /// What applied.
    pub stdout: String,
    /// Why it did not.
    pub stderr: String,
    /// 0 on success, 1 when the patch does not apply.
    pub exit_code: i32,
    /// Set when the patch could not be tried at all.
    pub error: Option<String>,
}

/// Body of `POST /sandboxes/{id}/files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UploadFile {
    /// Where; relative paths are under the default working directory.
    pub path: String,
    /// The bytes, standard base64.
    pub content: String,
}

/// Answer of `POST /sandboxes/{id}/files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Uploaded {
    /// Always true (failures are errors).
    pub success: bool,
    /// The path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// Answer of `GET /sandboxes/{id}/files?path=P`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileContent {
    /// The path read.
    pub path: String,
    /// The bytes, standard base64.
    pub content: String,
    /// Bytes.
    pub size: u64,
}

/// One entry of `GET /sandboxes/{id}/files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListedFile {
    /// Last path component.
    pub name: String,
    /// `file` or `directory` (links and others are reported as `file`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Last modification, ISO-8601 UTC (as Orchard lists it).
    pub modified: String,
}

/// Answer of `GET /sandboxes/{id}/files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileListing {
    /// The listed directory.
    pub path: String,
    /// Its entries, sorted by name.
    pub files: Vec<ListedFile>,
    /// An extra of ours: true when the directory holds more entries than one listing
    /// returns (10,000); the list is then cut, never silently.
    #[serde(default)]
    pub truncated: bool,
}

/// Answer of `DELETE /sandboxes/{id}` and `POST /sandboxes/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxAck {
    /// `deleted` or `ok`.
    pub status: String,
    /// The sandbox.
    pub sandbox_id: String,
}

/// Error body of the orchestrator: `detail` is what compatible clients read, `code`
/// is machine-readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Detail {
    /// What went wrong.
    pub detail: String,
    /// Machine-readable code (`not_found`, `quota_exceeded`, ...).
    #[serde(default)]
    pub code: Option<ServiceErrorCode>,
}

impl Detail {
    /// An error body with its code.
    pub fn new(code: ServiceErrorCode, detail: impl Into<String>) -> Self {
        Self {
            detail: detail.into(),
            code: Some(code),
        }
    }
}

/// Labels and environment of a `/v1` create.
pub type StringMap = BTreeMap<String, String>;
