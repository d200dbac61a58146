//! The records the store holds, as data: sandboxes ([`SandboxRecord`], its [`Phase`] and
//! [`AgentRecord`]), jobs ([`JobRecord`], [`JobOptions`], read as a [`JobView`]),
//! leases and the topics of notifications. A leaf of [`crate::state`]: every store and
//! the service use them; they import no store.

use std::collections::BTreeMap;
use std::time::Duration;

use orchard_protocol::compat::Job;
use serde::{Deserialize, Serialize};

use super::spill::read_file as read_output;
use crate::backend::AgentEndpoint;

/// What a job's stdout says once its output was dropped for the budget.
pub const DROPPED_NOTE: &str =
    "[orchard: this job's output was dropped: the server's job output budget was full]\n";

/// A job as [`StateStore::job_view`](super::StateStore::job_view) answers it.
#[derive(Debug)]
pub struct JobView {
    /// The record; its output is empty when `output` holds it.
    pub record: JobRecord,
    /// The output's own file, opened when the job was read (a purge after that does
    /// not cut the answer short).
    pub output: Option<OutputFile>,
}

/// A job's output in its file: stdout's bytes, then stderr's (valid UTF-8 each).
#[derive(Debug)]
pub struct OutputFile {
    /// The file, open for reading.
    pub file: std::fs::File,
    /// Bytes of stdout, at the start of the file.
    pub stdout_len: u64,
    /// Bytes of stderr, after stdout's.
    pub stderr_len: u64,
}

impl JobView {
    /// The record with its output in it, read from the file if need be (blocking: a
    /// file read of up to the output cap).
    pub fn into_record(self) -> JobRecord {
        let mut record = self.record;
        if let Some(out) = self.output {
            match read_output(&out.file, out.stdout_len) {
                Ok((stdout, stderr)) => {
                    record.job.stdout = stdout;
                    record.job.stderr = stderr;
                }
                Err(e) => {
                    let id = &record.job.job_id;
                    tracing::warn!(job_id = %id, error = %e, "a job's spilled output is unreadable");
                    record.job.stdout = DROPPED_NOTE.to_string();
                    record.job.output_truncated = true;
                }
            }
        }
        record
    }
}

/// The version of a stored sandbox record: different after every write.
pub type Version = u64;

/// Where a sandbox is in its life, as data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Being created.
    Pending,
    /// Its agent answers: commands run.
    Ready,
    /// Could not start, or stopped on its own.
    Failed {
        /// Why, for the user.
        message: String,
    },
}

impl Phase {
    /// `pending`, `running` or `failed` (the metrics' and `/health`'s names).
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Ready => "running",
            Phase::Failed { .. } => "failed",
        }
    }
}

/// A ready sandbox's agent, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// How to reach it.
    pub endpoint: AgentEndpoint,
    /// Its per-sandbox token.
    pub token: String,
    /// When it became ready, ms since the epoch.
    pub ready_ms: u64,
    /// `bash` when the image has it, else `sh`.
    pub shell: String,
    /// Default working directory in force: the configured one, made at create; `/`
    /// when it could not be made (a read-only image).
    pub workdir: String,
}

/// One sandbox, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Its id (a user's or generated; reused after a delete).
    pub id: String,
    /// This incarnation of the id: a create's own, so that the work of a deleted
    /// sandbox's create never lands on a new sandbox of the same id.
    pub uid: String,
    /// Who made it (the tenant's name).
    pub tenant: String,
    /// The image as asked for.
    pub image: String,
    /// CPU limit, as asked for or the default.
    pub cpu: String,
    /// Memory limit, as asked for or the default.
    pub memory: String,
    /// Default working directory as configured (see [`AgentRecord::workdir`]).
    pub working_dir: String,
    /// Egress denied.
    pub block_network: bool,
    /// Readiness limit, ms.
    pub ready_timeout_ms: u64,
    /// Lifetime in ms, if limited.
    pub ttl_ms: Option<u64>,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// Last heartbeat, ms since the epoch.
    pub heartbeat_ms: Option<u64>,
    /// Where it is.
    pub phase: Phase,
    /// Its agent, once ready.
    pub agent: Option<AgentRecord>,
    /// Frozen by `POST /v1/sandboxes/{id}/pause`: its agent is not to be called.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// What the client is told about its create besides the phase (a limit lowered to
    /// what the host has): the compatible API's `status_message` while nothing else is
    /// to be said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// While pending: why no node can take it yet (the scheduler's reason, as the
    /// backend reported it); the APIs then say `unschedulable`. Cleared once it is
    /// scheduled, ready or failed. Absent from records written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<String>,
}

impl SandboxRecord {
    /// When the TTL or the heartbeat period ends this sandbox (ms since the epoch);
    /// `heartbeat_timeout` is `None` when heartbeats do not reap.
    pub fn expires_ms(&self, heartbeat_timeout: Option<Duration>) -> Option<u64> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let ttl = self.ttl_ms.map(|t| self.created_ms.saturating_add(t));
        let hb = heartbeat_timeout.and_then(|t| self.heartbeat_ms.map(|h| h.saturating_add(ms(t))));
        match (ttl, hb) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The readiness limit.
    pub fn ready_timeout(&self) -> Duration {
        Duration::from_millis(self.ready_timeout_ms)
    }
}

/// A stored value with its version.
#[derive(Debug, Clone)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// Its version.
    pub version: Version,
}

/// How a compatible job runs, stored with it so any worker can run it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOptions {
    /// Time limit, ms.
    pub timeout_ms: Option<u64>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// A login shell as Orchard runs it (`bash --login -i -c`, `~/.bashrc` sourced,
    /// its noise filtered from stderr: see [`orchard_protocol::login`]).
    pub login_shell: bool,
}

/// One compatible job, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Who submitted it.
    pub tenant: String,
    /// The job as the API reports it.
    pub job: Job,
    /// How it runs.
    #[serde(default)]
    pub options: JobOptions,
    /// When it finished, ms since the epoch (retention counts from here).
    #[serde(default)]
    pub finished_ms: Option<u64>,
    /// The fence of the worker's lease it was taken under: a worker that takes the
    /// lease over finds the running jobs of an older fence orphaned.
    #[serde(default)]
    pub fence: Option<u64>,
}

/// A granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// What it is a lease on (`sandbox/<id>`, `policy`).
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// Larger than every earlier grant's, across holders.
    pub fence: u64,
}

/// What a subscription is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topic {
    /// A sandbox record (written, removed).
    Sandbox(String),
    /// A job (its status changed).
    Job(String),
    /// A sandbox's job queue (a job was added).
    Queue(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records are stored as JSON (Redis, shared by replicas of different versions): one
    /// written without `unschedulable` parses, and one not waiting for a node is written
    /// without it.
    #[test]
    fn the_unschedulable_reason_is_optional_in_stored_records() {
        let rec = crate::state::conformance::record("sb-1", "u1");
        let json = serde_json::to_value(&rec).unwrap();
        assert!(json.get("unschedulable").is_none(), "{json}");
        let back: SandboxRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, rec);
        let waiting = SandboxRecord {
            unschedulable: Some("0/1 nodes are available: 1 Insufficient cpu.".into()),
            ..rec
        };
        let json = serde_json::to_string(&waiting).unwrap();
        assert_eq!(
            serde_json::from_str::<SandboxRecord>(&json).unwrap(),
            waiting
        );
    }
}
