//! How the service is set up ([`ServiceConfig`]: its [`Policy`], per-key [`Quotas`],
//! the [`SandboxDefaults`]) and what a create asks for ([`CreateRequest`]). A leaf of
//! [`super`]: data, and the lowering of defaults a backend cannot give.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::state::memory::DEFAULT_OUTPUT_BUDGET;
use crate::units;

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

/// Lowers default limits the backend cannot give (Orchard's 4 CPUs and 16 GiB on a
/// smaller host) to what it can, so a create that asks for nothing still starts; the
/// create answer echoes the lowered values.
pub(super) fn fit_defaults(defaults: &mut SandboxDefaults, cap: Option<crate::backend::Capacity>) {
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
