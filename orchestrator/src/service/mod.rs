//! The orchestrator's core, independent of HTTP: sandbox records, create / wait /
//! delete, heartbeats, per-key quotas, the compatible jobs, and the policy loop.
//!
//! A record lives in memory; its phase is a watch channel, so every wait (`/wait`
//! routes, `wait=true`) is woken by the change itself, never by polling. What a restarted
//! server needs is kept where it survives a SIGKILL: sandbox metadata in the backend's
//! labels (`orchard.*`), jobs in the job store's files. On start, [`Service::open`]
//! adopts the backend's sandboxes and rebuilds their records from those labels.
//!
//! Parts: [`auth`] (hashed keys), [`jobs`] (the job store), [`units`] (CPU and memory
//! quantities), [`error`] (the one error enum), `policy` (TTL, heartbeats, readiness,
//! reconciliation on one loop), `exec` (how a compatible job runs).

pub mod auth;
mod error;
mod exec;
pub mod jobs;
mod policy;
pub mod units;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use orchard_client::{AgentClient, Endpoint};
use orchard_protocol::compat::{CompatCommand, Job};
use orchard_protocol::sandbox::AgentEndpoint;
use tokio::sync::{mpsc, watch};

pub use auth::{Keys, Tenant};
pub use error::Error;
pub use jobs::JobStore;

use crate::backend::{Backend, BackendSandbox, CreateSpec};
use crate::image::ImageStore;
use crate::metrics::Metrics;

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
            job_retention: Duration::from_secs(3600),
            exec_timeout: Duration::from_secs(300),
            heartbeat_reaping: true,
        }
    }
}

/// Per-key quotas; 0 is unlimited.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quotas {
    /// Sandboxes (pending or running) one key may hold at once.
    pub max_sandboxes: usize,
    /// Creates one key may make per minute.
    pub creates_per_minute: usize,
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
            job_output_budget: jobs::DEFAULT_OUTPUT_BUDGET,
        }
    }
}

/// Where a sandbox is.
#[derive(Clone)]
pub enum Phase {
    /// Being created.
    Pending,
    /// Ready: commands run.
    Running(Arc<Live>),
    /// Could not start, or stopped on its own.
    Failed(String),
    /// Deleted.
    Deleted,
}

impl Phase {
    /// `pending`, `running`, `failed` or `deleted`.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Running(_) => "running",
            Phase::Failed(_) => "failed",
            Phase::Deleted => "deleted",
        }
    }
}

/// A ready sandbox's agent.
pub struct Live {
    /// A pooled client of its agent.
    pub agent: AgentClient,
    /// How to reach it directly.
    pub endpoint: AgentEndpoint,
    /// When it became ready (ms since the epoch).
    pub ready_ms: u64,
    /// `bash` when the image has it, else `sh`.
    pub shell: String,
    /// Default working directory: the configured one, made at create; `/` when it
    /// could not be made (a read-only image).
    pub workdir: String,
}

/// One sandbox record.
pub struct Record {
    /// Its id.
    pub id: String,
    /// Who made it.
    pub tenant: Tenant,
    /// The image as asked for.
    pub image: String,
    /// CPU limit, as asked for or the default.
    pub cpu: String,
    /// Memory limit, as asked for or the default.
    pub memory: String,
    /// Default working directory as configured (see [`Live::workdir`] for the one in
    /// force).
    pub working_dir: String,
    /// Egress denied.
    pub block_network: bool,
    /// Readiness limit.
    pub ready_timeout: Duration,
    /// Lifetime, if limited.
    pub ttl: Option<Duration>,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// Last heartbeat, ms since the epoch; 0 before the first.
    heartbeat_ms: AtomicU64,
    phase: watch::Sender<Phase>,
    /// The compatible jobs' queue: one worker per sandbox runs them in order.
    queue: mpsc::UnboundedSender<exec::Queued>,
}

impl Record {
    /// The phase now.
    pub fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }

    /// Last heartbeat (ms since the epoch), if any.
    pub fn heartbeat_ms(&self) -> Option<u64> {
        match self.heartbeat_ms.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// When the TTL or the heartbeat period ends this sandbox (ms since the epoch).
    pub fn expires_ms(&self, policy: &Policy) -> Option<u64> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let ttl = self.ttl.map(|t| self.created_ms.saturating_add(ms(t)));
        let hb = self
            .heartbeat_ms()
            .filter(|_| policy.heartbeat_reaping)
            .map(|t| t.saturating_add(ms(policy.heartbeat_timeout)));
        match (ttl, hb) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
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
}

struct Inner {
    backend: Arc<dyn Backend>,
    images: ImageStore,
    config: ServiceConfig,
    records: Mutex<HashMap<String, Arc<Record>>>,
    jobs: JobStore,
    metrics: Arc<Metrics>,
    creates: Mutex<HashMap<Tenant, VecDeque<Instant>>>,
    /// Creates accepted and not finished (queued or running at the backend).
    pending: AtomicU64,
    /// Creates running at the backend at once ([`ServiceConfig::max_concurrent_creates`]).
    create_slots: tokio::sync::Semaphore,
    started: Instant,
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// Environment variables and labels as every backend takes them: names without `=` or
/// NUL, label keys of 1-128 characters of `A-Za-z0-9._-/`, values of at most 1024 bytes.
fn validate_env_and_labels(
    env: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(Error::BadRequest(format!(
                "env {k:?}: names must be non-empty, without '=' or NUL, and values without NUL"
            )));
        }
        if k == "ORCHARD_AGENT_TOKEN" {
            return Err(Error::BadRequest(format!("env {k:?} is reserved")));
        }
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'/'));
        if !key_ok {
            return Err(Error::BadRequest(format!(
                "label key {k:?}: use 1-128 characters of A-Z, a-z, 0-9, '.', '_', '-', '/'"
            )));
        }
        if v.len() > 1024 {
            return Err(Error::BadRequest(format!(
                "label {k:?}: the value is longer than 1024 bytes"
            )));
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
        crate::log::warn(
            "the default CPU limit is more than a sandbox here can have; lowered",
            &[("default_cpu", &defaults.cpu), ("now", &fitted)],
        );
        defaults.cpu = fitted;
    }
    if units::parse_memory(&defaults.memory).is_ok_and(|m| m > cap.memory_bytes) {
        let fitted = format!("{}Mi", cap.memory_bytes >> 20);
        crate::log::warn(
            "the default memory limit is more than a sandbox here can have; lowered",
            &[("default_memory", &defaults.memory), ("now", &fitted)],
        );
        defaults.memory = fitted;
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, ISO-8601 UTC.
pub fn now_iso() -> String {
    iso(now_ms())
}

/// Now, Unix epoch seconds (the compatible API's timestamps).
pub fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `ms` since the epoch, ISO-8601 UTC.
pub fn iso(ms: u64) -> String {
    crate::backend::local::state::rfc3339(ms)
}

/// `n` random bytes as hex, for API keys, tokens and ids. Aborts the process when the
/// kernel's generator fails: a key or token made of predictable bytes is worse than no
/// server.
pub fn random_hex(n: usize) -> String {
    match random_hex_from(n, |buf| {
        // SAFETY: writes at most `buf.len()` bytes into `buf`.
        let r = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }) {
        Ok(hex) => hex,
        Err(e) => {
            eprintln!(
                "orchard: the kernel's random number generator failed ({e}); refusing to \
                 make keys, tokens or ids from predictable bytes"
            );
            std::process::abort()
        }
    }
}

/// `n` bytes from `fill` (which may return fewer than asked, or be interrupted) as hex.
fn random_hex_from(
    n: usize,
    mut fill: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    let mut done = 0;
    while done < n {
        match fill(&mut bytes[done..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "no random bytes",
                ))
            }
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(hex::encode(bytes))
}

impl Service {
    /// Starts the service on `backend`: adopts what a previous process left, rebuilds
    /// the records, loads the job store and starts the policy loop.
    pub async fn open(
        backend: Arc<dyn Backend>,
        images: ImageStore,
        config: ServiceConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Service, Error> {
        let mut config = config;
        fit_defaults(&mut config.defaults, backend.capacity());
        let jobs = JobStore::open_with_budget(
            config.data_dir.join("jobs"),
            config.policy.job_retention,
            config.job_output_budget,
        )?;
        let slots = config.max_concurrent_creates.max(1);
        let service = Service {
            inner: Arc::new(Inner {
                backend,
                images,
                config,
                records: Mutex::new(HashMap::new()),
                jobs,
                metrics,
                creates: Mutex::new(HashMap::new()),
                pending: AtomicU64::new(0),
                create_slots: tokio::sync::Semaphore::new(slots),
                started: Instant::now(),
            }),
        };
        service.adopt().await?;
        policy::spawn(&service);
        Ok(service)
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Record>>> {
        self.inner.records.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The job store.
    pub fn jobs(&self) -> &JobStore {
        &self.inner.jobs
    }

    /// Seconds since start.
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    async fn adopt(&self) -> Result<(), Error> {
        self.inner
            .backend
            .recover()
            .await
            .map_err(|e| Error::internal("cannot recover sandboxes", e))?;
        let list = match self.inner.backend.list().await {
            Ok(l) => l,
            Err(e) => {
                crate::log::warn(
                    "cannot list sandboxes to adopt",
                    &[("error", &e.to_string())],
                );
                return Ok(());
            }
        };
        for sb in list {
            let Some(tenant) = sb.labels.get("orchard.tenant").cloned() else {
                // Not made by a server: leave it to whoever made it.
                continue;
            };
            let meta = |k: &str| sb.labels.get(&format!("{META}{k}")).cloned();
            let labels = sb
                .labels
                .iter()
                .filter(|(k, _)| !k.starts_with(META))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let record = self.new_record(
                sb.id.clone(),
                Tenant(tenant),
                CreateRequest {
                    image: meta("image").unwrap_or_else(|| sb.image.clone()),
                    cpu: meta("cpu").or_else(|| Some(self.inner.config.defaults.cpu.clone())),
                    memory: meta("memory")
                        .or_else(|| Some(self.inner.config.defaults.memory.clone())),
                    block_network: meta("block_network").as_deref() != Some("false"),
                    ..Default::default()
                },
                Duration::from_secs(0),
                meta("ttl_s")
                    .and_then(|t| t.parse().ok())
                    .map(Duration::from_secs),
                labels,
                meta("created_ms")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(now_ms),
            );
            self.records().insert(sb.id.clone(), record.clone());
            let live = self.live(&sb).await;
            record.phase.send_replace(Phase::Running(live));
            crate::log::info("adopted sandbox", &[("sandbox_id", &sb.id)]);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn new_record(
        &self,
        id: String,
        tenant: Tenant,
        req: CreateRequest,
        ready_timeout: Duration,
        ttl: Option<Duration>,
        labels: BTreeMap<String, String>,
        created_ms: u64,
    ) -> Arc<Record> {
        let (tx, rx) = mpsc::unbounded_channel();
        let defaults = &self.inner.config.defaults;
        let record = Arc::new(Record {
            id,
            tenant,
            image: req.image,
            cpu: req.cpu.unwrap_or_else(|| defaults.cpu.clone()),
            memory: req.memory.unwrap_or_else(|| defaults.memory.clone()),
            working_dir: defaults.working_dir.clone(),
            block_network: req.block_network,
            ready_timeout,
            ttl,
            labels,
            created_ms,
            heartbeat_ms: AtomicU64::new(0),
            phase: watch::Sender::new(Phase::Pending),
            queue: tx,
        });
        exec::spawn_worker(self.clone(), Arc::downgrade(&record), rx);
        record
    }

    /// Builds the live view of a ready sandbox: its client, and what the compatible
    /// exec needs to know about the image (bash or sh, `/workspace`).
    async fn live(&self, sb: &BackendSandbox) -> Arc<Live> {
        let endpoint = match (&sb.socket, &sb.url) {
            (Some(s), _) => Endpoint::Unix(s.clone()),
            (None, Some(u)) => Endpoint::Tcp(
                u.trim_start_matches("http://")
                    .parse()
                    .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            ),
            (None, None) => Endpoint::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
        };
        let agent = AgentClient::new(endpoint, sb.token.clone());
        let bash =
            agent.stat("/bin/bash").await.is_ok() || agent.stat("/usr/bin/bash").await.is_ok();
        let wanted = &self.inner.config.defaults.working_dir;
        let workdir = match agent.stat(wanted).await {
            Ok(s) if s.kind == orchard_protocol::files::FileKind::Directory => wanted.clone(),
            _ => match agent.mkdir(wanted).await {
                Ok(_) => wanted.clone(),
                Err(e) => {
                    crate::log::warn(
                        "cannot make the default working directory; commands run in /",
                        &[("path", wanted), ("error", &e.to_string())],
                    );
                    "/".into()
                }
            },
        };
        Arc::new(Live {
            agent,
            endpoint: AgentEndpoint {
                socket: sb.socket.as_ref().map(|p| p.display().to_string()),
                url: sb.url.clone(),
                token: sb.token.clone(),
            },
            ready_ms: now_ms(),
            shell: if bash { "bash" } else { "sh" }.into(),
            workdir,
        })
    }

    /// Refuses limits no sandbox here can have (a client's mistake: 400).
    fn check_capacity(&self, cpus: Option<f64>, memory: Option<u64>) -> Result<(), Error> {
        let Some(cap) = self.inner.backend.capacity() else {
            return Ok(());
        };
        if let Some(c) = cpus.filter(|c| *c > cap.cpus) {
            return Err(Error::BadRequest(format!(
                "cpu {c}: a sandbox here can have at most {} CPUs",
                cap.cpus
            )));
        }
        if let Some(m) = memory.filter(|m| *m > cap.memory_bytes) {
            return Err(Error::BadRequest(format!(
                "memory of {m} bytes: a sandbox here can have at most {} bytes ({} MiB)",
                cap.memory_bytes,
                cap.memory_bytes >> 20
            )));
        }
        Ok(())
    }

    fn check_quota(&self, tenant: &Tenant) -> Result<(), Error> {
        let q = self.inner.config.quotas;
        if q.max_sandboxes > 0 {
            let held = self
                .records()
                .values()
                .filter(|r| &r.tenant == tenant)
                .count();
            if held >= q.max_sandboxes {
                return Err(Error::Quota(format!(
                    "this API key holds {held} sandboxes, its limit is {}; delete one first",
                    q.max_sandboxes
                )));
            }
        }
        if q.creates_per_minute > 0 {
            let mut creates = self.inner.creates.lock().unwrap_or_else(|p| p.into_inner());
            let window = creates.entry(tenant.clone()).or_default();
            let now = Instant::now();
            while window
                .front()
                .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
            {
                window.pop_front();
            }
            if window.len() >= q.creates_per_minute {
                return Err(Error::Quota(format!(
                    "this API key may create {} sandboxes per minute; try again in a minute",
                    q.creates_per_minute
                )));
            }
            window.push_back(now);
        }
        Ok(())
    }

    /// Starts creating a sandbox and returns its record at once (phase `pending`).
    pub fn create(&self, tenant: &Tenant, req: CreateRequest) -> Result<Arc<Record>, Error> {
        if req.image.trim().is_empty() {
            return Err(Error::BadRequest("image must not be empty".into()));
        }
        // Input the backend would refuse is refused here, as a 400: found only by the
        // create task, it would be a sandbox that failed to start (502).
        crate::image::Reference::parse(&req.image).map_err(|e| Error::BadRequest(e.to_string()))?;
        validate_env_and_labels(&req.env, &req.labels)?;
        let defaults = &self.inner.config.defaults;
        let cpus = Some(units::parse_cpu(
            req.cpu.as_deref().unwrap_or(&defaults.cpu),
        )?);
        let memory = Some(units::parse_memory(
            req.memory.as_deref().unwrap_or(&defaults.memory),
        )?);
        self.check_capacity(cpus, memory)?;
        let policy = &self.inner.config.policy;
        let ready_timeout = match req.ready_timeout_s {
            None | Some(0) => policy.ready_timeout,
            Some(s) => Duration::from_secs(s).min(policy.max_ready_timeout),
        };
        let ttl = match req.ttl_s {
            Some(0) => None,
            Some(s) if s > MAX_TTL_S => {
                return Err(Error::BadRequest(format!(
                    "ttl_s {s}: at most {MAX_TTL_S} seconds (100 years); 0 keeps the sandbox until deleted"
                )))
            }
            Some(s) => Some(Duration::from_secs(s)),
            None => policy.default_ttl,
        };
        for k in req.labels.keys() {
            if k.starts_with(META) {
                return Err(Error::BadRequest(format!(
                    "label {k:?}: keys starting with {META:?} are reserved"
                )));
            }
        }
        let id = match &req.id {
            Some(id) => {
                if !crate::backend::local::valid_id(id) {
                    return Err(Error::BadRequest(format!(
                        "invalid sandbox id {id:?}: use 1-63 characters of a-z, 0-9, '-', '_', '.', starting with a letter or digit"
                    )));
                }
                id.clone()
            }
            None => format!("sb-{}", random_hex(6)),
        };
        let cfg = &self.inner.config;
        let room = (cfg.max_concurrent_creates.max(1) + cfg.create_queue) as u64;
        if self.inner.pending.load(Ordering::Relaxed) >= room {
            return Err(Error::Unavailable(format!(
                "{} sandboxes are being created and {} more wait in the queue, which is full; retry shortly",
                cfg.max_concurrent_creates, cfg.create_queue
            )));
        }
        let created_ms = now_ms();
        let record = {
            let mut records = self.records();
            if records.contains_key(&id) {
                return Err(Error::Conflict(format!("sandbox {id} already exists")));
            }
            drop(records);
            self.check_quota(tenant)?;
            let record = self.new_record(
                id.clone(),
                tenant.clone(),
                req.clone(),
                ready_timeout,
                ttl,
                req.labels.clone(),
                created_ms,
            );
            records = self.records();
            if records.contains_key(&id) {
                return Err(Error::Conflict(format!("sandbox {id} already exists")));
            }
            records.insert(id.clone(), record.clone());
            record
        };
        let mut labels = req.labels.clone();
        labels.insert(format!("{META}tenant"), tenant.0.clone());
        labels.insert(format!("{META}image"), req.image.clone());
        labels.insert(format!("{META}created_ms"), created_ms.to_string());
        labels.insert(
            format!("{META}block_network"),
            req.block_network.to_string(),
        );
        labels.insert(format!("{META}cpu"), record.cpu.clone());
        labels.insert(format!("{META}memory"), record.memory.clone());
        if let Some(t) = ttl {
            labels.insert(format!("{META}ttl_s"), t.as_secs().to_string());
        }
        let env = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.inner.pending.fetch_add(1, Ordering::Relaxed);
        let service = self.clone();
        let rec = record.clone();
        let image = req.image.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut attempt = {
                let (service, rec) = (service.clone(), rec.clone());
                tokio::spawn(async move {
                    // Creates beyond the concurrency limit wait here, in arrival order
                    // (tokio's semaphore is fair); the readiness limit counts the wait.
                    let _slot = service
                        .inner
                        .create_slots
                        .acquire()
                        .await
                        .map_err(|e| format!("internal error: {e}"))?;
                    if matches!(*rec.phase.borrow(), Phase::Deleted) {
                        return Err("the sandbox was deleted before it started".to_string());
                    }
                    service.start(&rec, image, cpus, memory, env, labels).await
                })
            };
            let outcome = match tokio::time::timeout(rec.ready_timeout, &mut attempt).await {
                Ok(joined) => joined.unwrap_or_else(|e| Err(format!("internal error: {e}"))),
                Err(_) => {
                    // The backend create goes on in its own task; what it makes is
                    // removed once it is done.
                    let svc = service.clone();
                    let id = rec.id.clone();
                    tokio::spawn(async move {
                        if let Ok(Ok(_)) = attempt.await {
                            let _ = svc.inner.backend.delete(&id).await;
                        }
                    });
                    Err(format!(
                        "the sandbox was not ready within {} s",
                        rec.ready_timeout.as_secs()
                    ))
                }
            };
            service.inner.pending.fetch_sub(1, Ordering::Relaxed);
            match outcome {
                Ok(live) => {
                    service
                        .inner
                        .metrics
                        .create_seconds
                        .observe(started.elapsed().as_secs_f64());
                    let deleted = matches!(*rec.phase.borrow(), Phase::Deleted);
                    if deleted {
                        let _ = service.inner.backend.delete(&rec.id).await;
                    } else {
                        rec.phase.send_replace(Phase::Running(live));
                        crate::log::info("sandbox ready", &[("sandbox_id", &rec.id)]);
                    }
                }
                Err(message) => {
                    crate::log::warn(
                        "sandbox failed to start",
                        &[("sandbox_id", &rec.id), ("error", &message)],
                    );
                    if !matches!(*rec.phase.borrow(), Phase::Deleted) {
                        rec.phase.send_replace(Phase::Failed(message));
                    }
                }
            }
        });
        Ok(record)
    }

    async fn start(
        &self,
        rec: &Record,
        image: String,
        cpus: Option<f64>,
        memory_bytes: Option<u64>,
        env: Vec<String>,
        labels: BTreeMap<String, String>,
    ) -> Result<Arc<Live>, String> {
        let store = self.inner.images.clone();
        let found = match store.get(&image) {
            Ok(Some(i)) => i,
            Ok(None) => store
                .ensure(&image, |_| {})
                .await
                .map_err(|e| format!("image {image}: {e}"))?,
            Err(e) => return Err(format!("image {image}: {e}")),
        };
        let spec = CreateSpec {
            id: rec.id.clone(),
            image: found,
            cpus,
            memory_bytes,
            egress: !rec.block_network,
            env,
            labels,
        };
        let sb = self
            .inner
            .backend
            .create(spec)
            .await
            .map_err(|e| e.to_string())?;
        Ok(self.live(&sb).await)
    }

    /// The record `id` of `tenant`.
    pub fn get(&self, tenant: &Tenant, id: &str) -> Result<Arc<Record>, Error> {
        match self.records().get(id) {
            Some(r) if &r.tenant == tenant => Ok(r.clone()),
            _ => Err(Error::no_sandbox(id)),
        }
    }

    /// The records of `tenant`, oldest first.
    pub fn list(&self, tenant: &Tenant) -> Vec<Arc<Record>> {
        let mut list: Vec<_> = self
            .records()
            .values()
            .filter(|r| &r.tenant == tenant)
            .cloned()
            .collect();
        list.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        list
    }

    /// Every record, of every tenant.
    pub fn all(&self) -> Vec<Arc<Record>> {
        self.records().values().cloned().collect()
    }

    /// Counts of every record by phase name.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::from([("pending", 0), ("running", 0), ("failed", 0)]);
        for r in self.records().values() {
            *counts.entry(r.phase().name()).or_default() += 1;
        }
        counts
    }

    /// The live agent of a ready sandbox; 409 while pending, 502 when failed.
    pub fn ready(&self, tenant: &Tenant, id: &str) -> Result<Arc<Live>, Error> {
        match self.get(tenant, id)?.phase() {
            Phase::Running(l) => Ok(l),
            Phase::Pending => Err(Error::Conflict(format!("sandbox {id} is not ready yet"))),
            Phase::Failed(m) => Err(Error::Sandbox(format!("sandbox {id} failed: {m}"))),
            Phase::Deleted => Err(Error::no_sandbox(id)),
        }
    }

    /// Waits until the sandbox is ready (`Ok`), failed (502) or `timeout` passes (408).
    pub async fn wait_ready(
        &self,
        tenant: &Tenant,
        id: &str,
        timeout: Duration,
    ) -> Result<Arc<Record>, Error> {
        let record = self.get(tenant, id)?;
        let mut rx = record.phase.subscribe();
        let outcome = tokio::time::timeout(timeout, rx.wait_for(|p| !matches!(p, Phase::Pending)))
            .await
            .map(|r| r.map(|p| p.clone()));
        match outcome {
            Err(_) => Err(Error::Timeout(format!(
                "sandbox {id} was not ready within {} s",
                timeout.as_secs_f64()
            ))),
            Ok(Err(_)) => Err(Error::no_sandbox(id)),
            Ok(Ok(p)) => match p {
                Phase::Running(_) => Ok(record.clone()),
                Phase::Failed(m) => {
                    Err(Error::Sandbox(format!("sandbox {id} failed to start: {m}")))
                }
                Phase::Deleted => Err(Error::no_sandbox(id)),
                Phase::Pending => Err(Error::internal(
                    "wait ended early",
                    "pending after wait_for",
                )),
            },
        }
    }

    /// Deletes a sandbox: its record at once (waiters are woken, queued jobs fail), then
    /// everything it holds in the backend before answering.
    pub async fn delete(&self, tenant: &Tenant, id: &str) -> Result<(), Error> {
        let record = self.get(tenant, id)?;
        self.remove(&record, "the sandbox was deleted").await;
        Ok(())
    }

    /// Removes a record and its backend sandbox; `why` fails its unfinished jobs.
    async fn remove(&self, record: &Arc<Record>, why: &str) {
        let was = record.phase();
        {
            let mut records = self.records();
            if records
                .get(&record.id)
                .is_some_and(|r| Arc::ptr_eq(r, record))
            {
                records.remove(&record.id);
            }
        }
        record.phase.send_replace(Phase::Deleted);
        match was {
            // The create task removes what it made once it sees `Deleted`.
            Phase::Pending | Phase::Deleted => {}
            Phase::Running(_) | Phase::Failed(_) => {
                let _ = self.inner.backend.delete(&record.id).await;
            }
        }
        crate::log::info(
            "sandbox removed",
            &[("sandbox_id", &record.id), ("reason", why)],
        );
    }

    /// Records a heartbeat; from now on the sandbox is reaped when they stop.
    pub fn heartbeat(&self, tenant: &Tenant, id: &str) -> Result<Arc<Record>, Error> {
        let record = self.get(tenant, id)?;
        record.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
        Ok(record)
    }

    /// Queues a compatible job; jobs of one sandbox run one at a time in this order.
    pub fn submit(
        &self,
        tenant: &Tenant,
        id: &str,
        command: CompatCommand,
        opts: exec::JobOptions,
    ) -> Result<Arc<jobs::JobEntry>, Error> {
        let record = self.get(tenant, id)?;
        if let Phase::Failed(m) = record.phase() {
            return Err(Error::Sandbox(format!("sandbox {id} failed: {m}")));
        }
        if let CompatCommand::Argv(v) = &command {
            if v.is_empty() {
                return Err(Error::BadRequest("command must not be empty".into()));
            }
        }
        let entry = self.inner.jobs.submit(tenant, id, command);
        if record.queue.send((entry.clone(), opts)).is_err() {
            self.inner.jobs.finish(
                &entry,
                None,
                String::new(),
                String::new(),
                Some("the sandbox was deleted".into()),
                false,
            );
        }
        Ok(entry)
    }

    /// The job `id` of `tenant`.
    pub fn job(&self, tenant: &Tenant, id: &str) -> Result<Job, Error> {
        Ok(self.inner.jobs.get(tenant, id)?.snapshot())
    }

    /// Deletes every sandbox (graceful shutdown).
    pub async fn shutdown(&self) {
        let all: Vec<_> = self.records().values().cloned().collect();
        let mut tasks = Vec::new();
        for r in all {
            let s = self.clone();
            tasks.push(tokio::spawn(async move {
                s.remove(&r, "the orchestrator shut down").await
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let _ = self.inner.backend.shutdown().await;
    }

    /// Default working directory of compatible commands and paths.
    pub fn default_dir(live: &Live) -> &str {
        &live.workdir
    }

    /// The service's configuration.
    pub fn config(&self) -> &ServiceConfig {
        &self.inner.config
    }

    /// Creates accepted and not yet finished (queued or starting).
    pub fn pending_creates(&self) -> u64 {
        self.inner.pending.load(Ordering::Relaxed)
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

pub use exec::JobOptions;

#[cfg(test)]
mod random_tests {
    use super::*;

    #[test]
    fn regression_a_failing_generator_is_an_error_not_zero_bytes() {
        let e = random_hex_from(16, |_| Err(std::io::Error::from_raw_os_error(libc::ENOSYS)));
        assert!(e.is_err());
        let mut calls = 0;
        let short = random_hex_from(4, |buf| {
            calls += 1;
            match calls {
                1 => Err(std::io::Error::from(std::io::ErrorKind::Interrupted)),
                _ => {
                    buf[0] = 0xab;
                    Ok(1)
                }
            }
        });
        assert_eq!(
            short.unwrap(),
            "abababab",
            "short reads and EINTR are retried"
        );
        assert_eq!(random_hex(8).len(), 16);
    }
}
