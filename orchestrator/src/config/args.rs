//! Every setting of `orchard serve`, declared once: the flag and its variable (clap's
//! `#[arg(long, env)]`), the file key (serde: the field's name, or its `rename`), the
//! help text (the doc comment) and, through [`Merge`], how a source lies over another
//! (a setting one source leaves unset comes from the next).
//!
//! Every value is optional, so each source fills only what it sets; the defaults come
//! last, in [`super::resolve`]. A repeatable flag's list is `None` when the flag is not
//! given. Its variable takes the whole list in one value (read in [`super::sources`]:
//! clap's `env` would take it as one entry).

use std::path::PathBuf;

use merge::Merge;
use serde::Deserialize;

/// Flags and environment of `orchard serve`. Every value is optional so the file and
/// the defaults can fill what is unset.
#[derive(clap::Args, Deserialize, Merge, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
#[merge(strategy = merge::option::overwrite_none)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "ORCHARD_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8000].
    #[arg(long, env = "ORCHARD_LISTEN")]
    pub listen: Option<String>,
    /// An accepted API key (repeatable); ORCHARD_API_KEYS (or Orchard's API_KEYS) takes
    /// a list separated by commas, spaces or newlines.
    #[arg(long = "api-key")]
    pub api_keys: Option<Vec<String>>,
    /// A key that may also import and delete the shared images (repeatable; also
    /// accepted as an ordinary key); ORCHARD_OPERATOR_KEYS takes a list. Without any, a
    /// server with one key lets it, a server with several lets none.
    #[arg(long = "operator-key")]
    pub operator_keys: Option<Vec<String>>,
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
    #[serde(rename = "kubernetes", default)]
    #[merge(strategy = merge::Merge::merge)]
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
    #[serde(skip)]
    pub workers: Option<usize>,
    /// Scheduler slice, in microseconds, asked for the server's threads (see
    /// the `orchard-sched` crate); 0 keeps the kernel's default [default: 100].
    #[arg(long, env = "ORCHARD_LATENCY_SLICE_US")]
    #[serde(skip)]
    pub latency_slice_us: Option<u64>,
    /// Nice level asked for the server's scheduling group (its session's autogroup;
    /// only when the server leads its own session, as `make run` and `setsid` start
    /// it) [default: -10]. The local backend's sandboxes are scheduled beside it, each
    /// with the default weight: without it, a hundred busy sandboxes left the server,
    /// through which every call passes, a hundredth of the CPU (docs/scale.md). 0
    /// keeps the kernel's default.
    #[arg(long, env = "ORCHARD_GROUP_NICE", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    #[serde(skip)]
    pub group_nice: Option<i32>,
    /// Creates running at the backend at once; more wait in the queue [default: local
    /// backend two per CPU, at least 4 and at most 64; kubernetes 64].
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
    pub registry_mirrors: Option<Vec<String>>,
    /// A registry host (`host` or `host:port`) pulls may reach although it is a
    /// loopback or link-local address (repeatable; ORCHARD_ALLOW_REGISTRIES takes a
    /// list). Mirrors are allowed already [default: none].
    #[arg(long = "allow-registry")]
    pub allow_registries: Option<Vec<String>>,
    /// A private or link-local range (`ADDR/LEN`) sandboxes with egress, and pulls, may
    /// reach anyway (repeatable; ORCHARD_EGRESS_ALLOW_CIDRS takes a list). Egress means
    /// the internet only otherwise: no private, link-local (cloud metadata) or host
    /// address [default: none].
    #[arg(long = "egress-allow-cidr")]
    pub egress_allow_cidrs: Option<Vec<String>>,
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
    pub registry_auth: Option<Vec<Secret>>,
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
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
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
