//! The one background loop of lifecycle policies: every `interval` it deletes sandboxes
//! whose TTL ended or whose heartbeats stopped (only those that sent one) and purges old
//! jobs; every `reconcile_interval` it compares the records with the backend's list,
//! failing records whose sandbox is gone and removing backend sandboxes no record owns.
//! Reconciliation is skipped when the backend cannot list: a backend that cannot answer
//! must not make the server forget or delete anything.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{now_ms, Inner, Phase, Service};

/// Starts the loop; it ends when the service is dropped.
pub(super) fn spawn(service: &Service) {
    let weak: Weak<Inner> = Arc::downgrade(&service.inner);
    let policy = service.policy().clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(policy.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_reconcile = Instant::now();
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let service = Service { inner };
            expire(&service).await;
            service.jobs().purge();
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
        .records()
        .values()
        .filter(|r| r.expires_ms(&policy).is_some_and(|t| t <= now))
        .cloned()
        .collect();
    for r in expired {
        let why = if policy.heartbeat_reaping
            && r.heartbeat_ms()
                .is_some_and(|h| h + policy.heartbeat_timeout.as_millis() as u64 <= now)
        {
            "no heartbeat within the heartbeat period"
        } else {
            "its time to live ended"
        };
        service.remove(&r, why).await;
    }
}

/// Compares records with the backend; answers whether it could.
pub(super) async fn reconcile(service: &Service) -> bool {
    let list = match service.backend().list().await {
        Ok(l) => l,
        Err(e) => {
            crate::log::warn(
                "reconciliation skipped: the backend cannot list",
                &[("error", &e.to_string())],
            );
            return false;
        }
    };
    let in_backend: HashMap<&str, bool> = list.iter().map(|s| (s.id.as_str(), s.running)).collect();
    let records: Vec<_> = service.records().values().cloned().collect();
    for r in &records {
        if let Phase::Running(_) = r.phase() {
            match in_backend.get(r.id.as_str()) {
                Some(true) => {}
                Some(false) => {
                    r.phase
                        .send_replace(Phase::Failed("the sandbox stopped on its own".into()));
                    let _ = service.backend().delete(&r.id).await;
                }
                None => {
                    r.phase.send_replace(Phase::Failed(
                        "the sandbox disappeared from the backend".into(),
                    ));
                }
            }
        }
    }
    let known: Vec<String> = service.records().keys().cloned().collect();
    for sb in &list {
        if !known.contains(&sb.id) && sb.labels.contains_key("orchard.tenant") {
            crate::log::warn(
                "removing a sandbox no record owns",
                &[("sandbox_id", &sb.id)],
            );
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
