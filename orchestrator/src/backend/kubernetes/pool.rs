//! Warm pools: per image, pods started ahead with their agent up, so that a create is a
//! claim (one conditional patch, a token rotation) instead of a pod start.
//!
//! - A warm pod is an ordinary sandbox pod named `pool-<key>-<random>` and labelled
//!   `orchard.dev/pool=<key>` instead of `orchard.dev/sandbox`, with a pool token in its
//!   own (mutable) Secret. The key hashes the image, CPUs and memory: a create claims a
//!   warm pod only when it asks for exactly those and no extra environment (a running
//!   container's environment cannot change).
//! - A claim patches the pod's labels and annotations (and `activeDeadlineSeconds` from
//!   the TTL) with its `resourceVersion` as a precondition, so two claimers (two
//!   replicas) never get the same pod: the loser's patch is a 409 and it tries the next
//!   pod. It then writes a fresh token into the pod's Secret and rotates the agent to it
//!   (`PUT /v1/token`, authenticated with the pool token), which is refused from then on.
//! - Unclaimed pods carry no sandbox label, so `list` does not report them: they are not
//!   sandboxes, and count against no tenant's quota.
//! - The keeper task tops each pool up after every change of the pod watch (or every
//!   few seconds), counting the pods it made that the watch has not shown yet, removes
//!   failed warm pods, backs off after a failure, and trims a pool over its size (two
//!   replicas topping up at once overshoot; the trim converges).
//!   A warm pod no node can take yet is kept and counted: it waits for capacity as a
//!   create does, and a replacement would only wait behind it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use sha2::{Digest, Sha256};

use super::config::KubeConfig;
use super::error::{is_conflict, is_not_found, KubeError};
use super::objects::{self, PodInput, POOL_LABEL, SANDBOX_LABEL};
use super::status::{agent_ready, pod_state, PodState};
use super::watch::PodView;
use crate::backend::{AgentEndpoint, BackendSandbox, CreateSpec};

/// How long the keeper waits before replacing a warm pod that failed.
const FAILURE_BACKOFF: Duration = Duration::from_secs(30);
/// How often the keeper looks even when nothing changed.
const KEEPER_TICK: Duration = Duration::from_secs(5);
/// How long a made pod may stay unseen by the watch before it is no longer counted.
const UNSEEN_LIMIT: Duration = Duration::from_secs(60);

/// One pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// Normalised image.
    pub image: String,
    /// Pods kept warm.
    pub size: usize,
    /// CPUs of its pods.
    pub cpus: Option<f64>,
    /// Memory of its pods.
    pub memory_bytes: Option<u64>,
    /// Its label value: a hash of image, CPUs and memory.
    pub key: String,
}

impl Pool {
    /// The pools of `cfg`.
    pub fn all(cfg: &KubeConfig) -> Vec<Pool> {
        cfg.warm_pools
            .iter()
            .map(|(image, size)| {
                let mut h = Sha256::new();
                h.update(format!(
                    "{image}|{:?}|{:?}",
                    cfg.warm_cpus, cfg.warm_memory_bytes
                ));
                Pool {
                    image: image.clone(),
                    size: *size,
                    cpus: cfg.warm_cpus,
                    memory_bytes: cfg.warm_memory_bytes,
                    key: hex::encode(&h.finalize()[..5]),
                }
            })
            .collect()
    }

    /// Whether a create of `spec` can claim one of this pool's pods.
    pub fn serves(&self, spec: &CreateSpec) -> bool {
        self.size > 0
            && spec.image.reference() == self.image
            && spec.cpus == self.cpus
            && spec.memory_bytes == self.memory_bytes
            && spec.env.is_empty()
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.labels.as_ref().and_then(|l| l.get(key))
}

/// The Kubernetes calls a pool needs (cheap clones of the backend's).
#[derive(Clone)]
pub struct PoolApi {
    /// Settings.
    pub cfg: Arc<KubeConfig>,
    /// Pods of the namespace.
    pub pods: Api<Pod>,
    /// Secrets of the namespace.
    pub secrets: Api<Secret>,
    /// The pod cache.
    pub view: PodView,
}

impl PoolApi {
    /// Makes one warm pod of `pool` (Secret, pod, ownership); does not wait for it.
    async fn make(&self, pool: &Pool) -> Result<String, KubeError> {
        let name = format!(
            "pool-{}-{}",
            pool.key,
            crate::random::hex(4).map_err(|e| KubeError::Invalid(e.to_string()))?
        );
        let token = crate::random::hex(32).map_err(|e| KubeError::Invalid(e.to_string()))?;
        let pod = objects::pod(
            &self.cfg,
            &PodInput {
                id: &name,
                image: &pool.image,
                cpus: pool.cpus,
                memory_bytes: pool.memory_bytes,
                env: &[],
                labels: &BTreeMap::new(),
                ttl: None,
                pool: Some(&pool.key),
            },
        )?;
        let secret = objects::secret(&self.cfg, &name, &token, Some(&pool.key));
        let pp = PostParams::default();
        self.secrets
            .create(&pp, &secret)
            .await
            .map_err(|e| KubeError::api(format!("making Secret {name}-token"), e))?;
        let made = match self.pods.create(&pp, &pod).await {
            Ok(p) => p,
            Err(e) => {
                let _ = self
                    .secrets
                    .delete(&objects::secret_name(&name), &DeleteParams::default())
                    .await;
                return Err(KubeError::api(format!("making warm pod {name}"), e));
            }
        };
        let patch =
            serde_json::json!({"metadata": {"ownerReferences": [objects::owned_by(&made)]}});
        self.secrets
            .patch(
                &objects::secret_name(&name),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| KubeError::api(format!("owning Secret {name}-token"), e))?;
        Ok(name)
    }

    /// Deletes warm pod `name` at once (its Secret goes with it).
    async fn discard(&self, name: &str) {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::background()
        };
        if let Err(e) = self.pods.delete(name, &dp).await {
            if !is_not_found(&e) {
                tracing::warn!(pod = %name, error = %e, "cannot delete a warm pod");
            }
        }
        let _ = self
            .secrets
            .delete(&objects::secret_name(name), &DeleteParams::default())
            .await;
    }

    /// Claims a running warm pod of `pool` whose agent passed its probe for `spec`; `None` when there is none.
    pub async fn claim(
        &self,
        pool: &Pool,
        spec: &CreateSpec,
    ) -> Result<Option<BackendSandbox>, KubeError> {
        let mut warm: Vec<Arc<Pod>> = self
            .view
            .all()
            .into_iter()
            .filter(|p| label(p, POOL_LABEL) == Some(&pool.key))
            .filter(|p| matches!(pod_state(p), PodState::Running(_)) && agent_ready(p))
            .collect();
        // Oldest first: the likeliest to be ready.
        warm.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
        });
        for pod in warm {
            match self.claim_one(&pod, spec).await {
                Ok(Some(sb)) => return Ok(Some(sb)),
                Ok(None) => continue,
                Err(e) => {
                    // A warm pod that cannot be claimed is not used again.
                    tracing::warn!(pod = ?pod.metadata.name, error = %e, "a warm pod could not be claimed; removing it");
                    if let Some(name) = &pod.metadata.name {
                        self.discard(name).await;
                    }
                }
            }
        }
        Ok(None)
    }

    /// Claims `pod`: `None` when another claimer got it first.
    async fn claim_one(
        &self,
        pod: &Pod,
        spec: &CreateSpec,
    ) -> Result<Option<BackendSandbox>, KubeError> {
        let (Some(name), Some(rv)) = (&pod.metadata.name, &pod.metadata.resource_version) else {
            return Ok(None);
        };
        let PodState::Running(ip) = pod_state(pod) else {
            return Ok(None);
        };
        let id = spec.id.as_str();
        let labels_json =
            serde_json::to_string(&spec.labels).map_err(|e| KubeError::Invalid(e.to_string()))?;
        let mut patch = serde_json::json!({
            "metadata": {
                "resourceVersion": rv,
                "labels": {POOL_LABEL: null, SANDBOX_LABEL: id},
                "annotations": {objects::LABELS_ANNOTATION: labels_json},
            }
        });
        if let Some(ttl) = spec.ttl {
            // Counted from the pod's start, which was before the claim.
            let started = pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0.as_second())
                .unwrap_or_else(|| crate::time::now_secs() as i64);
            let age = (crate::time::now_secs() as i64 - started).max(0);
            let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 4);
            patch["spec"] = serde_json::json!({"activeDeadlineSeconds": age + secs + objects::DEADLINE_MARGIN_S});
        }
        match self
            .pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_conflict(&e) || is_not_found(&e) => return Ok(None),
            Err(e) => return Err(KubeError::api(format!("claiming warm pod {name}"), e)),
        }
        // From here the pod is this sandbox's: a failure fails the create (and the
        // caller removes the pod).
        let secret_name = objects::secret_name(name);
        let old = self
            .secrets
            .get(&secret_name)
            .await
            .map_err(|e| KubeError::api(format!("reading Secret {secret_name}"), e))?
            .data
            .and_then(|d| d.get(objects::TOKEN_KEY).cloned())
            .and_then(|t| String::from_utf8(t.0).ok())
            .ok_or_else(|| KubeError::PodFailed(format!("Secret {secret_name} holds no token")))?;
        let token = crate::random::hex(32).map_err(|e| KubeError::Invalid(e.to_string()))?;
        let secret_patch = serde_json::json!({
            "metadata": {"labels": {POOL_LABEL: null, SANDBOX_LABEL: id}},
            "stringData": {objects::TOKEN_KEY: token},
        });
        self.secrets
            .patch(
                &secret_name,
                &PatchParams::default(),
                &Patch::Merge(&secret_patch),
            )
            .await
            .map_err(|e| KubeError::api(format!("writing Secret {secret_name}"), e))?;
        let addr = SocketAddr::new(ip, self.cfg.agent_port);
        let agent = orchard_client::AgentClient::new(orchard_client::Endpoint::Tcp(addr), old);
        match tokio::time::timeout(Duration::from_secs(5), agent.rotate_token(&token)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(KubeError::PodFailed(format!(
                    "rotating the token of {name}: {e}"
                )))
            }
            Err(_) => {
                return Err(KubeError::Timeout(format!(
                    "the agent of {name} did not answer in 5 s"
                )))
            }
        }
        Ok(Some(BackendSandbox {
            id: id.to_string(),
            image: spec.image.reference().to_string(),
            created_at: crate::time::now_rfc3339(),
            agent: AgentEndpoint::Http(addr),
            token,
            liveness: crate::backend::Liveness::Running,
            labels: spec.labels.clone(),
        }))
    }
}

/// Keeps every pool at its size until `stopping` is set.
pub async fn keep(api: PoolApi, pools: Vec<Pool>, stopping: Arc<AtomicBool>) {
    // Pods made and not yet seen by the watch, and the last failure, per pool.
    let mut unseen: HashMap<String, Vec<(String, Instant)>> = HashMap::new();
    let mut failed_at: HashMap<String, Instant> = HashMap::new();
    while !stopping.load(Ordering::Relaxed) {
        let all = api.view.all();
        for pool in &pools {
            let mine: Vec<&Arc<Pod>> = all
                .iter()
                .filter(|p| label(p, POOL_LABEL) == Some(&pool.key))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let seen: Vec<&str> = mine
                .iter()
                .filter_map(|p| p.metadata.name.as_deref())
                .collect();
            let pending = unseen.entry(pool.key.clone()).or_default();
            pending.retain(|(n, at)| !seen.contains(&n.as_str()) && at.elapsed() < UNSEEN_LIMIT);
            for p in &mine {
                if let PodState::Failed(why) = pod_state(p) {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    tracing::warn!(pool = %pool.image, pod = %name, reason = %why, "a warm pod failed; replacing it after a pause");
                    failed_at.insert(pool.key.clone(), Instant::now());
                    api.discard(&name).await;
                }
            }
            let live = mine
                .iter()
                .filter(|p| !matches!(pod_state(p), PodState::Failed(_)))
                .count()
                + pending.len();
            if live > pool.size {
                // Newest first: the oldest are the likeliest to be ready.
                let mut extra: Vec<&&Arc<Pod>> = mine.iter().collect();
                extra.sort_by(|a, b| {
                    b.metadata
                        .creation_timestamp
                        .cmp(&a.metadata.creation_timestamp)
                });
                for p in extra.into_iter().take(live - pool.size) {
                    api.discard(p.metadata.name.as_deref().unwrap_or_default())
                        .await;
                }
            }
            let backing_off = failed_at
                .get(&pool.key)
                .is_some_and(|t| t.elapsed() < FAILURE_BACKOFF);
            if live < pool.size && !backing_off && !stopping.load(Ordering::Relaxed) {
                let made =
                    futures_util::future::join_all((live..pool.size).map(|_| api.make(pool))).await;
                for r in made {
                    match r {
                        Ok(name) => pending.push((name, Instant::now())),
                        Err(e) => {
                            tracing::warn!(pool = %pool.image, error = %e, "cannot make a warm pod");
                            failed_at.insert(pool.key.clone(), Instant::now());
                        }
                    }
                }
            }
        }
        api.view.changed(KEEPER_TICK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SandboxImage;

    fn spec(image: &str, cpus: Option<f64>) -> CreateSpec {
        CreateSpec {
            id: "sb-1".into(),
            image: SandboxImage::Reference(image.into()),
            cpus,
            memory_bytes: Some(1 << 30),
            egress: false,
            env: vec![],
            labels: BTreeMap::new(),
            ttl: None,
            snapshot: None,
            progress: Default::default(),
        }
    }

    #[test]
    fn a_pool_serves_only_creates_that_match_its_pods() {
        let cfg = KubeConfig {
            warm_pools: vec![("docker.io/library/busybox:latest".into(), 2)],
            warm_cpus: Some(1.0),
            warm_memory_bytes: Some(1 << 30),
            ..KubeConfig::default()
        };
        let pool = &Pool::all(&cfg)[0];
        assert_eq!(pool.key.len(), 10);
        assert!(pool.serves(&spec("docker.io/library/busybox:latest", Some(1.0))));
        assert!(!pool.serves(&spec("docker.io/library/busybox:latest", Some(2.0))));
        assert!(!pool.serves(&spec("docker.io/library/python:3.11-slim", Some(1.0))));
        let mut with_env = spec("docker.io/library/busybox:latest", Some(1.0));
        with_env.env = vec!["A=1".into()];
        assert!(
            !pool.serves(&with_env),
            "a running container's environment cannot change"
        );
        let other = KubeConfig {
            warm_cpus: Some(2.0),
            ..cfg.clone()
        };
        assert_ne!(
            Pool::all(&other)[0].key,
            pool.key,
            "the key covers the resources"
        );
    }
}
