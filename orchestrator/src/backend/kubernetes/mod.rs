//! The Kubernetes backend: one pod per sandbox, the static agent injected by an init
//! container into the user's unmodified image, reached on the pod IP.
//!
//! - [`objects`] builds every object (pod, token Secret, NetworkPolicies) as a value;
//! - [`status`] reads a pod's status as starting, unschedulable, running or failed with
//!   a reason;
//! - [`watch`] is the one reflector over the namespace's sandbox pods that creates,
//!   deletes and `list` read, instead of an API call per check;
//! - [`nodes`] is a reflector over the cluster's nodes: their capacity, for
//!   `GET /resources`, `/metrics` and the largest node a create may ask for;
//! - [`config`] holds the settings, [`error`] maps API answers to backend errors once.
//!
//! A create makes the Secret, then the pod (then, off its critical path, makes the pod
//! the Secret's owner and, when egress is allowed, its egress policy), waits on the
//! watch for the agent's container to run, and checks the agent answers with its token
//! on `http://POD_IP:PORT`. A pod no node can take yet keeps waiting (a node may join):
//! the create reports the scheduler's reason to its [`StartProgress`] meanwhile, and the
//! service's readiness limit bounds the wait. With a warm pool for the image ([`pool`]), a create claims a
//! pod started ahead instead. Any failure deletes what it made. A restarted server finds
//! its pods through `list` (labels in an annotation, the token in the Secret) and adopts
//! them as on the local backend.

pub mod config;
pub mod error;
pub mod nodes;
pub mod objects;
pub mod pool;
pub mod status;
pub mod watch;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

pub use config::{KubeArgs, KubeConfig};
pub use error::KubeError;

use self::error::{is_conflict, is_not_found};
use self::nodes::NodeWatch;
use self::objects::{PodInput, SANDBOX_LABEL};
use self::pool::{Pool, PoolApi};
use self::status::{pod_state, PodState};
use self::watch::PodWatch;
use crate::backend::{
    AgentEndpoint, Backend, BackendError, BackendFuture, BackendSandbox, Capacity, ClusterNodes,
    CreateSpec, StartProgress,
};

/// The field manager of server-side applies.
const FIELD_MANAGER: &str = "orchard";
/// How long the first list of pods may take at start.
const SYNC_LIMIT: Duration = Duration::from_secs(30);
/// How long the first list of nodes may take at start, once the pods are listed: past
/// it the server starts without the nodes' size (the watch goes on).
const NODES_LIMIT: Duration = Duration::from_secs(5);
/// How long a deleted pod may take to go, past its grace period.
const GONE_LIMIT: Duration = Duration::from_secs(60);
/// How long a running pod's agent may take to answer.
const AGENT_LIMIT: Duration = Duration::from_secs(30);

/// The backend.
pub struct KubeBackend {
    cfg: Arc<KubeConfig>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    policies: Api<NetworkPolicy>,
    watch: PodWatch,
    nodes: NodeWatch,
    pools: Vec<Pool>,
    pool_api: PoolApi,
    stopping: Arc<AtomicBool>,
    keeper: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        if let Some(k) = &self.keeper {
            k.abort();
        }
    }
}

/// A client from the configured kubeconfig, or `KUBECONFIG`, `~/.kube/config`, or the
/// in-cluster service account.
pub async fn client_for(cfg: &KubeConfig) -> Result<Client, KubeError> {
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| KubeError::Credentials(format!("reading {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Credentials(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            KubeError::Credentials(format!(
                "{e} (give --kubeconfig, set KUBECONFIG, or run in a pod with a service account)"
            ))
        })?,
    };
    Client::try_from(config).map_err(|e| KubeError::Credentials(e.to_string()))
}

impl KubeBackend {
    /// Connects with `cfg`'s credentials and starts.
    pub async fn connect(cfg: KubeConfig) -> Result<KubeBackend, KubeError> {
        let client = client_for(&cfg).await?;
        KubeBackend::start(client, cfg).await
    }

    /// Starts on `client`: makes the namespace when missing, applies its policies, and
    /// starts the node and pod watches.
    pub async fn start(client: Client, cfg: KubeConfig) -> Result<KubeBackend, KubeError> {
        let ns = cfg.namespace.clone();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        match namespaces.get_opt(&ns).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                let mut n = Namespace::default();
                n.metadata.name = Some(ns.clone());
                n.metadata.labels = Some(BTreeMap::from([(
                    objects::MANAGED_BY.to_string(),
                    objects::MANAGED_BY_VALUE.to_string(),
                )]));
                match namespaces.create(&PostParams::default(), &n).await {
                    Ok(_) => tracing::info!(namespace = %ns, "made the sandbox namespace"),
                    Err(e) if is_conflict(&e) => {}
                    Err(e) => return Err(KubeError::api(format!("making namespace {ns}"), e)),
                }
            }
            // A namespaced service account may not read namespaces: go on, the next
            // call says whether the namespace is usable.
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            Err(e) => return Err(KubeError::api(format!("reading namespace {ns}"), e)),
        }
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        for p in objects::namespace_policies(&cfg) {
            let name = p.metadata.name.clone().unwrap_or_default();
            policies
                .patch(&name, &apply, &Patch::Apply(&p))
                .await
                .map_err(|e| KubeError::api(format!("applying NetworkPolicy {ns}/{name}"), e))?;
        }
        let nodes = NodeWatch::start(Api::<Node>::all(client.clone()));
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let watch = PodWatch::start(pods.clone(), &ns, &objects::managed_selector());
        watch.synced(SYNC_LIMIT).await?;
        // The nodes are optional (their watch logs why it fails): no wait past its
        // first answer, and the warm pods keep their configured size without them.
        nodes.settled(NODES_LIMIT).await;
        let capacity = nodes.largest();
        let mut cfg = cfg;
        if let Some(cap) = capacity {
            // As the service lowers its defaults to what a node can give (see
            // `service::fit_defaults`), so warm pods match the creates that ask for them.
            cfg.warm_cpus = cfg.warm_cpus.map(|c| c.min(cap.cpus));
            cfg.warm_memory_bytes = cfg.warm_memory_bytes.map(|m| {
                if m > cap.memory_bytes {
                    (cap.memory_bytes >> 20) << 20
                } else {
                    m
                }
            });
        }
        let cfg = Arc::new(cfg);
        let pools = Pool::all(&cfg);
        let pool_api = PoolApi {
            cfg: cfg.clone(),
            pods: pods.clone(),
            secrets: secrets.clone(),
            view: watch.view(),
        };
        let stopping = Arc::new(AtomicBool::new(false));
        let keeper = (!pools.is_empty()).then(|| {
            for p in &pools {
                tracing::info!(image = %p.image, size = p.size, key = %p.key, "warm pool");
            }
            tokio::spawn(pool::keep(
                pool_api.clone(),
                pools.clone(),
                stopping.clone(),
            ))
        });
        Ok(KubeBackend {
            secrets,
            pods,
            policies,
            watch,
            nodes,
            cfg,
            pools,
            pool_api,
            stopping,
            keeper,
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &KubeConfig {
        &self.cfg
    }

    async fn create_sandbox(&self, spec: CreateSpec) -> Result<BackendSandbox, KubeError> {
        let id = spec.id.clone();
        objects::check_pod_name(&id)?;
        if let Some(pool) = self.pools.iter().find(|p| p.serves(&spec)) {
            match self.pool_api.claim(pool, &spec).await {
                Ok(Some(sb)) => {
                    if spec.egress {
                        if let Err(e) = self.allow_egress(&id, None).await {
                            let _ = self.remove(&id, 0).await;
                            return Err(e);
                        }
                    }
                    return Ok(sb);
                }
                Ok(None) => {
                    tracing::info!(sandbox_id = %id, image = %pool.image, "no warm pod ready; starting one")
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %id, error = %e, "claiming a warm pod failed; starting one");
                    let _ = self.remove(&id, 0).await;
                }
            }
        }
        let token = crate::random::hex(32).map_err(|e| KubeError::Invalid(e.to_string()))?;
        let image = spec.image.reference().to_string();
        let pod = objects::pod(
            &self.cfg,
            &PodInput {
                id: &id,
                image: &image,
                cpus: spec.cpus,
                memory_bytes: spec.memory_bytes,
                env: &spec.env,
                labels: &spec.labels,
                ttl: spec.ttl,
                pool: None,
            },
        )?;
        let secret = objects::secret(&self.cfg, &id, &token, None);
        let pp = PostParams::default();
        if let Err(e) = self.secrets.create(&pp, &secret).await {
            if !is_conflict(&e) {
                return Err(KubeError::api(
                    format!("making Secret {}", objects::secret_name(&id)),
                    e,
                ));
            }
            // Left by a create that died half-way: only reused once no pod has the id.
            if self.pods.get_opt(&id).await.ok().flatten().is_some() {
                return Err(KubeError::api(format!("making pod {id}"), e));
            }
            self.delete_secret(&id).await?;
            self.secrets.create(&pp, &secret).await.map_err(|e| {
                KubeError::api(format!("making Secret {}", objects::secret_name(&id)), e)
            })?;
        }
        let made = match self.pods.create(&pp, &pod).await {
            Ok(p) => p,
            Err(e) => {
                let _ = self.delete_secret(&id).await;
                return Err(KubeError::api(format!("making pod {id}"), e));
            }
        };
        match self
            .finish_create(&id, &made, spec.egress, &token, &spec.progress)
            .await
        {
            Ok(addr) => Ok(BackendSandbox {
                id: id.clone(),
                image,
                created_at: created_at(&made),
                agent: AgentEndpoint::Http(addr),
                token,
                liveness: crate::backend::Liveness::Running,
                labels: spec.labels,
            }),
            Err(e) => {
                if let Err(d) = self.remove(&id, 0).await {
                    tracing::warn!(sandbox_id = %id, error = %d, "cannot remove a failed sandbox's pod");
                }
                Err(e)
            }
        }
    }

    /// Owns the Secret by the pod, allows egress when asked, and waits for the agent.
    async fn finish_create(
        &self,
        id: &str,
        made: &Pod,
        egress: bool,
        token: &str,
        progress: &StartProgress,
    ) -> Result<SocketAddr, KubeError> {
        let owner = objects::owned_by(made);
        let own = async {
            let patch = serde_json::json!({"metadata": {"ownerReferences": [owner]}});
            self.secrets
                .patch(
                    &objects::secret_name(id),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map(drop)
                .map_err(|e| {
                    KubeError::api(format!("owning Secret {}", objects::secret_name(id)), e)
                })
        };
        let allow = async {
            if !egress {
                return Ok(());
            }
            self.allow_egress(id, objects::owned_by(made)).await
        };
        let uid = made.metadata.uid.clone();
        let running = self.wait_running(id, uid, progress);
        let (owned, allowed, ip) = tokio::join!(own, allow, running);
        owned?;
        allowed?;
        let addr = SocketAddr::new(ip?, self.cfg.agent_port);
        self.agent_answers(addr, token).await?;
        Ok(addr)
    }

    /// Makes the policy allowing sandbox `id`'s egress.
    async fn allow_egress(
        &self,
        id: &str,
        owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    ) -> Result<(), KubeError> {
        let p = objects::egress_policy(&self.cfg, id, owner);
        self.policies
            .create(&PostParams::default(), &p)
            .await
            .map(drop)
            .map_err(|e| {
                KubeError::api(
                    format!("making NetworkPolicy {}", objects::egress_policy_name(id)),
                    e,
                )
            })
    }

    /// Waits on the watch until pod `id` (incarnation `uid`) runs its agent, telling
    /// `progress` while no node can take it. An unschedulable pod is waited for, not
    /// failed: the caller's time limit ends a wait for a node that never comes.
    async fn wait_running(
        &self,
        id: &str,
        uid: Option<String>,
        progress: &StartProgress,
    ) -> Result<std::net::IpAddr, KubeError> {
        let mut seen = false;
        self.watch
            .wait_for(id, |pod| match pod {
                None if seen => Some(Err(KubeError::PodFailed(format!(
                    "pod {id} was deleted while it started"
                )))),
                None => None,
                // An older pod of the same name still going away.
                Some(p) if p.metadata.uid != uid => None,
                Some(p) => {
                    seen = true;
                    let state = pod_state(p);
                    if let PodState::Unschedulable(why) = &state {
                        progress.unschedulable(why);
                    } else {
                        progress.scheduled();
                    }
                    match state {
                        PodState::Running(ip) => Some(Ok(ip)),
                        PodState::Failed(why) => Some(Err(KubeError::PodFailed(why))),
                        PodState::Starting(_) | PodState::Unschedulable(_) => None,
                    }
                }
            })
            .await
    }

    /// Waits until the agent at `addr` answers an authenticated health call.
    async fn agent_answers(&self, addr: SocketAddr, token: &str) -> Result<(), KubeError> {
        let client = orchard_client::AgentClient::new(orchard_client::Endpoint::Tcp(addr), token);
        let started = Instant::now();
        loop {
            let last = match tokio::time::timeout(Duration::from_secs(2), client.health()).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer within 2 s".to_string(),
            };
            if started.elapsed() > AGENT_LIMIT {
                return Err(KubeError::Timeout(format!(
                    "the agent at http://{addr} did not answer within {} s ({last}); is this \
                     host allowed to reach pod IPs (--kube-ingress-cidr)?",
                    AGENT_LIMIT.as_secs()
                )));
            }
            // The container runs but its agent may not listen yet: a few ms.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn delete_secret(&self, id: &str) -> Result<(), KubeError> {
        match self
            .secrets
            .delete(&objects::secret_name(id), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(KubeError::api(
                format!("deleting Secret {}", objects::secret_name(id)),
                e,
            )),
        }
    }

    /// Deletes pod `id` and what hangs off it, and waits until the pod is gone; `Ok(false)`
    /// when there was nothing to delete.
    async fn remove(&self, id: &str, grace_s: i64) -> Result<bool, KubeError> {
        let dp = DeleteParams {
            grace_period_seconds: Some(grace_s.max(0) as u32),
            ..DeleteParams::background()
        };
        // A claimed warm pod keeps its own name; a sandbox's own pod is named by its id.
        let name = self
            .watch
            .sandbox(id)
            .and_then(|p| p.metadata.name.clone())
            .unwrap_or_else(|| id.to_string());
        let pod_existed = match self.pods.delete(&name, &dp).await {
            Ok(_) => true,
            Err(e) if is_not_found(&e) => false,
            Err(e) => return Err(KubeError::api(format!("deleting pod {name}"), e)),
        };
        let secret_existed = match self
            .secrets
            .delete(&objects::secret_name(&name), &DeleteParams::default())
            .await
        {
            Ok(_) => true,
            Err(e) if is_not_found(&e) => false,
            Err(e) => return Err(KubeError::api(format!("deleting Secret {name}-token"), e)),
        };
        match self
            .policies
            .delete(&objects::egress_policy_name(id), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                return Err(KubeError::api(
                    format!("deleting NetworkPolicy {id}-egress"),
                    e,
                ))
            }
        }
        if pod_existed {
            let limit = GONE_LIMIT + Duration::from_secs(grace_s.max(0) as u64);
            let gone = tokio::time::timeout(
                limit,
                self.watch.wait_for(&name, |p| p.is_none().then_some(())),
            );
            if gone.await.is_err() {
                return Err(KubeError::Timeout(format!(
                    "pod {name} was still there {} s after its deletion",
                    limit.as_secs()
                )));
            }
        }
        Ok(pod_existed || secret_existed)
    }

    /// Tokens of the namespace's sandboxes, by sandbox id.
    async fn tokens(&self) -> Result<BTreeMap<String, String>, KubeError> {
        let lp = ListParams::default().labels(&objects::managed_selector());
        let list = self
            .secrets
            .list(&lp)
            .await
            .map_err(|e| KubeError::api("listing sandbox Secrets", e))?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|s| {
                let id = s.metadata.labels.as_ref()?.get(SANDBOX_LABEL)?.clone();
                let token = s.data.as_ref()?.get(objects::TOKEN_KEY)?;
                Some((id, String::from_utf8(token.0.clone()).ok()?))
            })
            .collect())
    }

    fn sandbox_of(&self, pod: &Pod, tokens: &BTreeMap<String, String>) -> Option<BackendSandbox> {
        // Unclaimed warm pods have no sandbox label: not sandboxes, not listed.
        let id = pod.metadata.labels.as_ref()?.get(SANDBOX_LABEL)?.clone();
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let labels = annotations
            .get(objects::LABELS_ANNOTATION)
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default();
        let unspecified = std::net::Ipv4Addr::UNSPECIFIED.into();
        let (ip, liveness) = match pod_state(pod) {
            PodState::Running(ip) => (ip, crate::backend::Liveness::Running),
            PodState::Failed(_) => (unspecified, crate::backend::Liveness::Stopped),
            // Not running yet, or again, or its node not reporting (phase Unknown), or
            // waiting for a node: no evidence that it ended.
            PodState::Starting(_) | PodState::Unschedulable(_) => {
                (unspecified, crate::backend::Liveness::Unknown)
            }
        };
        Some(BackendSandbox {
            image: annotations
                .get(objects::IMAGE_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            created_at: created_at(pod),
            agent: AgentEndpoint::Http(SocketAddr::new(ip, self.cfg.agent_port)),
            token: tokens.get(&id).cloned().unwrap_or_default(),
            liveness,
            labels,
            id,
        })
    }
}

fn created_at(pod: &Pod) -> String {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_else(crate::time::now_rfc3339)
}

impl Backend for KubeBackend {
    fn name(&self) -> &str {
        &self.cfg.namespace
    }

    fn pulls_images(&self) -> bool {
        true
    }

    fn disk_room(&self, id: &str) -> Option<crate::backend::DiskRoom> {
        let _ = id;
        // The pod's ephemeral-storage limit (`--kube-ephemeral-storage`, else
        // `--sandbox-disk`); what the pod uses of it is not known here, so all of it.
        let size = crate::units::parse_memory(self.cfg.ephemeral_storage.as_deref()?).ok()?;
        Some(crate::backend::DiskRoom { size, free: None })
    }

    fn create(&self, spec: CreateSpec) -> BackendFuture<'_, BackendSandbox> {
        Box::pin(async move {
            if spec.snapshot.is_some() {
                return Err(BackendError::Unsupported(
                    "the kubernetes backend does not support forks yet (see docs/snapshots-kubernetes.md)"
                        .into(),
                ));
            }
            Ok(self.create_sandbox(spec).await?)
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            if !self.remove(id, self.cfg.grace_period_s).await? {
                return Err(BackendError::NotFound(id.to_string()));
            }
            Ok(())
        })
    }

    fn list(&self) -> BackendFuture<'_, Vec<BackendSandbox>> {
        Box::pin(async move {
            let tokens = self.tokens().await?;
            Ok(self
                .watch
                .all()
                .iter()
                .filter_map(|p| self.sandbox_of(p, &tokens))
                .collect())
        })
    }

    fn recover(&self) -> BackendFuture<'_, Vec<String>> {
        Box::pin(async move {
            Ok(self
                .watch
                .all()
                .iter()
                .filter_map(|p| p.metadata.labels.as_ref()?.get(SANDBOX_LABEL).cloned())
                .collect())
        })
    }

    fn shutdown(&self) -> BackendFuture<'_, ()> {
        Box::pin(async move {
            // No refill while everything goes, warm pods included (by pod name).
            self.stopping.store(true, Ordering::Relaxed);
            if let Some(k) = &self.keeper {
                k.abort();
            }
            let ids: Vec<String> = self
                .watch
                .all()
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            let results = futures_util::future::join_all(
                ids.iter()
                    .map(|id| self.remove(id, self.cfg.grace_period_s)),
            )
            .await;
            for (id, r) in ids.iter().zip(results) {
                if let Err(e) = r {
                    tracing::warn!(sandbox_id = %id, error = %e, "cannot delete a sandbox pod at shutdown");
                }
            }
            Ok(())
        })
    }

    /// The largest node as the watch knows it now (a node pool that grows lets larger
    /// sandboxes in); `None`, so creates are not checked, while the nodes are unknown.
    fn capacity(&self) -> Option<Capacity> {
        self.nodes.largest()
    }

    /// Requested is what this backend's pods (sandboxes and warm pods, of its
    /// namespace) request: see [`nodes`].
    fn nodes(&self) -> Option<ClusterNodes> {
        Some(self.nodes.report(&self.watch.all()))
    }

    /// A pod's limits are also its requests, which the scheduler places: more than the
    /// largest node has is refused up front, as before (less waits, `unschedulable`).
    fn clamps_to_capacity(&self) -> bool {
        false
    }
}

/// A shared handle (the server holds backends as `Arc<dyn Backend>`).
pub type SharedKubeBackend = Arc<KubeBackend>;
