//! The one background loop of lifecycle policies: every `interval` it deletes sandboxes
//! whose TTL ended or whose heartbeats stopped (only those that sent one), fails
//! pending sandboxes whose creating replica died, and purges old jobs; every
//! `reconcile_interval` it compares the records with the backend's list, failing
//! records whose sandbox is gone and removing backend sandboxes no record owns or whose
//! record failed.
//! Reconciliation is skipped when the backend cannot list: a backend that cannot answer
//! must not make the server forget or delete anything.
//!
//! Never delete on doubt (issue 30: a descriptor flood made every `/proc` read fail and
//! reconciliation deleted every tenant's sandboxes): a record fails only on evidence (the
//! backend says its sandbox stopped, or lists without it); `Liveness::Unknown` is left
//! alone. And a pass that would fail more than [`MASS_FAILURE_SHARE`] of the ready fleet
//! (and more than [`MASS_FAILURE_MIN`] sandboxes) holds back and logs instead; only when
//! [`MASS_FAILURE_CONFIRMATIONS`] passes in a row see it does it go ahead (a host that
//! really lost its sandboxes is still cleaned up, a few intervals later).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use std::sync::atomic::{AtomicBool, Ordering};

use super::handle::{Inner, Service};
use crate::backend::Liveness;
use crate::state::Phase;
use crate::state::SandboxRecord;
use crate::time::now_ms;

/// A pass failing more than this share of the ready sandboxes is a mass failure.
pub const MASS_FAILURE_SHARE: f64 = 0.2;
/// ... when it fails more than this many (a small fleet losing two is no alarm).
pub const MASS_FAILURE_MIN: usize = 3;
/// Passes in a row that must see a mass failure before it is carried out.
pub const MASS_FAILURE_CONFIRMATIONS: u64 = 3;

/// How long the policy lease lasts: one replica runs the loop at a time.
const POLICY_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(15);

/// Starts the loop; it ends when the service is dropped. Each pass runs only while this
/// process holds the `policy` lease, so with a shared store one replica expires and
/// reconciles at a time.
pub(super) fn spawn(service: &Service) {
    let weak: Weak<Inner> = Arc::downgrade(&service.inner);
    let policy = service.policy().clone();
    tokio::spawn(async move {
        // The first pass comes one interval after start, not at once: nothing is due yet.
        let first = tokio::time::Instant::now() + policy.interval;
        let mut tick = tokio::time::interval_at(first, policy.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_reconcile = Instant::now();
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let service = Service { inner };
            let ttl = POLICY_LEASE_TTL.max(policy.interval * 3);
            let holder = service.inner.holder.clone();
            match service.store().acquire_lease("policy", &holder, ttl).await {
                Ok(Some(_)) => {}
                _ => continue,
            }
            // One read of the records for both passes (with Redis, a read of them all).
            if let Ok(records) = service.all().await {
                expire(&service, &records).await;
                fail_orphaned_creates(&service, &records).await;
                if service.store().shared() {
                    attend_unattended(&service, &records).await;
                }
            }
            service.purge_jobs().await;
            if last_reconcile.elapsed() >= policy.reconcile_interval {
                last_reconcile = Instant::now();
                reconcile(&service).await;
            }
        }
    });
}

/// Deletes the sandboxes of `records` past their TTL or heartbeat period.
pub(super) async fn expire(service: &Service, records: &[SandboxRecord]) {
    let now = now_ms();
    let policy = service.policy().clone();
    let expired = records
        .iter()
        .filter(|r| service.expires_ms(r).is_some_and(|t| t <= now));
    for r in expired {
        let why = if policy.heartbeat_reaping
            && r.heartbeat_ms
                .is_some_and(|h| h + policy.heartbeat_timeout.as_millis() as u64 <= now)
        {
            "no heartbeat within the heartbeat period"
        } else {
            "its time to live ended"
        };
        let _ = service.remove(r, why).await;
    }
}

/// What a pending record whose creator is gone ends with.
pub const ORPHANED_CREATE: &str =
    "the orchestrator replica creating this sandbox stopped before it was ready";

/// Fails the pending records whose create lease nobody holds: their creator (another
/// replica, with a shared store) died mid-create, and nobody else would ever mark them.
/// Whatever the dead create made at the backend is deleted.
pub(super) async fn fail_orphaned_creates(service: &Service, records: &[SandboxRecord]) {
    // Not the creates' holder name: in one process, a create of this very process
    // must still count as held.
    let prober = format!("{}/policy", service.inner.holder);
    for r in records.iter().filter(|r| r.phase == Phase::Pending) {
        let name = super::sandboxes::create_lease(&r.id);
        let ttl = service.policy().worker_lease;
        let Ok(Some(lease)) = service.store().acquire_lease(&name, &prober, ttl).await else {
            continue;
        };
        // Whether the write that landed is the one that failed it: set by the change
        // itself (run again on each retry), not read back from the record's message.
        let failed_it = AtomicBool::new(false);
        let updated = service
            .update(None, &r.id, Some(&r.uid), |rec| {
                let pending = rec.phase == Phase::Pending;
                failed_it.store(pending, Ordering::Relaxed);
                if pending {
                    rec.phase = Phase::Failed {
                        message: ORPHANED_CREATE.into(),
                    };
                }
            })
            .await;
        if updated.is_ok() && failed_it.load(Ordering::Relaxed) {
            tracing::warn!(sandbox_id = %r.id, "a create's replica stopped; the sandbox failed");
            let _ = service.backend().delete(&r.id).await;
        }
        let _ = service.store().release_lease(&lease).await;
    }
}

/// Starts a worker here for every sandbox whose jobs no worker attends to: the replica
/// whose worker held them died, and no other replica has a worker for the sandbox
/// (workers start where a sandbox is created or a job is accepted). The worker takes
/// the jobs over, or ends them with the reason when the sandbox is gone. Only with a
/// shared store: in one process every job's worker lives as long as the process.
pub(super) async fn attend_unattended(service: &Service, records: &[SandboxRecord]) {
    let prefix = super::worker::LEASE_PREFIX;
    let Ok(ids) = service.store().unattended_sandboxes(prefix).await else {
        return;
    };
    for id in ids {
        let uid = match records.iter().find(|r| r.id == id) {
            Some(r) => r.uid.clone(),
            // Created since the read, or gone: the record says which.
            None => match service.store().sandbox(&id).await {
                Ok(Some(r)) => r.value.uid,
                Ok(None) => String::new(),
                Err(_) => continue,
            },
        };
        tracing::warn!(sandbox_id = %id, "starting a worker for jobs no replica attends to");
        super::worker::spawn_worker_for(service, &id, &uid);
    }
}

/// Compares records with the backend; answers whether it could.
pub(super) async fn reconcile(service: &Service) -> bool {
    let list = match service.backend().list().await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "reconciliation skipped: the backend cannot list");
            return false;
        }
    };
    let in_backend: HashMap<&str, Liveness> =
        list.iter().map(|s| (s.id.as_str(), s.liveness)).collect();
    let Ok(records) = service.all().await else {
        return false;
    };
    for r in &records {
        if let Phase::Failed { .. } = r.phase {
            // A failed sandbox holds nothing at the backend: what a failed delete (a
            // replica killed mid-way) left goes now.
            // Still this incarnation: one made again under the id since the reads above
            // must not lose its sandbox.
            if in_backend.contains_key(r.id.as_str()) && service.is_current(r).await {
                tracing::warn!(sandbox_id = %r.id, "removing what a failed sandbox left");
                let _ = service.backend().delete(&r.id).await;
            }
        }
    }
    let ready = records.iter().filter(|r| r.phase == Phase::Ready).count();
    let lost = lost_sandboxes(&records, &in_backend);
    if !carry_out(service, lost.len(), ready) {
        return true;
    }
    for (r, message) in lost {
        let failed = service
            .update(None, &r.id, Some(&r.uid), |rec| {
                rec.phase = Phase::Failed {
                    message: message.into(),
                }
            })
            .await;
        if failed.is_ok() && in_backend.contains_key(r.id.as_str()) {
            let _ = service.backend().delete(&r.id).await;
        }
    }
    // Read again: a create that finished meanwhile owns its sandbox.
    let known: Vec<String> = match service.all().await {
        Ok(all) => all.into_iter().map(|r| r.id).collect(),
        Err(_) => return true,
    };
    for sb in &list {
        if !known.contains(&sb.id) && sb.labels.contains_key("orchard.tenant") {
            tracing::warn!(sandbox_id = %sb.id, "removing a sandbox no record owns");
            let _ = service.backend().delete(&sb.id).await;
        }
    }
    true
}

/// The ready records the backend gives evidence against, with why: it says their
/// sandbox stopped, or does not list it. `Unknown` is no evidence.
fn lost_sandboxes<'a>(
    records: &'a [SandboxRecord],
    in_backend: &HashMap<&str, Liveness>,
) -> Vec<(&'a SandboxRecord, &'static str)> {
    records
        .iter()
        .filter(|r| r.phase == Phase::Ready)
        .filter_map(|r| {
            let why = match in_backend.get(r.id.as_str()) {
                Some(Liveness::Running) => return None,
                Some(Liveness::Unknown) => {
                    tracing::warn!(sandbox_id = %r.id, "cannot tell whether the sandbox runs; left as it is");
                    return None;
                }
                Some(Liveness::Stopped) => "the sandbox stopped on its own",
                None => "the sandbox disappeared from the backend",
            };
            Some((r, why))
        })
        .collect()
}

/// Whether failing `lost` of `ready` sandboxes may go ahead: a mass failure holds back
/// until [`MASS_FAILURE_CONFIRMATIONS`] passes in a row have seen one.
fn carry_out(service: &Service, lost: usize, ready: usize) -> bool {
    let held = &service.inner.held_reconciles;
    let mass = lost > MASS_FAILURE_MIN && lost as f64 > ready as f64 * MASS_FAILURE_SHARE;
    if !mass {
        held.store(0, Ordering::Relaxed);
        return true;
    }
    let seen = held.fetch_add(1, Ordering::Relaxed) + 1;
    if seen < MASS_FAILURE_CONFIRMATIONS {
        tracing::error!(
            lost,
            ready,
            seen,
            needed = MASS_FAILURE_CONFIRMATIONS,
            "reconciliation held back: it would fail a large share of the sandboxes at once; nothing is failed until later passes see the same"
        );
        return false;
    }
    tracing::error!(
        lost,
        ready,
        "reconciliation fails a large share of the sandboxes, seen in {seen} passes in a row"
    );
    held.store(0, Ordering::Relaxed);
    true
}

impl Service {
    /// Runs the expiry pass now (tests).
    pub async fn expire_now(&self) {
        if let Ok(records) = self.all().await {
            expire(self, &records).await
        }
    }

    /// Runs reconciliation now; false when the backend could not list.
    pub async fn reconcile_now(&self) -> bool {
        reconcile(self).await
    }
}
