//! The one background loop of lifecycle policies: every `interval` it deletes sandboxes
//! whose TTL ended or whose heartbeats stopped (only those that sent one), fails
//! pending sandboxes whose creating replica died, and purges old jobs; every `reconcile_interval` it compares the records with the backend's list,
//! failing records whose sandbox is gone and removing backend sandboxes no record owns.
//! Reconciliation is skipped when the backend cannot list: a backend that cannot answer
//! must not make the server forget or delete anything.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{now_ms, Inner, Phase, Service};

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
            expire(&service).await;
            fail_orphaned_creates(&service).await;
            service.purge_jobs().await;
            if last_reconcile.elapsed() >= policy.reconcile_interval {
                last_reconcile = Instant::now();
                reconcile(&service).await;
            }
        }
    });
}

/// Deletes sandboxes past their TTL or heartbeat period.
pub(super) async fn expire(service: &Service) {
    let now = now_ms();
    let policy = service.policy().clone();
    let expired: Vec<_> = service
        .all()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| service.expires_ms(r).is_some_and(|t| t <= now))
        .collect();
    for r in expired {
        let why = if policy.heartbeat_reaping
            && r.heartbeat_ms
                .is_some_and(|h| h + policy.heartbeat_timeout.as_millis() as u64 <= now)
        {
            "no heartbeat within the heartbeat period"
        } else {
            "its time to live ended"
        };
        let _ = service.remove(&r, why).await;
    }
}

/// What a pending record whose creator is gone ends with.
pub const ORPHANED_CREATE: &str =
    "the orchestrator replica creating this sandbox stopped before it was ready";

/// Fails the pending records whose create lease nobody holds: their creator (another
/// replica, with a shared store) died mid-create, and nobody else would ever mark them.
/// Whatever the dead create made at the backend is deleted.
pub(super) async fn fail_orphaned_creates(service: &Service) {
    let Ok(records) = service.all().await else {
        return;
    };
    // Not the creates' holder name: in one process, a create of this very process
    // must still count as held.
    let prober = format!("{}/policy", service.inner.holder);
    for r in records.iter().filter(|r| r.phase == Phase::Pending) {
        let name = super::sandboxes::create_lease(&r.id);
        let ttl = service.policy().worker_lease;
        let Ok(Some(lease)) = service.store().acquire_lease(&name, &prober, ttl).await else {
            continue;
        };
        let failed = service
            .update(None, &r.id, Some(&r.uid), |rec| {
                if rec.phase == Phase::Pending {
                    rec.phase = Phase::Failed {
                        message: ORPHANED_CREATE.into(),
                    };
                }
            })
            .await;
        if failed.is_ok_and(
            |rec| matches!(&rec.phase, Phase::Failed { message } if message == ORPHANED_CREATE),
        ) {
            tracing::warn!(sandbox_id = %r.id, "a create's replica stopped; the sandbox failed");
            let _ = service.backend().delete(&r.id).await;
        }
        let _ = service.store().release_lease(&lease).await;
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
    let in_backend: HashMap<&str, bool> = list.iter().map(|s| (s.id.as_str(), s.running)).collect();
    let Ok(records) = service.all().await else {
        return false;
    };
    for r in &records {
        if r.phase != Phase::Ready {
            continue;
        }
        let message = match in_backend.get(r.id.as_str()) {
            Some(true) => continue,
            Some(false) => "the sandbox stopped on its own",
            None => "the sandbox disappeared from the backend",
        };
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

impl Service {
    /// Runs the expiry pass now (tests and the loop).
    pub async fn expire_now(&self) {
        expire(self).await
    }

    /// Runs reconciliation now; false when the backend could not list.
    pub async fn reconcile_now(&self) -> bool {
        reconcile(self).await
    }
}
