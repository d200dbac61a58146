//! `orchard serve` configuration: a TOML file, environment variables and flags.
//!
//! Precedence, highest first: **flags, then environment (`ORCHARD_*`), then the file
//! (`--config` / `ORCHARD_CONFIG`), then defaults**. Every setting has all three forms:
//! `--ready-timeout-s 60`, `ORCHARD_READY_TIMEOUT_S=60`, `ready_timeout_s = 60`.
//! With nothing set, the server listens on 127.0.0.1:8000 with the local backend, keeps
//! its state under the data directory, and generates an API key (saved there, printed
//! once) unless auth is explicitly disabled.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::image::credentials::{self, CredentialsError};
use crate::image::gc::{Budget, GcPolicy};
use crate::image::Credentials;
use crate::server::listen::{
    ConnLimits, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT, DEFAULT_MAX_HEADER_BYTES,
};
use crate::service::{Policy, Quotas, SandboxDefaults, DEFAULT_JOB_OUTPUT_CAP};

/// Sandboxes one key may hold at once unless the operator says otherwise: what one
/// machine holds (issue 30: with quotas off by default, one key could take it all).
pub const DEFAULT_MAX_SANDBOXES_PER_KEY: usize = 1024;
/// Creates one key may make per minute by default (a hundred a second: bursts pass,
/// a loop that creates forever is stopped).
pub const DEFAULT_CREATES_PER_MINUTE_PER_KEY: usize = 6000;
/// Bytes one key's snapshots may hold by default.
pub const DEFAULT_SNAPSHOT_BYTES_PER_KEY: u64 = 20 << 30;
/// What all keys' snapshots may hold together by default: half the data directory's
/// file system (issue 30: snapshot data lives on the host, outside `--sandbox-disk`,
/// and the per-key quota times the keys is no bound).
pub const DEFAULT_SNAPSHOT_BYTES_TOTAL: &str = "50%";
/// Free space a snapshot leaves on the data directory's file system by default (the
/// journals, spools and sandboxes' sparse disks need room too).
pub const DEFAULT_SNAPSHOT_MIN_FREE: &str = "5%";

/// A list of keys as Orchard's `API_KEYS` takes them: separated by commas, spaces or
/// newlines, empty entries dropped.
pub fn split_keys(list: &str) -> Vec<String> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}

/// Each sandbox's writable layer by default (`--sandbox-disk`): bounded, so one sandbox
/// cannot fill the host's disk; "0" or "none" turns the bound off.
pub const DEFAULT_SANDBOX_DISK: &str = "10Gi";

/// Flags and environment of `orchard serve`. Every value is optional so the file and
/// the defaults can fill what is unset.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "ORCHARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8000].
    #[arg(long, env = "ORCHARD_LISTEN")]
    pub listen: Option<String>,
    /// An accepted API key (repeatable); ORCHARD_API_KEYS (or Orchard's API_KEYS) takes
    /// a list separated by commas, spaces or newlines.
    #[arg(long = "api-key")]
    pub api_keys: Vec<String>,
    /// A key that may also import and delete the shared images (repeatable; also
    /// accepted as an ordinary key); ORCHARD_OPERATOR_KEYS takes a list. Without any, a
    /// server with one key lets it, a server with several lets none.
    #[arg(long = "operator-key")]
    pub operator_keys: Vec<String>,
    /// Accept requests without a key (only when asked for explicitly).
    #[arg(long, env = "ORCHARD_NO_AUTH", num_args = 0..=1, default_missing_value = "true")]
    pub no_auth: Option<bool>,
    /// Where state lives: sandboxes, images, jobs [default: /var/lib/orchard as root,
    /// else ~/.local/state/orchard].
    #[arg(long, env = "ORCHARD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The static agent binary [default: orchard-agent next to this binary, or the
    /// workspace's musl release build].
    #[arg(long, env = "ORCHARD_AGENT_BIN")]
    pub agent: Option<PathBuf>,
    /// The harness bundle directory, injected at /.orchard/harness.
    #[arg(long, env = "ORCHARD_HARNESS")]
    pub harness: Option<PathBuf>,
    /// Where sandboxes run: `local` (runc on this machine) or `kubernetes` (a pod per
    /// sandbox; see the `--kube*` settings and the `[kubernetes]` table) [default: local].
    #[arg(long, env = "ORCHARD_BACKEND")]
    pub backend: Option<String>,
    /// Where the shared state (sandbox records, jobs, quotas, leases) lives: `memory`
    /// (this process; jobs journaled under the data directory) or a Redis URL
    /// (`redis://HOST:PORT[/DB]`, `redis+unix:///PATH`), which several replicas share
    /// [default: memory].
    #[arg(long, env = "ORCHARD_STATE")]
    pub state: Option<String>,
    /// The prefix of this deployment's Redis keys (deployments sharing one Redis
    /// database keep apart by it) [default: orchard].
    #[arg(long, env = "ORCHARD_STATE_PREFIX")]
    pub state_prefix: Option<String>,
    /// The Kubernetes backend's settings.
    #[command(flatten)]
    pub kube: crate::backend::kubernetes::KubeArgs,
    /// Write the base URL here once listening (for scripts and tests).
    #[arg(long, env = "ORCHARD_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Seconds a sandbox may take to become ready [default: 300].
    #[arg(long, env = "ORCHARD_READY_TIMEOUT_S")]
    pub ready_timeout_s: Option<u64>,
    /// Default lifetime of a sandbox in seconds, 0 for none [default: 7200, Orchard's].
    #[arg(long, env = "ORCHARD_TTL_S")]
    pub ttl_s: Option<u64>,
    /// Seconds without a heartbeat after which a sandbox that sent one is deleted
    /// [default: 300].
    #[arg(long, env = "ORCHARD_HEARTBEAT_TIMEOUT_S")]
    pub heartbeat_timeout_s: Option<u64>,
    /// Milliseconds between runs of the policy loop [default: 1000].
    #[arg(long, env = "ORCHARD_POLICY_INTERVAL_MS")]
    pub policy_interval_ms: Option<u64>,
    /// Seconds between reconciliations with the backend [default: 30].
    #[arg(long, env = "ORCHARD_RECONCILE_INTERVAL_S")]
    pub reconcile_interval_s: Option<u64>,
    /// Seconds a sandbox's job worker holds its lease without renewing it: with many
    /// replicas, how long after a replica dies another takes its sandboxes' jobs over
    /// [default: 30].
    #[arg(long, env = "ORCHARD_WORKER_LEASE_S")]
    pub worker_lease_s: Option<u64>,
    /// Seconds finished jobs are kept [default: 3600].
    #[arg(long, env = "ORCHARD_JOB_RETENTION_S")]
    pub job_retention_s: Option<u64>,
    /// Time limit in seconds of a compatible job that sets none [default: 300, Orchard's].
    #[arg(long, env = "ORCHARD_EXEC_TIMEOUT_S")]
    pub exec_timeout_s: Option<u64>,
    /// Delete a sandbox whose heartbeats stop (only sandboxes that sent one)
    /// [default: true].
    #[arg(long, env = "ORCHARD_HEARTBEAT_REAPING")]
    pub heartbeat_reaping: Option<bool>,
    /// CPU limit of a sandbox whose create gives none, like "4" or "2000m" [default: 4].
    #[arg(long, env = "ORCHARD_DEFAULT_CPU")]
    pub default_cpu: Option<String>,
    /// Memory limit of a sandbox whose create gives none, like "16Gi" [default: 16Gi].
    #[arg(long, env = "ORCHARD_DEFAULT_MEMORY")]
    pub default_memory: Option<String>,
    /// Working directory of commands and base of relative paths, made at create when
    /// the image lacks it [default: /workspace].
    #[arg(long, env = "ORCHARD_DEFAULT_WORKING_DIR")]
    pub default_working_dir: Option<String>,
    /// Per-stream output cap of a compatible job in bytes; past it the middle is cut
    /// and the job says `output_truncated` [default: 67108864 = 64 MiB].
    #[arg(long, env = "ORCHARD_JOB_OUTPUT_CAP_BYTES")]
    pub job_output_cap_bytes: Option<u64>,
    /// Output all finished jobs may hold together, in bytes; past it the oldest jobs'
    /// output is dropped [default: 1073741824 = 1 GiB].
    #[arg(long, env = "ORCHARD_JOB_OUTPUT_BUDGET_BYTES")]
    pub job_output_budget_bytes: Option<u64>,
    /// Sandboxes one key may hold at once, 0 for no limit [default: 1024, what one
    /// machine holds].
    #[arg(long, env = "ORCHARD_MAX_SANDBOXES_PER_KEY")]
    pub max_sandboxes_per_key: Option<usize>,
    /// Creates per minute one key may make, 0 for no limit [default: 6000].
    #[arg(long, env = "ORCHARD_CREATES_PER_MINUTE_PER_KEY")]
    pub creates_per_minute_per_key: Option<usize>,
    /// Bytes one key's snapshots may hold (their own layers), a quantity like "20Gi",
    /// 0 for no limit [default: 20Gi].
    #[arg(long, env = "ORCHARD_SNAPSHOT_BYTES_PER_KEY")]
    pub snapshot_bytes_per_key: Option<String>,
    /// Bytes all keys' snapshots may hold together on this host: a size like "100Gi",
    /// a percentage of the data directory's file system like "50%", or 0 for no
    /// bound [default: 50%].
    #[arg(long, env = "ORCHARD_SNAPSHOT_BYTES_TOTAL")]
    pub snapshot_bytes_total: Option<String>,
    /// Free space the data directory's file system keeps: a snapshot is refused while
    /// less is free, and undone when taking it left less. A size like "10Gi", a
    /// percentage of the file system like "5%", or 0 for none [default: 5%].
    #[arg(long, env = "ORCHARD_SNAPSHOT_MIN_FREE")]
    pub snapshot_min_free: Option<String>,
    /// Size of each sandbox's writable layer, a quantity like "10Gi": its own sparse
    /// filesystem image, full is ENOSPC inside it and nothing outside; "0" or "none"
    /// leaves writes unbounded on the data directory's filesystem [default: 10Gi; the
    /// images are made ahead, so a create costs about 2 ms more with it].
    #[arg(long, env = "ORCHARD_SANDBOX_DISK")]
    pub sandbox_disk: Option<String>,
    /// Files and directories each sandbox may make when its disk is bounded
    /// [default: 1048576].
    #[arg(long, env = "ORCHARD_SANDBOX_DISK_INODES")]
    pub sandbox_disk_inodes: Option<u64>,
    /// Async worker threads of the server [default: 1]. One keeps a call on the thread
    /// that is already awake: with more, a request's task often moves to a sleeping
    /// worker, and on a machine whose cores are all busy waking it costs a scheduler
    /// tick (4 ms) per hop. One worker proxied as many calls per second here (256
    /// clients, 2 cores; `bench/results/scale.md`); raise it on a large machine whose
    /// server thread is saturated. Blocking work (image unpacking, snapshots) has its
    /// own pool either way.
    #[arg(long, env = "ORCHARD_WORKERS")]
    pub workers: Option<usize>,
    /// Scheduler slice, in microseconds, asked for the server's threads (see
    /// the `orchard-sched` crate); 0 keeps the kernel's default [default: 100].
    #[arg(long, env = "ORCHARD_LATENCY_SLICE_US")]
    pub latency_slice_us: Option<u64>,
    /// Nice level asked for the server's scheduling group (its session's autogroup;
    /// only when the server leads its own session, as `make run` and `setsid` start
    /// it) [default: -10]. The local backend's sandboxes are scheduled beside it, each
    /// with the default weight: without it, a hundred busy sandboxes left the server,
    /// through which every call passes, a hundredth of the CPU (docs/scale.md). 0
    /// keeps the kernel's default.
    #[arg(long, env = "ORCHARD_GROUP_NICE", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub group_nice: Option<i32>,
    /// Creates running at the backend at once; more wait in the queue [default: local
    /// backend four per CPU, at least 4 and at most 64; kubernetes 64].
    #[arg(long, env = "ORCHARD_MAX_CONCURRENT_CREATES")]
    pub max_concurrent_creates: Option<usize>,
    /// Creates that may wait for a slot; beyond it a create answers 503 with
    /// Retry-After [default: 4096].
    #[arg(long, env = "ORCHARD_CREATE_QUEUE")]
    pub create_queue: Option<usize>,
    /// Client connections at once; more are answered 503 and closed [default: 16384,
    /// kept under the open-file limit less a quarter of it].
    #[arg(long, env = "ORCHARD_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Client connections at once from one address [default: 2048].
    #[arg(long, env = "ORCHARD_MAX_CONNECTIONS_PER_CLIENT")]
    pub max_connections_per_client: Option<usize>,
    /// Bytes of a request's start line and headers; more is 431 [default: 65536].
    #[arg(long, env = "ORCHARD_MAX_HEADER_BYTES")]
    pub max_header_bytes: Option<usize>,
    /// Seconds a request's head may take to arrive, counted from the connection's start
    /// or its previous response (so also the idle limit of a keep-alive connection)
    /// [default: 20].
    #[arg(long, env = "ORCHARD_HEADER_READ_TIMEOUT_S")]
    pub header_read_timeout_s: Option<u64>,
    /// Seconds a request body may go without sending anything [default: 60]. A file
    /// upload must also bring 16 KiB a second over each such window.
    #[arg(long, env = "ORCHARD_BODY_TIMEOUT_S")]
    pub body_timeout_s: Option<u64>,
    /// Bytes all file uploads in flight may hold spooled on the host together: a size
    /// like "4Gi", a percentage of the data directory's file system like "5%", or 0 for
    /// no bound; past it an upload is answered 503 [default: 4Gi]. Each sandbox's
    /// uploads in flight are bounded by the room on its disk too (413 past it).
    #[arg(long, env = "ORCHARD_UPLOAD_SPOOL_BYTES")]
    pub upload_spool_bytes: Option<String>,
    /// Keep sandboxes running when the server stops (a restart adopts them)
    /// [default: false: delete them; true with `--state redis://...`, where the
    /// sandboxes belong to every replica and one replica's exit must not end them].
    #[arg(
        long,
        env = "ORCHARD_KEEP_SANDBOXES_ON_EXIT",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub keep_sandboxes_on_exit: Option<bool>,
    /// Registry mirror, `REGISTRY=URL` (repeatable), e.g. `docker.io=http://127.0.0.1:5000`.
    #[arg(long = "registry-mirror")]
    pub registry_mirrors: Vec<String>,
    /// A registry host (`host` or `host:port`) pulls may reach although it is a
    /// loopback or link-local address (repeatable; ORCHARD_ALLOW_REGISTRIES takes a
    /// list). Mirrors are allowed already [default: none].
    #[arg(long = "allow-registry")]
    pub allow_registries: Vec<String>,
    /// A private or link-local range (`ADDR/LEN`) sandboxes with egress, and pulls, may
    /// reach anyway (repeatable; ORCHARD_EGRESS_ALLOW_CIDRS takes a list). Egress means
    /// the internet only otherwise: no private, link-local (cloud metadata) or host
    /// address [default: none].
    #[arg(long = "egress-allow-cidr")]
    pub egress_allow_cidrs: Vec<String>,
    /// Let sandboxes make user namespaces (nested container builds); the seccomp
    /// filter refuses them otherwise [default: false].
    #[arg(
        long,
        env = "ORCHARD_ALLOW_USER_NAMESPACES",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub allow_user_namespaces: Option<bool>,
    /// Log level: debug, info, warn, off, or tracing directives
    /// (`orchard=debug,hyper=info`) [default: info].
    #[arg(long, env = "ORCHARD_LOG")]
    pub log_level: Option<String>,
    // --- Registry credentials and image GC (see `RegistryAndGc`). ---
    /// Docker `config.json` with registry credentials [default: $DOCKER_CONFIG/config.json
    /// or ~/.docker/config.json, when present].
    #[arg(long, env = "ORCHARD_REGISTRY_CONFIG")]
    pub registry_config: Option<PathBuf>,
    /// Registry credentials, `HOST=USER:PASSWORD` (repeatable); ORCHARD_REGISTRY_AUTH
    /// takes a list separated by spaces or newlines. They override the config.json's.
    /// Flags show in the process list: prefer the environment or a file for secrets.
    #[arg(long = "registry-auth")]
    pub registry_auth: Vec<Secret>,
    /// Disk budget of the image store: 0 (off), a size like "20Gi", or a percentage of
    /// its file system like "50%". Over it, unused images go, least recently used
    /// first [default: 0, off].
    #[arg(long, env = "ORCHARD_IMAGE_DISK_BUDGET")]
    pub image_disk_budget: Option<String>,
    /// Seconds between two image GC passes besides those after each pull or import
    /// [default: 300].
    #[arg(long, env = "ORCHARD_IMAGE_GC_INTERVAL_S")]
    pub image_gc_interval_s: Option<u64>,
}

/// A flag value that is a secret: its `Debug` shows no value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

/// Registry credentials and the image GC policy, resolved.
#[derive(Debug, Clone, Default)]
pub struct RegistryAndGc {
    /// Credentials per registry or mirror host.
    pub credentials: HashMap<String, Credentials>,
    /// Where credentials came from (files, flags), for the start-up log.
    pub credential_sources: Vec<String>,
    /// Credential helpers of the config.json that are not run (warned about).
    pub ignored_helpers: Vec<String>,
    /// The image store's disk budget and pass interval.
    pub gc: Option<GcPolicy>,
}

impl RegistryAndGc {
    /// Merges, lowest precedence first: the config.json, the file's `registry_auth`,
    /// `ORCHARD_REGISTRY_AUTH`, `--registry-auth`.
    fn resolve(args: &ServeArgs, file: &FileConfig) -> Result<RegistryAndGc, ConfigError> {
        let mut out = RegistryAndGc::default();
        let docker_config = args
            .registry_config
            .clone()
            .or_else(|| file.registry_config.clone())
            .or_else(credentials::default_docker_config);
        if let Some(path) = docker_config {
            let parsed = credentials::load_docker_config(&path)?;
            out.credentials.extend(parsed.auths);
            out.ignored_helpers = parsed.helpers;
            out.credential_sources.push(path.display().to_string());
        }
        let env: Vec<String> = std::env::var("ORCHARD_REGISTRY_AUTH")
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let flags: Vec<String> = args.registry_auth.iter().map(|s| s.0.clone()).collect();
        for (entries, what) in [
            (
                file.registry_auth.clone().unwrap_or_default(),
                "registry_auth in the config file",
            ),
            (env, "ORCHARD_REGISTRY_AUTH"),
            (flags, "--registry-auth"),
        ] {
            if !entries.is_empty() {
                out.credentials
                    .extend(credentials::parse_auth_entries(&entries, what)?);
                out.credential_sources.push(what.to_string());
            }
        }
        let budget = match args
            .image_disk_budget
            .as_deref()
            .or(file.image_disk_budget.as_deref())
        {
            Some(text) => Budget::parse(text).map_err(ConfigError::Invalid)?,
            None => Budget::Off,
        };
        let interval = args
            .image_gc_interval_s
            .or(file.image_gc_interval_s)
            .unwrap_or(300);
        if interval == 0 {
            return Err(ConfigError::Invalid(
                "image_gc_interval_s must be at least 1".into(),
            ));
        }
        out.gc = Some(GcPolicy {
            budget,
            interval: Duration::from_secs(interval),
        });
        Ok(out)
    }
}

/// The file form: the same settings, snake_case.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    listen: Option<String>,
    api_keys: Option<Vec<String>>,
    operator_keys: Option<Vec<String>>,
    no_auth: Option<bool>,
    data_dir: Option<PathBuf>,
    agent: Option<PathBuf>,
    harness: Option<PathBuf>,
    ready_file: Option<PathBuf>,
    backend: Option<String>,
    state: Option<String>,
    state_prefix: Option<String>,
    kubernetes: Option<crate::backend::kubernetes::KubeFile>,
    ready_timeout_s: Option<u64>,
    ttl_s: Option<u64>,
    heartbeat_timeout_s: Option<u64>,
    policy_interval_ms: Option<u64>,
    reconcile_interval_s: Option<u64>,
    worker_lease_s: Option<u64>,
    job_retention_s: Option<u64>,
    exec_timeout_s: Option<u64>,
    heartbeat_reaping: Option<bool>,
    default_cpu: Option<String>,
    default_memory: Option<String>,
    default_working_dir: Option<String>,
    job_output_cap_bytes: Option<u64>,
    job_output_budget_bytes: Option<u64>,
    max_sandboxes_per_key: Option<usize>,
    creates_per_minute_per_key: Option<usize>,
    snapshot_bytes_per_key: Option<String>,
    snapshot_bytes_total: Option<String>,
    snapshot_min_free: Option<String>,
    max_concurrent_creates: Option<usize>,
    create_queue: Option<usize>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    max_header_bytes: Option<usize>,
    header_read_timeout_s: Option<u64>,
    body_timeout_s: Option<u64>,
    upload_spool_bytes: Option<String>,
    sandbox_disk: Option<String>,
    sandbox_disk_inodes: Option<u64>,
    keep_sandboxes_on_exit: Option<bool>,
    registry_mirrors: Option<Vec<String>>,
    allow_registries: Option<Vec<String>>,
    egress_allow_cidrs: Option<Vec<String>>,
    allow_user_namespaces: Option<bool>,
    log_level: Option<String>,
    registry_config: Option<PathBuf>,
    registry_auth: Option<Vec<String>>,
    image_disk_budget: Option<String>,
    image_gc_interval_s: Option<u64>,
}

/// A configuration problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A value is not valid.
    #[error("{0}")]
    Invalid(String),
    /// A value chooses a part this build left out (a Cargo feature of the `orchard`
    /// crate, on by default).
    #[error(
        "{setting}: this orchard was built without the `{feature}` feature; build it with \
         `cargo build -p orchard --features {feature}` (on by default) or use {instead}"
    )]
    NotCompiled {
        /// The setting and its value, as written (`backend "kubernetes"`).
        setting: String,
        /// The missing feature.
        feature: &'static str,
        /// What this build offers instead.
        instead: &'static str,
    },
    /// Registry credentials could not be loaded.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// Where the shared state lives.
#[derive(Debug, Clone, PartialEq)]
pub enum StateChoice {
    /// This process's memory (and the job journal).
    Memory,
    /// A Redis shared by the replicas.
    Redis {
        /// Its URL.
        url: String,
        /// The prefix of the keys.
        prefix: String,
    },
}

impl StateChoice {
    /// `memory` (or nothing) or a Redis URL; the prefix a non-empty word.
    fn parse(state: Option<&str>, prefix: Option<String>) -> Result<StateChoice, ConfigError> {
        let prefix = prefix.unwrap_or_else(|| "orchard".into());
        if prefix.is_empty() || prefix.contains(char::is_whitespace) {
            return Err(ConfigError::Invalid(format!(
                "state_prefix {prefix:?}: must be a non-empty word"
            )));
        }
        match state.map(str::trim) {
            None | Some("") | Some("memory") => Ok(StateChoice::Memory),
            Some(url)
                if ["redis://", "rediss://", "redis+unix://", "unix://"]
                    .iter()
                    .any(|s| url.starts_with(s)) =>
            {
                if !cfg!(feature = "redis") {
                    return Err(ConfigError::NotCompiled {
                        setting: format!("state {url:?}"),
                        feature: "redis",
                        instead: "`memory`",
                    });
                }
                Ok(StateChoice::Redis {
                    url: url.to_string(),
                    prefix,
                })
            }
            Some(other) => Err(ConfigError::Invalid(format!(
                "state {other:?}: use `memory` or a Redis URL such as redis://127.0.0.1:6379"
            ))),
        }
    }
}

/// Which backend runs sandboxes.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendChoice {
    /// runc over overlayfs on this machine.
    Local,
    /// A pod per sandbox.
    Kubernetes(Box<crate::backend::kubernetes::KubeConfig>),
}

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
    /// State directory.
    pub data_dir: PathBuf,
    /// Agent binary.
    pub agent: PathBuf,
    /// Harness bundle.
    pub harness: Option<PathBuf>,
    /// Ready file.
    pub ready_file: Option<PathBuf>,
    /// Policies.
    pub policy: Policy,
    /// Quotas.
    pub quotas: Quotas,
    /// What a create that does not say gets.
    pub defaults: SandboxDefaults,
    /// Creates running at the backend at once.
    pub max_concurrent_creates: usize,
    /// Creates waiting for a slot before 503.
    pub create_queue: usize,
    /// The listener's bounds on client connections.
    pub connections: ConnLimits,
    /// Per-stream output cap of a compatible job.
    pub job_output_cap: u64,
    /// Output all finished jobs may hold together.
    pub job_output_budget: u64,
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
/// the same (1.55-1.81 s). A Kubernetes create mostly waits on the cluster.
pub fn default_concurrent_creates(local: bool, cpus: usize) -> usize {
    if local {
        cpus.saturating_mul(4).clamp(4, 64)
    } else {
        64
    }
}

impl Config {
    /// Resolves flags, environment (already in `args` through clap), the file and the
    /// defaults.
    pub fn resolve(args: ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| ConfigError::Parse {
                    path: path.clone(),
                    message: e.to_string(),
                })?
            }
            None => FileConfig::default(),
        };
        let registry = RegistryAndGc::resolve(&args, &file)?;
        let backend = match args
            .backend
            .clone()
            .or(file.backend.clone())
            .as_deref()
            .unwrap_or("local")
        {
            "local" => BackendChoice::Local,
            name @ ("kubernetes" | "k8s") if !cfg!(feature = "kubernetes") => {
                return Err(ConfigError::NotCompiled {
                    setting: format!("backend {name:?}"),
                    feature: "kubernetes",
                    instead: "local",
                })
            }
            "kubernetes" | "k8s" => BackendChoice::Kubernetes(Box::new(
                crate::backend::kubernetes::KubeConfig::resolve(
                    &args.kube,
                    file.kubernetes.as_ref(),
                )
                .map_err(ConfigError::Invalid)?,
            )),
            other => {
                return Err(ConfigError::Invalid(format!(
                    "backend {other:?}: use local or kubernetes"
                )))
            }
        };
        let mut api_keys = args.api_keys.clone();
        if api_keys.is_empty() {
            let env = std::env::var("ORCHARD_API_KEYS").or_else(|_| std::env::var("API_KEYS"));
            if let Ok(env) = env {
                api_keys = split_keys(&env);
            }
        }
        if api_keys.is_empty() {
            api_keys = file.api_keys.unwrap_or_default();
        }
        let mut operator_keys = args.operator_keys.clone();
        if operator_keys.is_empty() {
            if let Ok(env) = std::env::var("ORCHARD_OPERATOR_KEYS") {
                operator_keys = split_keys(&env);
            }
        }
        if operator_keys.is_empty() {
            operator_keys = file.operator_keys.unwrap_or_default();
        }
        let secs = |flag: Option<u64>, file: Option<u64>, default: u64| {
            Duration::from_secs(flag.or(file).unwrap_or(default))
        };
        let ttl = args.ttl_s.or(file.ttl_s).unwrap_or(7200);
        let policy = Policy {
            ready_timeout: secs(args.ready_timeout_s, file.ready_timeout_s, 300),
            default_ttl: (ttl > 0).then(|| Duration::from_secs(ttl)),
            heartbeat_timeout: secs(args.heartbeat_timeout_s, file.heartbeat_timeout_s, 300),
            interval: Duration::from_millis(
                args.policy_interval_ms
                    .or(file.policy_interval_ms)
                    .unwrap_or(1000)
                    .max(10),
            ),
            reconcile_interval: secs(args.reconcile_interval_s, file.reconcile_interval_s, 30),
            worker_lease: secs(args.worker_lease_s, file.worker_lease_s, 30)
                .max(Duration::from_secs(1)),
            job_retention: secs(args.job_retention_s, file.job_retention_s, 3600),
            exec_timeout: secs(args.exec_timeout_s, file.exec_timeout_s, 300),
            heartbeat_reaping: args
                .heartbeat_reaping
                .or(file.heartbeat_reaping)
                .unwrap_or(true),
            ..Policy::default()
        };
        if policy.exec_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "exec_timeout_s must be at least 1".into(),
            ));
        }
        let snapshot_bytes = match args
            .snapshot_bytes_per_key
            .clone()
            .or(file.snapshot_bytes_per_key)
        {
            None => DEFAULT_SNAPSHOT_BYTES_PER_KEY,
            Some(q) if q.trim() == "0" => 0,
            Some(q) => crate::service::units::parse_memory(&q)
                .map_err(|e| ConfigError::Invalid(format!("snapshot_bytes_per_key: {e}")))?,
        };
        let snapshot_bytes_total = Budget::parse_setting(
            "snapshot_bytes_total",
            args.snapshot_bytes_total
                .as_deref()
                .or(file.snapshot_bytes_total.as_deref())
                .unwrap_or(DEFAULT_SNAPSHOT_BYTES_TOTAL),
        )
        .map_err(ConfigError::Invalid)?;
        let snapshot_min_free = Budget::parse_setting(
            "snapshot_min_free",
            args.snapshot_min_free
                .as_deref()
                .or(file.snapshot_min_free.as_deref())
                .unwrap_or(DEFAULT_SNAPSHOT_MIN_FREE),
        )
        .map_err(ConfigError::Invalid)?;
        let upload_spool = Budget::parse_setting(
            "upload_spool_bytes",
            args.upload_spool_bytes
                .as_deref()
                .or(file.upload_spool_bytes.as_deref())
                .unwrap_or(crate::server::spool::DEFAULT_UPLOAD_SPOOL_BYTES),
        )
        .map_err(ConfigError::Invalid)?;
        let sandbox_disk = match args
            .sandbox_disk
            .clone()
            .or(file.sandbox_disk)
            .unwrap_or_else(|| DEFAULT_SANDBOX_DISK.into())
        {
            q if q.trim() == "0" || q.trim().eq_ignore_ascii_case("none") => None,
            q => {
                let bytes = crate::service::units::parse_memory(&q)
                    .map_err(|e| ConfigError::Invalid(format!("sandbox_disk: {e}")))?;
                let limit = crate::backend::local::disk::DiskLimit {
                    bytes,
                    inodes: args
                        .sandbox_disk_inodes
                        .or(file.sandbox_disk_inodes)
                        .unwrap_or(1 << 20),
                };
                limit
                    .validate()
                    .map_err(|e| ConfigError::Invalid(format!("sandbox_disk: {e}")))?;
                Some(limit)
            }
        };
        let builtin = SandboxDefaults::default();
        let defaults = SandboxDefaults {
            cpu: args.default_cpu.or(file.default_cpu).unwrap_or(builtin.cpu),
            memory: args
                .default_memory
                .or(file.default_memory)
                .unwrap_or(builtin.memory),
            working_dir: args
                .default_working_dir
                .or(file.default_working_dir)
                .unwrap_or(builtin.working_dir),
        };
        crate::service::units::parse_cpu(&defaults.cpu)
            .map_err(|e| ConfigError::Invalid(format!("default_cpu: {e}")))?;
        crate::service::units::parse_memory(&defaults.memory)
            .map_err(|e| ConfigError::Invalid(format!("default_memory: {e}")))?;
        if !defaults.working_dir.starts_with('/') || defaults.working_dir.contains('\0') {
            return Err(ConfigError::Invalid(format!(
                "default_working_dir {:?}: must be an absolute path",
                defaults.working_dir
            )));
        }
        if policy.ready_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "ready_timeout_s must be at least 1".into(),
            ));
        }
        let mirrors = if args.registry_mirrors.is_empty() {
            file.registry_mirrors.unwrap_or_default()
        } else {
            args.registry_mirrors.clone()
        };
        let registry_mirrors = mirrors
            .iter()
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
        let state = StateChoice::parse(
            args.state.clone().or(file.state).as_deref(),
            args.state_prefix.clone().or(file.state_prefix),
        )?;
        let shared_state = matches!(state, StateChoice::Redis { .. });
        let max_concurrent_creates = args
            .max_concurrent_creates
            .or(file.max_concurrent_creates)
            .unwrap_or_else(|| {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                default_concurrent_creates(matches!(backend, BackendChoice::Local), cpus)
            })
            .max(1);
        Ok(Config {
            backend,
            state,
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| "127.0.0.1:8000".into()),
            api_keys,
            operator_keys,
            no_auth: args.no_auth.or(file.no_auth).unwrap_or(false),
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(default_data_dir),
            agent: args.agent.or(file.agent).unwrap_or_else(default_agent),
            harness: args.harness.or(file.harness),
            ready_file: args.ready_file.or(file.ready_file),
            policy,
            quotas: Quotas {
                max_sandboxes: args
                    .max_sandboxes_per_key
                    .or(file.max_sandboxes_per_key)
                    .unwrap_or(DEFAULT_MAX_SANDBOXES_PER_KEY),
                creates_per_minute: args
                    .creates_per_minute_per_key
                    .or(file.creates_per_minute_per_key)
                    .unwrap_or(DEFAULT_CREATES_PER_MINUTE_PER_KEY),
                snapshot_bytes,
                snapshot_bytes_total,
                snapshot_min_free,
            },
            defaults,
            max_concurrent_creates,
            create_queue: args.create_queue.or(file.create_queue).unwrap_or(4096),
            connections: ConnLimits {
                max_connections: args.max_connections.or(file.max_connections),
                max_connections_per_client: args
                    .max_connections_per_client
                    .or(file.max_connections_per_client)
                    .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_CLIENT)
                    .max(1),
                max_header_bytes: args
                    .max_header_bytes
                    .or(file.max_header_bytes)
                    .unwrap_or(DEFAULT_MAX_HEADER_BYTES),
                header_read_timeout: secs(
                    args.header_read_timeout_s,
                    file.header_read_timeout_s,
                    DEFAULT_HEADER_READ_TIMEOUT.as_secs(),
                )
                .max(Duration::from_secs(1)),
                body_timeout: secs(
                    args.body_timeout_s,
                    file.body_timeout_s,
                    DEFAULT_BODY_TIMEOUT.as_secs(),
                )
                .max(Duration::from_secs(1)),
            },
            job_output_cap: args
                .job_output_cap_bytes
                .or(file.job_output_cap_bytes)
                .unwrap_or(DEFAULT_JOB_OUTPUT_CAP)
                .max(1024),
            sandbox_disk,
            upload_spool,
            job_output_budget: args
                .job_output_budget_bytes
                .or(file.job_output_budget_bytes)
                .unwrap_or(crate::service::jobs::DEFAULT_OUTPUT_BUDGET),
            keep_sandboxes_on_exit: args
                .keep_sandboxes_on_exit
                .or(file.keep_sandboxes_on_exit)
                .unwrap_or(shared_state),
            registry_mirrors,
            allow_user_namespaces: args
                .allow_user_namespaces
                .or(file.allow_user_namespaces)
                .unwrap_or(false),
            allow_registries: {
                let mut allow = args.allow_registries.clone();
                if allow.is_empty() {
                    if let Ok(env) = std::env::var("ORCHARD_ALLOW_REGISTRIES") {
                        allow = split_keys(&env);
                    }
                }
                if allow.is_empty() {
                    allow = file.allow_registries.unwrap_or_default();
                }
                allow
            },
            egress: {
                let mut allow = args.egress_allow_cidrs.clone();
                if allow.is_empty() {
                    if let Ok(env) = std::env::var("ORCHARD_EGRESS_ALLOW_CIDRS") {
                        allow = split_keys(&env);
                    }
                }
                if allow.is_empty() {
                    allow = file.egress_allow_cidrs.unwrap_or_default();
                }
                crate::egress::EgressPolicy::parse(&allow)
                    .map_err(|e| ConfigError::Invalid(format!("egress_allow_cidrs: {e}")))?
            },
            log_level: args
                .log_level
                .or(file.log_level)
                .unwrap_or_else(|| "info".into()),
            registry,
        })
    }
}

#[cfg(test)]
mod pins;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lists_split_on_commas_spaces_and_newlines() {
        assert_eq!(
            split_keys("k1,k2 k3\nk4,\n  k5\t,,"),
            ["k1", "k2", "k3", "k4", "k5"]
        );
        assert!(split_keys(" , \n").is_empty());
    }

    #[test]
    #[cfg(feature = "redis")]
    fn the_state_is_memory_or_a_redis_url_from_the_flag_or_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchard.toml");
        std::fs::write(
            &file,
            "state = \"redis://10.0.0.5:6379/2\"\nstate_prefix = \"team-a\"\n",
        )
        .unwrap();
        let c = Config::resolve(ServeArgs {
            config: Some(file.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            c.state,
            StateChoice::Redis {
                url: "redis://10.0.0.5:6379/2".into(),
                prefix: "team-a".into()
            }
        );
        assert!(
            c.keep_sandboxes_on_exit,
            "a replica's exit keeps the shared sandboxes"
        );
        let c = Config::resolve(ServeArgs {
            config: Some(file),
            state: Some("memory".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.state, StateChoice::Memory, "the flag wins");
        assert!(!c.keep_sandboxes_on_exit);
        assert_eq!(
            Config::resolve(ServeArgs::default()).unwrap().state,
            StateChoice::Memory
        );
        for (state, prefix) in [("postgres://x", None), ("redis://x", Some(""))] {
            let err = Config::resolve(ServeArgs {
                state: Some(state.into()),
                state_prefix: prefix.map(String::from),
                ..Default::default()
            })
            .err()
            .unwrap();
            assert!(matches!(err, ConfigError::Invalid(_)), "{err}");
        }
    }

    /// A build without a backend's or a store's feature refuses to be configured with
    /// it, whichever way it is chosen, and names the feature.
    #[test]
    fn choosing_a_part_left_out_of_the_build_names_its_feature() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchard.toml");
        std::fs::write(
            &file,
            "backend = \"k8s\"\nstate = \"redis://10.0.0.5:6379\"\n",
        )
        .unwrap();
        let chosen = [
            (
                "kubernetes",
                cfg!(feature = "kubernetes"),
                ServeArgs {
                    backend: Some("kubernetes".into()),
                    ..Default::default()
                },
            ),
            (
                "kubernetes",
                cfg!(feature = "kubernetes"),
                ServeArgs {
                    config: Some(file.clone()),
                    state: Some("memory".into()),
                    ..Default::default()
                },
            ),
            (
                "redis",
                cfg!(feature = "redis"),
                ServeArgs {
                    state: Some("rediss://cache:6380".into()),
                    ..Default::default()
                },
            ),
            (
                "redis",
                cfg!(feature = "redis"),
                ServeArgs {
                    config: Some(file.clone()),
                    backend: Some("local".into()),
                    ..Default::default()
                },
            ),
        ];
        for (feature, built, args) in chosen {
            match Config::resolve(args) {
                Err(ConfigError::NotCompiled { feature: f, .. }) if !built => {
                    assert_eq!(f, feature)
                }
                Err(e) if !built => panic!("not the feature's error: {e}"),
                // With the feature the choice resolves (the cluster or Redis is reached
                // only when serving starts).
                Ok(_) if built => {}
                other => panic!("{feature} built: {built}, got {other:?}"),
            }
        }
        let err = ConfigError::NotCompiled {
            setting: "backend \"kubernetes\"".into(),
            feature: "kubernetes",
            instead: "local",
        };
        assert_eq!(
            err.to_string(),
            "backend \"kubernetes\": this orchard was built without the `kubernetes` feature; \
             build it with `cargo build -p orchard --features kubernetes` (on by default) or \
             use local"
        );
    }

    #[test]
    fn each_sandbox_disk_is_bounded_by_default_and_the_bound_can_be_turned_off() {
        let c = Config::resolve(ServeArgs::default()).unwrap();
        assert_eq!(
            c.sandbox_disk,
            Some(crate::backend::local::disk::DiskLimit {
                bytes: 10 << 30,
                inodes: 1 << 20
            })
        );
        for off in ["0", "none", "None"] {
            let c = Config::resolve(ServeArgs {
                sandbox_disk: Some(off.into()),
                ..Default::default()
            })
            .unwrap();
            assert_eq!(c.sandbox_disk, None, "{off}");
        }
        let c = Config::resolve(ServeArgs {
            sandbox_disk: Some("64Mi".into()),
            sandbox_disk_inodes: Some(4096),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            c.sandbox_disk.map(|d| (d.bytes, d.inodes)),
            Some((64 << 20, 4096))
        );
    }

    #[test]
    fn per_key_quotas_are_on_by_default_and_zero_turns_each_off() {
        let c = Config::resolve(ServeArgs::default()).unwrap();
        assert_eq!(c.quotas.max_sandboxes, DEFAULT_MAX_SANDBOXES_PER_KEY);
        assert_eq!(
            c.quotas.creates_per_minute,
            DEFAULT_CREATES_PER_MINUTE_PER_KEY
        );
        assert_eq!(c.quotas.snapshot_bytes, DEFAULT_SNAPSHOT_BYTES_PER_KEY);
        let c = Config::resolve(ServeArgs {
            max_sandboxes_per_key: Some(0),
            creates_per_minute_per_key: Some(0),
            snapshot_bytes_per_key: Some("0".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (
                c.quotas.max_sandboxes,
                c.quotas.creates_per_minute,
                c.quotas.snapshot_bytes
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn snapshots_and_upload_spools_are_bounded_on_the_host_by_default() {
        let c = Config::resolve(ServeArgs::default()).unwrap();
        assert_eq!(c.quotas.snapshot_bytes_total, Budget::Percent(50.0));
        assert_eq!(c.quotas.snapshot_min_free, Budget::Percent(5.0));
        assert_eq!(
            c.upload_spool,
            Budget::Bytes(4 << 30),
            "uploads' spools too"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchard.toml");
        std::fs::write(
            &file,
            "snapshot_bytes_total = \"100Gi\"\nsnapshot_min_free = \"0\"\n",
        )
        .unwrap();
        let c = Config::resolve(ServeArgs {
            config: Some(file.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.quotas.snapshot_bytes_total, Budget::Bytes(100 << 30));
        assert_eq!(c.quotas.snapshot_min_free, Budget::Off, "0 turns it off");
        let c = Config::resolve(ServeArgs {
            config: Some(file),
            snapshot_bytes_total: Some("1Mi".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            c.quotas.snapshot_bytes_total,
            Budget::Bytes(1 << 20),
            "flag wins"
        );
        let e = Config::resolve(ServeArgs {
            snapshot_min_free: Some("lots".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("snapshot_min_free"), "{e}");
    }

    #[test]
    fn concurrent_creates_default_to_four_per_cpu_on_the_local_backend() {
        assert_eq!(default_concurrent_creates(true, 1), 4);
        assert_eq!(default_concurrent_creates(true, 2), 8);
        assert_eq!(default_concurrent_creates(true, 8), 32);
        assert_eq!(default_concurrent_creates(true, 64), 64);
        assert_eq!(default_concurrent_creates(false, 2), 64);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let c = Config::resolve(ServeArgs::default()).unwrap();
        assert_eq!(c.max_concurrent_creates, (4 * cpus).clamp(4, 64));
        let c = Config::resolve(ServeArgs {
            max_concurrent_creates: Some(100),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.max_concurrent_creates, 100);
    }

    #[test]
    fn bad_defaults_are_refused_at_start() {
        for args in [
            ServeArgs {
                default_cpu: Some("lots".into()),
                ..Default::default()
            },
            ServeArgs {
                default_memory: Some("16 gigs".into()),
                ..Default::default()
            },
            ServeArgs {
                default_working_dir: Some("workspace".into()),
                ..Default::default()
            },
        ] {
            assert!(matches!(
                Config::resolve(args),
                Err(ConfigError::Invalid(_))
            ));
        }
    }

    #[test]
    fn registry_credentials_merge_per_host_and_the_budget_parses() {
        let dir = tempfile::tempdir().unwrap();
        let docker = dir.path().join("config.json");
        // base64("a:from-docker"), base64("b:from-docker")
        std::fs::write(
            &docker,
            r#"{"auths": {"one.io": {"auth": "YTpmcm9tLWRvY2tlcg=="}, "two.io": {"auth": "Yjpmcm9tLWRvY2tlcg=="}}}"#,
        )
        .unwrap();
        let file = dir.path().join("orchard.toml");
        std::fs::write(
            &file,
            format!(
                "registry_config = {:?}\nregistry_auth = [\"two.io=b:from-toml\", \"three.io=c:from-toml\"]\nimage_disk_budget = \"20Gi\"\n",
                docker.display()
            ),
        )
        .unwrap();
        let c = Config::resolve(ServeArgs {
            config: Some(file.clone()),
            registry_auth: vec![Secret("three.io=c:from-flag".into())],
            image_gc_interval_s: Some(60),
            ..Default::default()
        })
        .unwrap();
        let creds = &c.registry.credentials;
        assert_eq!(creds["one.io"], Credentials::basic("a", "from-docker"));
        assert_eq!(creds["two.io"], Credentials::basic("b", "from-toml"));
        assert_eq!(creds["three.io"], Credentials::basic("c", "from-flag"));
        let gc = c.registry.gc.unwrap();
        assert_eq!(gc.budget, Budget::Bytes(20 << 30));
        assert_eq!(gc.interval, Duration::from_secs(60));
        // Nothing secret in the configuration's debug form.
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("from-") && !debug.contains("Ynpm"),
            "{debug}"
        );
        assert!(!format!("{:?}", Secret("x=u:pw".into())).contains("pw"));
        let missing = Config::resolve(ServeArgs {
            registry_config: Some(dir.path().join("nope.json")),
            ..Default::default()
        })
        .unwrap_err();
        assert!(missing.to_string().contains("nope.json"), "{missing}");
        let off = Config::resolve(ServeArgs {
            registry_config: Some(docker),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            off.registry.gc.unwrap().budget,
            Budget::Off,
            "off by default"
        );
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orchard.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9999\"\nttl_s = 60\nready_timeout_s = 10\napi_keys = [\"k1\"]\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(file.clone()),
            ready_timeout_s: Some(20),
            ..Default::default()
        };
        let c = Config::resolve(args).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9999", "from the file");
        assert_eq!(c.policy.ready_timeout, Duration::from_secs(20), "flag wins");
        assert_eq!(c.policy.default_ttl, Some(Duration::from_secs(60)));
        assert_eq!(
            c.policy.heartbeat_timeout,
            Duration::from_secs(300),
            "default"
        );
        assert!(!c.no_auth, "auth is on unless disabled explicitly");
        assert_eq!(c.policy.exec_timeout, Duration::from_secs(300), "Orchard's");
        assert_eq!(c.defaults, SandboxDefaults::default());
        assert_eq!(
            (c.defaults.cpu.as_str(), c.defaults.memory.as_str()),
            ("4", "16Gi")
        );
        assert!(c.policy.heartbeat_reaping);
        let unknown = dir.path().join("bad.toml");
        std::fs::write(&unknown, "lisen = \"x\"\n").unwrap();
        let e = Config::resolve(ServeArgs {
            config: Some(unknown),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("lisen"), "{e}");
    }
}
