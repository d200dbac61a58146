//! `orchard serve` configuration: a TOML file, environment variables and flags.
//!
//! Precedence, highest first: **flags, then environment (`ORCHARD_*`), then the file
//! (`--config` / `ORCHARD_CONFIG`), then defaults**. A setting has all three forms:
//! `--ready-timeout-s 60`, `ORCHARD_READY_TIMEOUT_S=60`, `ready_timeout_s = 60`; but
//! `--workers`, `--latency-slice-us` and `--group-nice` (read before the runtime
//! starts) have no file key, `--registry-mirror` has no variable, and the Kubernetes
//! pods' `node_selector` and `pod_annotations` are tables of the file only.
//! With nothing set, the server listens on 127.0.0.1:8000 with the local backend, keeps
//! its state under the data directory, and generates an API key (saved there, printed
//! once) unless auth is explicitly disabled.
//!
//! One struct, [`ServeArgs`], declares every setting once: its flag and variable
//! (clap's `#[arg(long, env)]`), its file key (serde; the `[kubernetes]` table is
//! [`KubeArgs`](crate::backend::kubernetes::KubeArgs), flattened into it) and its help
//! text. Each source fills a `ServeArgs` and one derived merge ([`merge::Merge`]) lays
//! them over each other: clap gives flags over variables, [`sources`] adds the list
//! variables and the file beneath. [`resolve`] then turns the merged settings into a
//! [`Config`], each default taken where it is written once: the service's own
//! defaults ([`ServiceConfig::new`](crate::service::ServiceConfig::new),
//! [`ConnLimits::default`], `KubeConfig::default`) or a constant of this module.
//!
//! - [`args`]: the settings, their flags, variables, keys and help;
//! - [`sources`]: the environment, the file and the list variables as layers;
//! - [`resolve`]: layered settings to a [`Config`], with the defaults and checks;
//! - [`choices`]: which backend and which state store;
//! - [`registry`]: registry credentials (which add up across sources) and image GC.

use std::path::PathBuf;

use crate::image::credentials::CredentialsError;
use crate::image::gc::Budget;
use crate::server::listen::ConnLimits;
use crate::service::ServiceConfig;

pub mod args;
pub mod choices;
pub mod registry;
pub mod resolve;
pub mod sources;

#[cfg(test)]
mod pins;
#[cfg(test)]
mod tests;

pub use args::{Secret, ServeArgs};
pub use choices::{BackendChoice, StateChoice};
pub use registry::RegistryAndGc;
pub use resolve::{default_agent, default_concurrent_creates};
pub use sources::Env;

/// Address the server listens on unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
/// Log level unless told otherwise.
pub const DEFAULT_LOG_LEVEL: &str = "info";
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
/// Each sandbox's writable layer by default (`--sandbox-disk`): bounded, so one sandbox
/// cannot fill the host's disk; "0" or "none" turns the bound off.
pub const DEFAULT_SANDBOX_DISK: &str = "10Gi";
/// Files and directories each bounded sandbox disk may hold by default.
pub const DEFAULT_SANDBOX_DISK_INODES: u64 = 1 << 20;
/// Seconds between image GC passes by default.
pub const DEFAULT_IMAGE_GC_INTERVAL_S: u64 = 300;

/// A list of keys as Orchard's `API_KEYS` takes them: separated by commas, spaces or
/// newlines, empty entries dropped.
pub fn split_keys(list: &str) -> Vec<String> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
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
