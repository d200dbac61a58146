//! Where the orchestrator's shared state lives: the [`StateStore`] trait, the records it
//! holds, and its implementations: [`memory::MemoryStore`] (one process, the default)
//! and [`redis::RedisStore`] (many replicas over one Redis). [`conformance`] holds the
//! checks both pass.
//!
//! Everything a second server replica would need to see is here, as data: sandbox
//! records ([`SandboxRecord`], with the phase and the agent's endpoint and token), jobs
//! ([`JobRecord`]) and their order per sandbox, quota counters, per-sandbox leases with
//! fencing tokens, and change notifications. What only makes sense in one process (the
//! pooled agent connections, the job worker tasks, the create tasks) is the service's
//! runtime and is never stored.
//!
//! The meaning of each operation, which any implementation must
//! keep across processes:
//! - **Versions.** Every write of a sandbox record gives it a new [`Version`];
//!   [`StateStore::update_sandbox`] is a compare-and-set on it, so two writers never
//!   lose each other's change: the loser gets [`StoreError::Conflict`], re-reads and
//!   retries (the service's `update` helper does that).
//! - **Job order.** Jobs of one sandbox are taken ([`StateStore::take_job`]) in the
//!   order they were inserted, each exactly once.
//! - **Leases.** [`StateStore::acquire_lease`] gives a named lease to one holder until it
//!   expires or is released; each grant carries a fencing token larger than every
//!   earlier grant's, and the job writes that take a lease ([`StateStore::take_job`],
//!   [`StateStore::finish_job`]) are refused once a newer grant exists, so a holder that
//!   paused past its expiry cannot overwrite its successor's work.
//! - **Counters.** [`StateStore::acquire_slot`] increments a counter only while it is
//!   below a limit, atomically; [`StateStore::hit_rate`] admits at most `limit` hits per
//!   sliding window.
//! - **Notifications.** [`StateStore::subscribe`] returns a [`Subscription`] that wakes
//!   after every write to its topic made after the subscription: subscribe, read, then
//!   wait, and no change is missed. Waits never poll.

#[doc(hidden)]
pub mod conformance;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
mod spill;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use orchard_protocol::compat::Job;
use serde::{Deserialize, Serialize};

pub use crate::backend::AgentEndpoint;
use tokio::sync::watch;

/// A job as [`StateStore::job_view`] answers it.
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
                    record.job.stdout = memory::DROPPED_NOTE.to_string();
                    record.job.output_truncated = true;
                }
            }
        }
        record
    }
}

pub use spill::read_file as read_output;

/// A boxed future of a store call.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The version of a stored sandbox record: different after every write.
pub type Version = u64;

/// What went wrong in the store. The variant is the kind callers decide on (retry a
/// `Conflict`, give up on `NotFound`, wait out `Unavailable`); the first three are data
/// (the key), `Unavailable` carries what failed as its cause.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An insert found the key taken.
    #[error("{0} already exists")]
    Exists(String),
    /// A compare-and-set found another version, or a fenced write a newer lease.
    #[error("{0} changed meanwhile")]
    Conflict(String),
    /// The record is gone.
    #[error("{0} not found")]
    NotFound(String),
    /// The store could not be reached or failed (I/O, a lost connection).
    #[error("the state store failed: {message}")]
    Unavailable {
        /// What failed (it may quote the cause, as the log and a 503 say it).
        message: String,
        /// The cause: Redis' error, a timeout, the journal's `io::Error`, a record
        /// that does not parse.
        #[source]
        source: crate::backend::BoxError,
    },
}

impl StoreError {
    /// [`StoreError::Unavailable`] saying `message`, caused by `source`.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl Into<crate::backend::BoxError>,
    ) -> Self {
        StoreError::Unavailable {
            message: message.into(),
            source: source.into(),
        }
    }
}

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

/// Wakes after each write to its topic made after it was taken.
pub struct Subscription {
    rx: watch::Receiver<u64>,
}

impl Subscription {
    /// A subscription on `rx`, a counter its store bumps on every write to the topic.
    pub fn new(rx: watch::Receiver<u64>) -> Subscription {
        Subscription { rx }
    }

    /// Waits for the next write; `false` when the store went away.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// Where the shared state lives. See the module documentation for what each operation
/// guarantees; an implementation over a remote store must keep those guarantees across
/// processes.
pub trait StateStore: Send + Sync + 'static {
    /// Short name (`memory`).
    fn name(&self) -> &'static str;

    /// Whether other processes share it (replicas): its records outlive this process,
    /// so a restart has nothing to rebuild from the backend.
    fn shared(&self) -> bool {
        false
    }

    /// Stores a new sandbox record; `Exists` when the id is taken.
    fn insert_sandbox(&self, record: SandboxRecord) -> StoreFuture<'_, Version>;
    /// The record of `id`.
    fn sandbox<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Versioned<SandboxRecord>>>;
    /// Every record.
    fn sandboxes(&self) -> StoreFuture<'_, Vec<Versioned<SandboxRecord>>>;
    /// How many records are in each phase, by [`Phase::name`] (`/health` and `/metrics`
    /// ask on every call: no record is copied).
    fn phase_counts(&self) -> StoreFuture<'_, BTreeMap<&'static str, u64>>;
    /// Replaces the record if it is still at `expected`: `Conflict` when it changed,
    /// `NotFound` when it is gone.
    fn update_sandbox(&self, record: SandboxRecord, expected: Version) -> StoreFuture<'_, Version>;
    /// Removes the record of `id` if it is the incarnation `uid`; answers the removed
    /// record (`None`: it was not there, or another incarnation is).
    fn remove_sandbox<'a>(
        &'a self,
        id: &'a str,
        uid: &'a str,
    ) -> StoreFuture<'a, Option<SandboxRecord>>;

    /// Stores a new job, queued last in its sandbox's queue, if that sandbox's record
    /// is still incarnation `sandbox_uid` (`NotFound` otherwise). Checked with the insert
    /// in one step: a job can never be queued behind a delete whose worker already ended
    /// the queue, so the caller needs no second read.
    fn insert_job<'a>(&'a self, job: JobRecord, sandbox_uid: &'a str) -> StoreFuture<'a, ()>;
    /// The job `id`.
    fn job<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>>;
    /// The job `id` for an answer that streams its output: where the output has a file
    /// of its own, the record comes without it and the view holds the open file, so a
    /// read costs neither a copy of the output nor the time to make one (issue 30: four
    /// reads of one big job stalled every tenant's calls). By default, [`Self::job`].
    fn job_view<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobView>> {
        Box::pin(async move {
            Ok(self.job(id).await?.map(|record| JobView {
                record,
                output: None,
            }))
        })
    }
    /// Takes the oldest queued job of `sandbox` out of its queue, marked running, for
    /// the holder of `lease`; `None` when the queue is empty.
    fn take_job<'a>(
        &'a self,
        sandbox: &'a str,
        lease: &'a Lease,
    ) -> StoreFuture<'a, Option<JobRecord>>;
    /// The jobs of `sandbox` taken by a worker and not finished (with the fence each
    /// was taken under).
    fn running_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>>;
    /// Sandboxes (ids, whether or not their record still exists) with queued or running
    /// jobs and no holder of the lease `{lease_prefix}{id}`: no worker attends to
    /// them (the replica whose worker did died). The policy loop starts one.
    fn unattended_sandboxes<'a>(&'a self, lease_prefix: &'a str) -> StoreFuture<'a, Vec<String>>;
    /// The queued jobs of `sandbox`, oldest first (ids in the queue whose job is no
    /// longer queued are dropped from it). They stay queued: a worker ending
    /// them (the sandbox is gone) finishes them one by one, and a replica that stops
    /// half-way leaves the rest queued, so the sandbox stays unattended and the next
    /// worker ends them (taken out in one step, they would stay `queued` for good).
    fn queued_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>>;
    /// Writes a finished job, unless it finished already (answers whether it wrote),
    /// and takes it out of its sandbox's queue if it was queued; with `lease`, refused
    /// (`Conflict`) once a newer grant of that lease exists. A job without a fence (read
    /// from the queue, never taken) is written only while it is still queued: once a
    /// worker took it, that worker ends it (a worker of a deleted incarnation must not
    /// fail a job the next incarnation's worker, with the same holder and grant, runs).
    fn finish_job<'a>(&'a self, job: JobRecord, lease: Option<&'a Lease>) -> StoreFuture<'a, bool>;
    /// Removes jobs that finished before `before_ms`; answers how many.
    fn purge_jobs(&self, before_ms: u64) -> StoreFuture<'_, usize>;

    /// Increments `counter` if it is below `limit` (0: no limit); answers whether it did.
    fn acquire_slot<'a>(&'a self, counter: &'a str, limit: u64) -> StoreFuture<'a, bool>;
    /// Decrements `counter` (not below 0).
    fn release_slot<'a>(&'a self, counter: &'a str) -> StoreFuture<'a, ()>;
    /// Counts a hit on `key` if fewer than `limit` came within `window`; answers whether
    /// it did.
    fn hit_rate<'a>(&'a self, key: &'a str, window: Duration, limit: u64) -> StoreFuture<'a, bool>;

    /// Grants the lease `name` to `holder` for `ttl` if no one else holds it (the holder
    /// itself gets a renewal with the same fence).
    fn acquire_lease<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<Lease>>;
    /// Extends a lease still held; `false` when it expired and another holder took it.
    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, bool>;
    /// Gives a lease up.
    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()>;

    /// Wakes on every write to `topic` after this call.
    fn subscribe(&self, topic: Topic) -> Subscription;
}

/// First and longest pause between two tries of a store call while the store is away.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// `call`'s answer, tried again with a growing pause while the store is unavailable
/// (Redis away: nothing is lost by waiting, much by giving up); `None`, logged, on
/// another error.
pub async fn until_answered<T, F, Fut>(call: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut pause = RETRY_FIRST;
    loop {
        match call().await {
            Ok(v) => return Some(v),
            Err(StoreError::Unavailable { message, .. }) => {
                tracing::warn!(error = %message, "the store is away; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a store call failed");
                return None;
            }
        }
    }
}
