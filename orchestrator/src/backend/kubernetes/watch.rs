//! One watch over every sandbox pod: a kube-rs reflector keeps their latest state in
//! memory, and each change bumps a generation that waiters sleep on. A create waits for
//! its pod here (no poll per sandbox, no API call per check); `list` reads the cache.
//!
//! Invariant: a waiter marks the generation seen *before* it reads the cache, so a
//! change that lands between its read and its sleep wakes it (no lost wake-up).
//! The watcher restarts by itself (with kube-rs's default backoff) after an API error
//! or an expired resource version; its re-list replaces the cache, and waiters are
//! woken so they see pods that went away while it was down.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::watch as gen;

use super::error::KubeError;

/// The pod cache and its change signal.
pub struct PodWatch {
    view: PodView,
    task: tokio::task::JoinHandle<()>,
}

/// A reader of the cache (cheap to clone: the warm-pool keeper holds one).
#[derive(Clone)]
pub struct PodView {
    store: Store<Pod>,
    changed: gen::Receiver<u64>,
    namespace: String,
}

impl std::ops::Deref for PodWatch {
    type Target = PodView;
    fn deref(&self) -> &PodView {
        &self.view
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodWatch {
    /// Starts watching the pods of `api` that match `selector`.
    pub fn start(api: Api<Pod>, namespace: &str, selector: &str) -> PodWatch {
        let (store, writer) = reflector::store();
        let (tx, rx) = gen::channel(0u64);
        let config = watcher::Config::default().labels(selector);
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
        let task = tokio::spawn(async move {
            futures_util::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = &event {
                    tracing::warn!(error = %e, "the pod watch failed; it restarts");
                }
                tx.send_modify(|g| *g += 1);
            }
        });
        PodWatch {
            view: PodView {
                store,
                changed: rx,
                namespace: namespace.to_string(),
            },
            task,
        }
    }

    /// A reader of the cache.
    pub fn view(&self) -> PodView {
        self.view.clone()
    }
}

impl PodView {
    /// Waits until the first list has filled the cache, up to `limit`.
    pub async fn synced(&self, limit: Duration) -> Result<(), KubeError> {
        match tokio::time::timeout(limit, self.store.wait_until_ready()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(KubeError::Timeout("the pod watch stopped".into())),
            Err(_) => Err(KubeError::Timeout(format!(
                "the pod watch did not list pods within {} s (is the API server reachable?)",
                limit.as_secs()
            ))),
        }
    }

    /// The cached pod `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Pod>> {
        self.store
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// Every cached pod.
    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.store.state()
    }

    /// The cached pod of sandbox `id` (its label; a claimed warm pod has another name).
    pub fn sandbox(&self, id: &str) -> Option<Arc<Pod>> {
        self.store.find(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(super::objects::SANDBOX_LABEL))
                .is_some_and(|v| v == id)
        })
    }

    /// Waits for the next change of the cache (or `limit`).
    pub async fn changed(&self, limit: std::time::Duration) {
        let mut changed = self.changed.clone();
        changed.borrow_and_update();
        let _ = tokio::time::timeout(limit, changed.changed()).await;
    }

    /// Calls `check` with the cached pod `name` (or `None`) now and after every change,
    /// until it answers `Some`.
    pub async fn wait_for<T>(
        &self,
        name: &str,
        mut check: impl FnMut(Option<&Pod>) -> Option<T>,
    ) -> T {
        let mut changed = self.changed.clone();
        loop {
            changed.borrow_and_update();
            if let Some(v) = check(self.get(name).as_deref()) {
                return v;
            }
            if changed.changed().await.is_err() {
                // The watch task ended (the backend is going away): one last look.
                if let Some(v) = check(self.get(name).as_deref()) {
                    return v;
                }
                std::future::pending::<()>().await;
            }
        }
    }
}
