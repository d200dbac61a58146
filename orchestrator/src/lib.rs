//! The Orchard Env orchestrator library; the `orchard` binary is a thin layer over it.
//!
//! - [`image`]: the image store: pulls from OCI/Docker registries and imports archives
//!   into a content-addressed store of unpacked layers.
//! - [`backend`]: where sandboxes run; [`backend::local`] drives runc over overlayfs.
//! - [`service`]: records, lifecycle, jobs, quotas and policies, independent of HTTP.
//! - [`state`]: the [`state::StateStore`] trait (records, jobs, quotas, leases,
//!   notifications) and its in-memory implementation.
//! - [`server`]: the REST API (Orchard-compatible routes and `/v1/`).
//! - [`config`], [`serve`]: `orchard serve`; [`cli`]: the commands for people.
//! - [`metrics`], [`log`]: Prometheus metrics and JSON logs.
//! - [`random`]: the one source of random ids, tokens and keys.
//! - [`diskspace`]: what a file system holds and has free (`statvfs`).

pub mod atomic_file;
pub mod backend;
pub mod cli;
pub mod config;
pub mod diskspace;
pub mod egress;
pub mod image;
pub use orchard_log as log;
pub mod metrics;
pub mod random;
pub mod serve;
pub mod server;
pub mod service;
pub mod state;
pub mod time;
