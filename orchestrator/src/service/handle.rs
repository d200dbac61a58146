//! The service's handle, [`Service`], and what its clones share ([`Inner`]): the
//! backend, the store, the configuration, this process's runtime and create slots.
//! Every part of the service adds its methods to [`Service`] from its own file; this
//! leaf only holds the type and its accessors, so no part imports the module that
//! gathers them.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{Policy, ServiceConfig};
use super::runtime::{Live, Runtime};
use super::{fair, keyed};
use crate::backend::Backend;
use crate::image::ImageStore;
use crate::metrics::Metrics;
use crate::state::{Lease, SandboxRecord, StateStore};

pub(super) struct Inner {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) images: ImageStore,
    pub(super) config: ServiceConfig,
    pub(super) store: Arc<dyn StateStore>,
    pub(super) runtime: Runtime,
    pub(super) metrics: Arc<Metrics>,
    /// Creates accepted and not finished (queued or running at the backend), in this
    /// process.
    pub(super) pending: AtomicU64,
    /// Creates running at the backend at once ([`ServiceConfig::max_concurrent_creates`]).
    pub(super) create_slots: fair::FairSlots,
    pub(super) started: Instant,
    /// This process's name as a lease holder.
    pub(super) holder: String,
    /// Reconciliations in a row that held back a mass failure (see `policy::reconcile`);
    /// only the policy loop (one pass at a time) touches it.
    pub(super) held_reconciles: AtomicU64,
    /// One snapshot quota check at a time per key (`snapshots`).
    pub(super) snapshot_checks: keyed::KeyedLock,
    /// One check of the host-wide snapshot bounds at a time, whatever the key (taken
    /// after the key's lock): two keys' snapshots finishing together must not both see
    /// the total from before the other.
    pub(super) snapshot_host_check: tokio::sync::Mutex<()>,
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    pub(super) inner: Arc<Inner>,
}

impl Service {
    /// The state store.
    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.inner.store
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

    /// Seconds since start.
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// The service's configuration.
    pub fn config(&self) -> &ServiceConfig {
        &self.inner.config
    }

    /// Creates accepted and not yet finished (queued or starting) in this process.
    pub fn pending_creates(&self) -> u64 {
        self.inner
            .pending
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// When `record` is reaped by its TTL or its heartbeats stopping, under this
    /// service's policy.
    pub fn expires_ms(&self, record: &SandboxRecord) -> Option<u64> {
        let policy = self.policy();
        record.expires_ms(policy.heartbeat_reaping.then_some(policy.heartbeat_timeout))
    }

    /// Default working directory of compatible commands and paths.
    pub fn default_dir(live: &Live) -> &str {
        &live.workdir
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

    /// Renews a job worker's `lease`; `false` only when the store says another holder
    /// has it (a store that cannot answer is not a lost lease: the fences guard the
    /// writes).
    pub(super) async fn renew_worker_lease(&self, lease: &Lease) -> bool {
        let ttl = self.policy().worker_lease;
        !matches!(self.store().renew_lease(lease, ttl).await, Ok(false))
    }
}
