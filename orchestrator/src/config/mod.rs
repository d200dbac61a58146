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
//! - [`registry`]: registry credentials (which add up across sources) and image GC;
//! - [`defaults`] and [`error`]: the leaves the others share; this file only gathers.

pub mod args;
pub mod choices;
pub mod defaults;
pub mod error;
pub mod registry;
pub mod resolve;
pub mod sources;

#[cfg(test)]
mod pins;
#[cfg(test)]
mod tests;

pub use args::{Secret, ServeArgs};
pub use choices::{BackendChoice, StateChoice};
pub use defaults::*;
pub use error::ConfigError;
pub use registry::RegistryAndGc;
pub use resolve::{default_agent, default_concurrent_creates, Config};
pub use sources::{split_keys, Env};
