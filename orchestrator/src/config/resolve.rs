//! From the layered settings to a [`Config`]: each setting the sources leave unset
//! takes its default, written once (the service's own defaults, [`ConnLimits`]'s, or a
//! constant of [`super`]); values are checked and turned into their types, and a bad
//! one is a [`ConfigError`] naming the setting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::args::ServeArgs;
use super::choices::{BackendChoice, StateChoice};
use super::defaults::*;
use super::error::ConfigError;
use super::registry::RegistryAndGc;
use super::sources::{self, Env};
use crate::backend::local::disk::DiskLimit;
use crate::image::gc::Budget;
use crate::server::listen::ConnLimits;
use crate::service::ServiceConfig;
use crate::service::{Policy, Quotas, SandboxDefaults};
use crate::units::{parse_cpu, parse_memory};

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The backend.
    pub backend: BackendChoice,
    /// Where the shared state lives.
    pub state: StateChoice,
    /// Listen address.
    pub listen: String,
    /// Accepted keys (empty with `no_auth`, or before a key is generated).
    pub api_keys: Vec<String>,
    /// Keys that may change the shared images.
    pub operator_keys: Vec<String>,
    /// Auth disabled explicitly.
    pub no_auth: bool,
    /// Agent binary.
    pub agent: PathBuf,
    /// Harness bundle.
    pub harness: Option<PathBuf>,
    /// Ready file.
    pub ready_file: Option<PathBuf>,
    /// What the service is given: the data directory (where state lives), policies,
    /// quotas, sandbox defaults, the create queue and the jobs' output bounds.
    pub service: ServiceConfig,
    /// The listener's bounds on client connections.
    pub connections: ConnLimits,
    /// Each sandbox's writable-layer limit, if any.
    pub sandbox_disk: Option<crate::backend::local::disk::DiskLimit>,
    /// The bound on all upload spools together.
    pub upload_spool: Budget,
    /// Keep sandboxes on exit.
    pub keep_sandboxes_on_exit: bool,
    /// Registry mirrors: (registry, URL).
    pub registry_mirrors: Vec<(String, String)>,
    /// Loopback or link-local registry hosts pulls may reach anyway.
    pub allow_registries: Vec<String>,
    /// Non-public ranges sandboxes with egress and pulls may reach anyway.
    pub egress: crate::egress::EgressPolicy,
    /// Sandboxes may make user namespaces.
    pub allow_user_namespaces: bool,
    /// Log level.
    pub log_level: String,
    /// Registry credentials and image GC.
    pub registry: RegistryAndGc,
}

fn default_data_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/orchard");
    }
    match std::env::var_os("XDG_STATE_HOME") {
        Some(d) => PathBuf::from(d).join("orchard"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".local/state/orchard"),
    }
}

/// Where the agent binary is when not configured: next to this executable, or the
/// workspace's musl build when this one runs from `target/{debug,release}`.
pub fn default_agent() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new("."));
    let beside = dir.join("orchard-agent");
    if beside.is_file() {
        return beside;
    }
    let mut d = dir.to_path_buf();
    // target/debug, target/release, target/debug/deps
    for _ in 0..3 {
        let musl = d.join("x86_64-unknown-linux-musl/release/orchard-agent");
        if musl.is_file() {
            return musl;
        }
        if !d.pop() {
            break;
        }
    }
    beside
}

/// Creates at the backend at once when nothing is set. The local backend's create is
/// work for this machine's CPUs (runc, the overlay, the agent's start): past a few per
/// core, more at once only share the cores among more creates, so every create of a
/// burst ends near the burst's end. 100 creates at once on 2 cores measured p50
/// 1.56-1.68x `runc run` with 64 at once and 0.97-1.18x with 8, the burst's wall time
/// the same (1.55-1.81 s). Two per core rather than four (issue 30): another tenant's
/// exec p99 under 50 creates at once was 8.5-11.6 ms with 4 at once on 2 cores against
/// 16-35 ms with 8, the burst's wall time the same (1.59-1.74 s against 1.49-1.77 s). A
/// Kubernetes create mostly waits on the cluster.
pub fn default_concurrent_creates(local: bool, cpus: usize) -> usize {
    if local {
        cpus.saturating_mul(2).clamp(4, 64)
    } else {
        64
    }
}

fn invalid<E: std::fmt::Display>(setting: &str) -> impl Fn(E) -> ConfigError + '_ {
    move |e| ConfigError::Invalid(format!("{setting}: {e}"))
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

impl Config {
    /// Resolves flags and the variables clap read (both in `args`), the list
    /// variables, the file `args` names, and the defaults.
    pub fn resolve(args: ServeArgs) -> Result<Config, ConfigError> {
        Config::resolve_in(args, &Env::process())
    }

    /// [`Config::resolve`] with the list variables read from `env`.
    pub fn resolve_in(args: ServeArgs, env: &Env) -> Result<Config, ConfigError> {
        let (s, auth) = sources::layered(args, env)?;
        let registry = RegistryAndGc::resolve(&s, auth)?;
        let backend = BackendChoice::parse(s.backend.as_deref(), &s.kube)?;
        let local = matches!(backend, BackendChoice::Local);
        let service = service_config(&s, local)?;
        let sandbox_disk = sandbox_disk(&s)?;
        let upload_spool = Budget::parse_setting(
            "upload_spool_bytes",
            s.upload_spool_bytes
                .as_deref()
                .unwrap_or(crate::service::files::spool::DEFAULT_UPLOAD_SPOOL_BYTES),
        )
        .map_err(ConfigError::Invalid)?;
        let registry_mirrors = s
            .registry_mirrors
            .iter()
            .flatten()
            .map(|m| {
                m.split_once('=')
                    .map(|(r, u)| (r.to_string(), u.to_string()))
                    .ok_or_else(|| {
                        ConfigError::Invalid(format!(
                            "registry mirror {m:?}: use REGISTRY=URL, e.g. docker.io=http://127.0.0.1:5000"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        let state = StateChoice::parse(s.state.as_deref(), s.state_prefix.clone())?;
        let shared_state = matches!(state, StateChoice::Redis { .. });
        let connections = connections(&s);
        let egress =
            crate::egress::EgressPolicy::parse(s.egress_allow_cidrs.as_deref().unwrap_or_default())
                .map_err(invalid("egress_allow_cidrs"))?;
        Ok(Config {
            backend,
            state,
            listen: s.listen.unwrap_or_else(|| DEFAULT_LISTEN.into()),
            api_keys: s.api_keys.unwrap_or_default(),
            operator_keys: s.operator_keys.unwrap_or_default(),
            no_auth: s.no_auth.unwrap_or(false),
            agent: s.agent.unwrap_or_else(default_agent),
            harness: s.harness,
            ready_file: s.ready_file,
            service,
            connections,
            sandbox_disk,
            upload_spool,
            keep_sandboxes_on_exit: s.keep_sandboxes_on_exit.unwrap_or(shared_state),
            registry_mirrors,
            allow_registries: s.allow_registries.unwrap_or_default(),
            egress,
            allow_user_namespaces: s.allow_user_namespaces.unwrap_or(false),
            log_level: s.log_level.unwrap_or_else(|| DEFAULT_LOG_LEVEL.into()),
            registry,
        })
    }
}

/// The service's settings over its own defaults ([`ServiceConfig::new`]).
fn service_config(s: &ServeArgs, local: bool) -> Result<ServiceConfig, ConfigError> {
    let data_dir = s.data_dir.clone().unwrap_or_else(default_data_dir);
    let d = ServiceConfig::new(data_dir);
    let policy = policy(s, &d.policy)?;
    let quotas = quotas(s)?;
    let defaults = sandbox_defaults(s, d.defaults)?;
    if policy.ready_timeout.is_zero() {
        return Err(ConfigError::Invalid(
            "ready_timeout_s must be at least 1".into(),
        ));
    }
    let max_concurrent_creates = s
        .max_concurrent_creates
        .unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            default_concurrent_creates(local, cpus)
        })
        .max(1);
    Ok(ServiceConfig {
        policy,
        quotas,
        defaults,
        max_concurrent_creates,
        create_queue: s.create_queue.unwrap_or(d.create_queue),
        job_output_cap: s.job_output_cap_bytes.unwrap_or(d.job_output_cap).max(1024),
        job_output_budget: s.job_output_budget_bytes.unwrap_or(d.job_output_budget),
        ..d
    })
}

fn policy(s: &ServeArgs, d: &Policy) -> Result<Policy, ConfigError> {
    let policy = Policy {
        ready_timeout: s.ready_timeout_s.map_or(d.ready_timeout, secs),
        default_ttl: match s.ttl_s {
            None => d.default_ttl,
            Some(0) => None,
            Some(ttl) => Some(secs(ttl)),
        },
        heartbeat_timeout: s.heartbeat_timeout_s.map_or(d.heartbeat_timeout, secs),
        interval: s
            .policy_interval_ms
            .map_or(d.interval, Duration::from_millis)
            .max(Duration::from_millis(10)),
        reconcile_interval: s.reconcile_interval_s.map_or(d.reconcile_interval, secs),
        worker_lease: s
            .worker_lease_s
            .map_or(d.worker_lease, secs)
            .max(Duration::from_secs(1)),
        job_retention: s.job_retention_s.map_or(d.job_retention, secs),
        exec_timeout: s.exec_timeout_s.map_or(d.exec_timeout, secs),
        heartbeat_reaping: s.heartbeat_reaping.unwrap_or(d.heartbeat_reaping),
        ..d.clone()
    };
    if policy.exec_timeout.is_zero() {
        return Err(ConfigError::Invalid(
            "exec_timeout_s must be at least 1".into(),
        ));
    }
    Ok(policy)
}

fn quotas(s: &ServeArgs) -> Result<Quotas, ConfigError> {
    let snapshot_bytes = match s.snapshot_bytes_per_key.as_deref() {
        None => DEFAULT_SNAPSHOT_BYTES_PER_KEY,
        Some(q) if q.trim() == "0" => 0,
        Some(q) => parse_memory(q).map_err(invalid("snapshot_bytes_per_key"))?,
    };
    let budget = |what, value: &Option<String>, default| {
        Budget::parse_setting(what, value.as_deref().unwrap_or(default))
            .map_err(ConfigError::Invalid)
    };
    Ok(Quotas {
        max_sandboxes: s
            .max_sandboxes_per_key
            .unwrap_or(DEFAULT_MAX_SANDBOXES_PER_KEY),
        creates_per_minute: s
            .creates_per_minute_per_key
            .unwrap_or(DEFAULT_CREATES_PER_MINUTE_PER_KEY),
        snapshot_bytes,
        snapshot_bytes_total: budget(
            "snapshot_bytes_total",
            &s.snapshot_bytes_total,
            DEFAULT_SNAPSHOT_BYTES_TOTAL,
        )?,
        snapshot_min_free: budget(
            "snapshot_min_free",
            &s.snapshot_min_free,
            DEFAULT_SNAPSHOT_MIN_FREE,
        )?,
    })
}

fn sandbox_defaults(s: &ServeArgs, d: SandboxDefaults) -> Result<SandboxDefaults, ConfigError> {
    let defaults = SandboxDefaults {
        cpu: s.default_cpu.clone().unwrap_or(d.cpu),
        memory: s.default_memory.clone().unwrap_or(d.memory),
        working_dir: s.default_working_dir.clone().unwrap_or(d.working_dir),
    };
    parse_cpu(&defaults.cpu).map_err(invalid("default_cpu"))?;
    parse_memory(&defaults.memory).map_err(invalid("default_memory"))?;
    if !defaults.working_dir.starts_with('/') || defaults.working_dir.contains('\0') {
        return Err(ConfigError::Invalid(format!(
            "default_working_dir {:?}: must be an absolute path",
            defaults.working_dir
        )));
    }
    Ok(defaults)
}

/// Each sandbox's disk: bounded unless "0" or "none".
fn sandbox_disk(s: &ServeArgs) -> Result<Option<DiskLimit>, ConfigError> {
    let q = s.sandbox_disk.as_deref().unwrap_or(DEFAULT_SANDBOX_DISK);
    if q.trim() == "0" || q.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let limit = DiskLimit {
        bytes: parse_memory(q).map_err(invalid("sandbox_disk"))?,
        inodes: s.sandbox_disk_inodes.unwrap_or(DEFAULT_SANDBOX_DISK_INODES),
    };
    limit.validate().map_err(invalid("sandbox_disk"))?;
    Ok(Some(limit))
}

fn connections(s: &ServeArgs) -> ConnLimits {
    let d = ConnLimits::default();
    let at_least_1s = |t: Duration| t.max(Duration::from_secs(1));
    ConnLimits {
        max_connections: s.max_connections,
        max_connections_per_client: s
            .max_connections_per_client
            .unwrap_or(d.max_connections_per_client)
            .max(1),
        max_header_bytes: s.max_header_bytes.unwrap_or(d.max_header_bytes),
        header_read_timeout: at_least_1s(
            s.header_read_timeout_s.map_or(d.header_read_timeout, secs),
        ),
        body_timeout: at_least_1s(s.body_timeout_s.map_or(d.body_timeout, secs)),
    }
}
