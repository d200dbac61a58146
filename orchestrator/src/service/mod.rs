//! The orchestrator's core, independent of HTTP and of any one backend: sandbox
//! records, create / wait / delete, heartbeats, per-key quotas, the compatible jobs,
//! and the policy loop.
//!
//! All shared state (records, jobs, quota counters, leases) lives in a
//! [`StateStore`]; every wait (`/wait` routes, `wait=true`, a job's worker) subscribes to
//! the store's change notifications and is woken by the change itself, never by
//! polling. What only this process has is its runtime: the pooled agent clients
//! ([`runtime`]), one job worker task per sandbox (`exec`), the create tasks. What a
//! restarted server needs is kept where it survives a SIGKILL: sandbox metadata in the
//! backend's labels (`orchard.*`), jobs in the store. On start, [`Service::open`] adopts
//! the backend's sandboxes and rebuilds their records from those labels.
//!
//! Parts: [`auth`] (hashed keys), [`sandboxes`] (the lifecycle), [`jobs`] (submitting
//! and waiting), `exec` (how a compatible job runs, and the worker), [`runtime`] (the
//! agent pool), [`units`] (CPU and memory quantities), [`error`] (the service's error
//! enum), `policy` (TTL, heartbeats, readiness, reconciliation on one loop), `fair`
//! (the create slots, shared by the keys in turn).

pub mod auth;
pub mod error;
mod exec;
mod fair;
pub mod files;
pub mod jobs;
pub mod json;
mod keyed;
pub mod patch;
mod policy;
pub mod runtime;
pub mod sandboxes;
pub mod snapshots;
pub mod units;
mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::state::{JobOptions, Phase, SandboxRecord};
pub use crate::time::{now_ms, now_secs};
pub use auth::{Keys, Tenant};
pub use error::{BadEnv, BadLabel, Error, OverCapacity, QuotaExceeded, SnapshotStorage};
pub use runtime::Live;

use crate::backend::Backend;
use crate::image::ImageStore;
use crate::metrics::Metrics;
use crate::state::memory::{MemoryStore, DEFAULT_OUTPUT_BUDGET};
use crate::state::StateStore;

/// Label prefix of the server's own metadata on a backend sandbox.
const META: &str = "orchard.";

/// Longest lifetime a create may ask for (`ttl_s`); 0 is "until deleted".
const MAX_TTL_S: u64 = 100 * 365 * 86_400;

/// Lifecycle policies, run by one background loop.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Default time allowed for a sandbox to become ready.
    pub ready_timeout: Duration,
    /// Longest readiness time a request may ask for.
    pub max_ready_timeout: Duration,
    /// Default lifetime of a sandbox; `None`: until deleted.
    pub default_ttl: Option<Duration>,
    /// A sandbox that has sent one heartbeat is deleted when none came for this long.
    pub heartbeat_timeout: Duration,
    /// How often the loop runs.
    pub interval: Duration,
    /// How often records are reconciled with the backend's list.
    pub reconcile_interval: Duration,
    /// How long a job worker's lease on its sandbox lasts unrenewed (how soon another
    /// replica takes over the jobs of a replica that died).
    pub worker_lease: Duration,
    /// How long finished jobs are kept.
    pub job_retention: Duration,
    /// Time limit of a compatible job that sets none (Orchard's 300 s).
    pub exec_timeout: Duration,
    /// Whether heartbeats stopping deletes a sandbox (Orchard's switch).
    pub heartbeat_reaping: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            ready_timeout: Duration::from_secs(300),
            max_ready_timeout: Duration::from_secs(3600),
            default_ttl: Some(Duration::from_secs(2 * 3600)),
            heartbeat_timeout: Duration::from_secs(300),
            interval: Duration::from_secs(1),
            reconcile_interval: Duration::from_secs(30),
            worker_lease: Duration::from_secs(30),
            job_retention: Duration::from_secs(3600),
            exec_timeout: Duration::from_secs(300),
            heartbeat_reaping: true,
        }
    }
}

/// Per-key quotas (0 is unlimited), and the host-wide bounds of snapshot storage,
/// which lives on the data directory's file system outside every sandbox's disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quotas {
    /// Sandboxes (pending or running) one key may hold at once.
    pub max_sandboxes: usize,
    /// Creates one key may make per minute.
    pub creates_per_minute: usize,
    /// Bytes one key's snapshots may hold (their own layers).
    pub snapshot_bytes: u64,
    /// Bytes all keys' snapshots may hold together (a percentage is of the data
    /// directory's file system).
    pub snapshot_bytes_total: crate::image::gc::Budget,
    /// Space the data directory's file system keeps free: no snapshot is taken, or
    /// kept, below it.
    pub snapshot_min_free: crate::image::gc::Budget,
}

/// What a sandbox gets when its create does not say (an operator's settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDefaults {
    /// CPU limit, a quantity like `"4"` or `"2000m"` (Orchard's default: 4).
    pub cpu: String,
    /// Memory limit, a quantity like `"16Gi"` (Orchard's default: 16Gi).
    pub memory: String,
    /// Working directory of commands and base of relative paths; made at create when
    /// the image lacks it (as Orchard's pods have it as their working directory).
    pub working_dir: String,
}

impl Default for SandboxDefaults {
    fn default() -> Self {
        SandboxDefaults {
            cpu: "4".into(),
            memory: "16Gi".into(),
            working_dir: "/workspace".into(),
        }
    }
}

/// Per-stream cap of a compatible job's output by default: 64 MiB (Orchard does not
/// truncate; a cap keeps one job from holding the server's memory).
pub const DEFAULT_JOB_OUTPUT_CAP: u64 = 64 << 20;

/// How the service is set up.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where the job store lives (`<data_dir>/jobs`).
    pub data_dir: PathBuf,
    /// Policies.
    pub policy: Policy,
    /// Quotas.
    pub quotas: Quotas,
    /// What a create that does not say gets.
    pub defaults: SandboxDefaults,
    /// Creates running at the backend at once, across all keys; more wait in a queue.
    pub max_concurrent_creates: usize,
    /// Creates that may wait for a slot; beyond it a create answers 503 with
    /// `Retry-After`.
    pub create_queue: usize,
    /// Per-stream output cap of a compatible job, in bytes.
    pub job_output_cap: u64,
    /// Output all finished jobs may hold together, in bytes.
    pub job_output_budget: u64,
}

impl ServiceConfig {
    /// The defaults for a service keeping its state in `data_dir`.
    pub fn new(data_dir: PathBuf) -> ServiceConfig {
        ServiceConfig {
            data_dir,
            policy: Policy::default(),
            quotas: Quotas::default(),
            defaults: SandboxDefaults::default(),
            max_concurrent_creates: 64,
            create_queue: 4096,
            job_output_cap: DEFAULT_JOB_OUTPUT_CAP,
            job_output_budget: DEFAULT_OUTPUT_BUDGET,
        }
    }
}

/// What a create asks for, from either API.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Image reference.
    pub image: String,
    /// Id, or generated.
    pub id: Option<String>,
    /// CPU quantity.
    pub cpu: Option<String>,
    /// Memory quantity.
    pub memory: Option<String>,
    /// Egress denied.
    pub block_network: bool,
    /// Readiness limit, seconds.
    pub ready_timeout_s: Option<u64>,
    /// Lifetime, seconds; `Some(0)`: until deleted.
    pub ttl_s: Option<u64>,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The snapshot to fork (its filesystem instead of the image's alone).
    pub snapshot: Option<String>,
    /// Shell sessions to bring back once the sandbox is ready (a fork's).
    pub sessions: Vec<orchard_protocol::session::SessionState>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    images: ImageStore,
    config: ServiceConfig,
    store: Arc<dyn StateStore>,
    runtime: runtime::Runtime,
    metrics: Arc<Metrics>,
    /// Creates accepted and not finished (queued or running at the backend), in this
    /// process.
    pending: AtomicU64,
    /// Creates running at the backend at once ([`ServiceConfig::max_concurrent_creates`]).
    create_slots: fair::FairSlots,
    started: Instant,
    /// This process's name as a lease holder.
    holder: String,
    /// Reconciliations in a row that held back a mass failure (see `policy::reconcile`);
    /// only the policy loop (one pass at a time) touches it.
    held_reconciles: AtomicU64,
    /// One snapshot quota check at a time per key (`snapshots`).
    snapshot_checks: keyed::KeyedLock,
    /// One check of the host-wide snapshot bounds at a time, whatever the key (taken
    /// after the key's lock): two keys' snapshots finishing together must not both see
    /// the total from before the other.
    snapshot_host_check: tokio::sync::Mutex<()>,
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// Most labels of one sandbox or snapshot (labels are kept in every record and
/// listed with it: issue 30 saw 822 MB of them).
pub const MAX_LABELS: usize = 64;
/// Most bytes of a create's or a job's environment, names and values together (what
/// a process can be given is about 2 MiB of arguments and environment in all).
pub const MAX_ENV_BYTES: usize = 256 << 10;

/// Environment variables and labels as every backend takes them: names without `=` or
/// NUL, at most [`MAX_ENV_BYTES`] in all; at most [`MAX_LABELS`] labels, keys of 1-128
/// characters of `A-Za-z0-9._-/`, values of at most 1024 bytes.
fn validate_env_and_labels(
    env: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(BadEnv::TooLarge {
            bytes: env_bytes,
            max: MAX_ENV_BYTES,
        }
        .into());
    }
    if labels.len() > MAX_LABELS {
        return Err(BadLabel::TooMany {
            count: labels.len(),
            max: MAX_LABELS,
        }
        .into());
    }
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(BadEnv::Malformed(k.clone()).into());
        }
        if k == "ORCHARD_AGENT_TOKEN" {
            return Err(BadEnv::Reserved(k.clone()).into());
        }
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'/'));
        if !key_ok {
            return Err(BadLabel::Key {
                key: k.clone(),
                max: 128,
            }
            .into());
        }
        if v.len() > 1024 {
            return Err(BadLabel::ValueTooLong {
                key: k.clone(),
                max: 1024,
            }
            .into());
        }
    }
    Ok(())
}

/// Lowers default limits the backend cannot give (Orchard's 4 CPUs and 16 GiB on a
/// smaller host) to what it can, so a create that asks for nothing still starts; the
/// create answer echoes the lowered values.
fn fit_defaults(defaults: &mut SandboxDefaults, cap: Option<crate::backend::Capacity>) {
    let Some(cap) = cap else { return };
    if units::parse_cpu(&defaults.cpu).is_ok_and(|c| c > cap.cpus) {
        let fitted = format!("{}", cap.cpus);
        tracing::warn!(default_cpu = %defaults.cpu, now = %fitted, "the default CPU limit is more than a sandbox here can have; lowered");
        defaults.cpu = fitted;
    }
    if units::parse_memory(&defaults.memory).is_ok_and(|m| m > cap.memory_bytes) {
        let fitted = format!("{}Mi", cap.memory_bytes >> 20);
        tracing::warn!(default_memory = %defaults.memory, now = %fitted, "the default memory limit is more than a sandbox here can have; lowered");
        defaults.memory = fitted;
    }
}

/// Now, ISO-8601 UTC.
pub fn now_iso() -> String {
    crate::time::now_rfc3339()
}

/// `ms` since the epoch, ISO-8601 UTC.
pub fn iso(ms: u64) -> String {
    crate::time::rfc3339(ms)
}

impl Service {
    /// Starts the service on `backend` with the in-memory store (its job journal in
    /// `<data_dir>/jobs`): adopts what a previous process left, rebuilds the records and
    /// starts the policy loop.
    pub async fn open(
        backend: Arc<dyn Backend>,
        images: ImageStore,
        config: ServiceConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Service, Error> {
        let store = MemoryStore::open(config.data_dir.join("jobs"), config.job_output_budget)?;
        Self::open_with_store(backend, Arc::new(store), images, config, metrics).await
    }

    /// [`Service::open`] over the given state store.
    pub async fn open_with_store(
        backend: Arc<dyn Backend>,
        store: Arc<dyn StateStore>,
        images: ImageStore,
        config: ServiceConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Service, Error> {
        let mut config = config;
        fit_defaults(&mut config.defaults, backend.capacity());
        let slots = config.max_concurrent_creates.max(1);
        let service = Service {
            inner: Arc::new(Inner {
                backend,
                images,
                config,
                store,
                runtime: runtime::Runtime::default(),
                metrics,
                pending: AtomicU64::new(0),
                create_slots: fair::FairSlots::new(slots),
                started: Instant::now(),
                holder: format!("orchard-{}-{}", std::process::id(), crate::random::hex(4)?),
                held_reconciles: AtomicU64::new(0),
                snapshot_checks: keyed::KeyedLock::default(),
                snapshot_host_check: tokio::sync::Mutex::new(()),
            }),
        };
        service.adopt().await?;
        policy::spawn(&service);
        Ok(service)
    }

    /// The state store.
    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.inner.store
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The image store.
    pub fn images(&self) -> &ImageStore {
        &self.inner.images
    }

    /// The policies.
    pub fn policy(&self) -> &Policy {
        &self.inner.config.policy
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Seconds since start.
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// The service's configuration.
    pub fn config(&self) -> &ServiceConfig {
        &self.inner.config
    }

    /// Creates accepted and not yet finished (queued or starting) in this process.
    pub fn pending_creates(&self) -> u64 {
        self.inner
            .pending
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// When `record` is reaped by its TTL or its heartbeats stopping, under this
    /// service's policy.
    pub fn expires_ms(&self, record: &SandboxRecord) -> Option<u64> {
        let policy = self.policy();
        record.expires_ms(policy.heartbeat_reaping.then_some(policy.heartbeat_timeout))
    }

    /// Default working directory of compatible commands and paths.
    pub fn default_dir(live: &Live) -> &str {
        &live.workdir
    }

    /// `path` made absolute against the default working directory.
    pub fn resolve(live: &Live, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            Path::new(Self::default_dir(live))
                .join(path)
                .display()
                .to_string()
        }
    }
}

/// No random bytes is the host's failure (a 500), never the client's.
impl From<crate::random::RandomError> for Error {
    fn from(e: crate::random::RandomError) -> Self {
        Error::internal("cannot make a random id", e)
    }
}

#[cfg(test)]
mod tests;
