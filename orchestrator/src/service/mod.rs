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
//! agent pool), [`error`] (the service's error
//! enum), `policy` (TTL, heartbeats, readiness, reconciliation on one loop), `fair`
//! (the create slots, shared by the keys in turn).

//!
//! The parts import one way: leaves first ([`error`], [`config`], `checks`, [`auth`],
//! [`runtime`], `fair`, `keyed`, and `handle`, which holds [`Service`] itself), then
//! `exec` (a job's run and outcome), `worker`, [`jobs`], [`sandboxes`], [`snapshots`],
//! `policy`; this module only gathers them and opens the service.

pub mod auth;
mod checks;
pub mod config;
pub mod error;
mod exec;
mod fair;
pub mod files;
mod handle;
pub mod jobs;
pub mod json;
mod keyed;
pub mod patch;
mod policy;
pub mod runtime;
pub mod sandboxes;
pub mod snapshots;
mod worker;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

pub use crate::state::{JobOptions, Phase, SandboxRecord};
pub use crate::time::{now_ms, now_secs};
/// The quantities moved to [`crate::units`], a leaf the backends may import too; the old
/// path stays.
pub use crate::units;
pub use auth::{Keys, Tenant};
pub use checks::{MAX_ENV_BYTES, MAX_LABELS};
pub use config::{
    CreateRequest, Policy, Quotas, SandboxDefaults, ServiceConfig, DEFAULT_JOB_OUTPUT_CAP,
};
pub use error::{BadEnv, BadLabel, Error, OverCapacity, QuotaExceeded, SnapshotStorage};
pub use handle::Service;
pub use runtime::Live;

use crate::backend::Backend;
use crate::image::ImageStore;
use crate::metrics::Metrics;
use crate::state::memory::MemoryStore;
use crate::state::StateStore;
use handle::Inner;

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
        config::fit_defaults(&mut config.defaults, backend.capacity());
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
}

#[cfg(test)]
mod tests;
