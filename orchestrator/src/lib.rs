//! The Orchard Env orchestrator library; the `orchard` binary is a thin layer over it.
//!
//! - [`image`]: the image store, the `orchard-image` crate: pulls from OCI/Docker
//!   registries and imports archives into a content-addressed store of unpacked layers.
//! - [`backend`]: where sandboxes run; [`backend::local`] drives runc over overlayfs.
//! - [`service`]: records, lifecycle, jobs, quotas and policies, independent of HTTP.
//! - [`state`]: the [`state::StateStore`] trait (records, jobs, quotas, leases,
//!   notifications) and its in-memory implementation.
//! - [`server`]: the REST API (Orchard-compatible routes and `/v1/`).
//! - [`config`], [`serve`]: `orchard serve`. The commands for people (`orchard sandbox`,
//!   `image`, `snapshot`) are the `orchard-cli` crate, which the binary calls.
//! - [`metrics`], [`log`]: Prometheus metrics and JSON logs.
//! - [`random`]: the one source of random ids, tokens and keys.
//! - [`units`]: CPU and memory quantities (`"500m"`, `"16Gi"`), for the service, the
//!   configuration and the Kubernetes backend alike.
//! - [`diskspace`], [`egress`]: leaves shared with the image store, which holds them
//!   (`orchard-image`): what a file system holds and has free, and which addresses
//!   egress may not reach.

pub mod atomic_file;
pub mod backend;
pub mod config;
pub use orchard_image as image;
pub use orchard_image::{diskspace, egress};
pub use orchard_log as log;
pub mod metrics;
pub mod random;
pub mod serve;
pub mod server;
pub mod service;
pub mod state;
pub mod time;
pub mod units;
