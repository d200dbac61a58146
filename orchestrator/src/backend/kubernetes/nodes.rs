//! The cluster's nodes: a kube-rs reflector over the Node objects keeps each node's
//! capacity and allocatable CPU and memory in memory, for `GET /resources`, `/metrics`
//! and a create's check against the largest node, with no API call per answer.
//!
//! What is requested of a node is what the backend's own pods on it request: the
//! namespace's sandbox and warm pods, which [`super::watch`] already keeps. Other pods'
//! requests (system daemons, other workloads) are not counted: knowing them takes a
//! watch of every pod of the cluster, tens of thousands of objects on a large one, for
//! a figure the scheduler keeps anyway. A pod counts on its node as the scheduler
//! counts it: once bound to it and until it ends (`Succeeded` or `Failed`).
//!
//! Nodes are cluster-scoped: the watch needs `nodes: get, list, watch` in a ClusterRole
//! (deploy/base/rbac.yaml). Without it the backend works on: the failure is logged once
//! (the watch retries with backoff, and a recovery is logged too), creates are not
//! checked against the nodes' size, and [`NodeWatch::report`] says what it lacks and
//! gives what the pods tell (each node they run on, with what they request).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::watch as signal;

use crate::backend::{Amount, Capacity, ClusterNodes, NodeCapacity};

/// How the node watch fares, as its task last saw.
#[derive(Debug, Clone, Default)]
struct Health {
    /// A first list has filled the store.
    listed: bool,
    /// The error it is retrying after, until an event comes through again.
    failing: Option<String>,
}

/// The node cache and how its watch fares.
pub struct NodeWatch {
    store: Store<Node>,
    health: signal::Receiver<Health>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodeWatch {
    /// Starts watching every node of `api`.
    pub fn start(api: Api<Node>) -> NodeWatch {
        let (store, writer) = reflector::store();
        let (tx, rx) = signal::channel(Health::default());
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            // Only the capacity is read: a node's image list and managed fields are most
            // of its size, and the cache holds every node.
            .modify(|n: &mut Node| {
                n.metadata.managed_fields = None;
                if let Some(s) = n.status.as_mut() {
                    s.images = None;
                }
            });
        let stream = reflector::reflector(writer, stream);
        let task = tokio::spawn(async move {
            futures_util::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(e) => tx.send_if_modified(|h| {
                        let listed = h.listed || matches!(e, watcher::Event::InitDone);
                        let changed = h.failing.is_some() || listed != h.listed;
                        if h.failing.take().is_some() {
                            tracing::info!("the node watch works again");
                        }
                        h.listed = listed;
                        changed
                    }),
                    // Logged once per run of failures: without RBAC for nodes it fails
                    // on every retry, for good.
                    Err(e) => tx.send_if_modified(|h| {
                        if h.failing.is_some() {
                            return false;
                        }
                        let why = describe(&e);
                        tracing::warn!(
                            error = %why,
                            "cannot watch the nodes; /resources lacks their capacity and \
                             creates are not checked against it until it works (it retries)"
                        );
                        h.failing = Some(why);
                        true
                    }),
                };
            }
        });
        NodeWatch {
            store,
            health: rx,
            task,
        }
    }

    /// Waits until the first list filled the cache or the watch failed, up to `limit`;
    /// whether the nodes are known.
    pub async fn settled(&self, limit: Duration) -> bool {
        let mut health = self.health.clone();
        let settled = health.wait_for(|h| h.listed || h.failing.is_some());
        // Bound before returning: the answer borrows `health` until it is dropped.
        let listed = matches!(tokio::time::timeout(limit, settled).await, Ok(Ok(h)) if h.listed);
        listed
    }

    /// The largest allocatable CPU and memory of a node, once the nodes are known.
    pub fn largest(&self) -> Option<Capacity> {
        if !self.health.borrow().listed {
            return None;
        }
        largest(self.store.state().iter().map(|n| &**n))
    }

    /// Every node with its figures and what `pods` (the backend's own) request of it.
    pub fn report(&self, pods: &[Arc<Pod>]) -> ClusterNodes {
        let health = self.health.borrow().clone();
        let pods = pods.iter().map(|p| &**p);
        if !health.listed {
            let why = health
                .failing
                .unwrap_or_else(|| "the nodes have not been listed yet".into());
            return aggregate(
                std::iter::empty(),
                pods,
                Some(format!(
                    "node capacity unknown: {why}; nodes and requests are what this server's \
                 sandbox pods tell"
                )),
            );
        }
        let nodes = self.store.state();
        let stale = health.failing.map(|why| {
            format!("the node watch fails ({why}); node figures are as of its last success")
        });
        aggregate(nodes.iter().map(|n| &**n), pods, stale)
    }
}

/// A watch failure as the operator should read it: a refusal names the permission.
fn describe(e: &watcher::Error) -> String {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(&**s),
        watcher::Error::WatchError(s) => Some(&**s),
        _ => None,
    };
    match status {
        Some(s) if s.code == 403 => format!(
            "{e} (the orchestrator's service account needs nodes get, list and watch in a \
             ClusterRole: see deploy/base/rbac.yaml)"
        ),
        _ => e.to_string(),
    }
}

/// CPU and memory of a node's `capacity` or `allocatable`, or of a container's
/// requests; what is missing or does not parse counts as zero.
fn amount(map: Option<&BTreeMap<String, Quantity>>) -> Amount {
    let read = |key: &str, parse: fn(&str) -> Result<u64, crate::units::QuantityError>| {
        map.and_then(|m| m.get(key))
            .and_then(|q| parse(&q.0).ok())
            .unwrap_or(0)
    };
    Amount {
        millicpus: read("cpu", crate::units::cpu_millis),
        memory_bytes: read("memory", crate::units::bytes),
    }
}

fn requests(r: Option<&ResourceRequirements>) -> Amount {
    amount(r.and_then(|r| r.requests.as_ref()))
}

/// What a pod requests of its node, by the scheduler's rule: its containers' requests
/// summed, or the largest of an init container's if larger (init containers run one at
/// a time, before the others), sidecars (init containers that keep running) added to
/// both, and the pod's overhead on top. The API server has already made a container's
/// limits its requests when it gave only limits.
pub fn pod_requests(pod: &Pod) -> Amount {
    let Some(spec) = pod.spec.as_ref() else {
        return Amount::default();
    };
    let mut sidecars = Amount::default();
    let mut init = Amount::default();
    for c in spec.init_containers.iter().flatten() {
        let r = requests(c.resources.as_ref());
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars += r;
            init = init.max(sidecars);
        } else {
            init = init.max(sidecars + r);
        }
    }
    let mut running = sidecars;
    for c in &spec.containers {
        running += requests(c.resources.as_ref());
    }
    running.max(init) + amount(spec.overhead.as_ref())
}

/// The node a pod holds resources on: the one it is bound to, while it has not ended.
fn bound_node(pod: &Pod) -> Option<&str> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    pod.spec.as_ref()?.node_name.as_deref()
}

/// `nodes` with what `pods` request of each, by name. A node a pod is bound to that
/// `nodes` lacks (not listed, or just removed) is reported with its requests only.
pub fn aggregate<'a>(
    nodes: impl Iterator<Item = &'a Node>,
    pods: impl Iterator<Item = &'a Pod>,
    incomplete: Option<String>,
) -> ClusterNodes {
    let mut by_name: BTreeMap<String, NodeCapacity> = BTreeMap::new();
    for n in nodes {
        let Some(name) = n.metadata.name.clone() else {
            continue;
        };
        let status = n.status.as_ref();
        by_name.insert(
            name.clone(),
            NodeCapacity {
                name,
                capacity: amount(status.and_then(|s| s.capacity.as_ref())),
                allocatable: amount(status.and_then(|s| s.allocatable.as_ref())),
                requested: Amount::default(),
            },
        );
    }
    for p in pods {
        let Some(node) = bound_node(p) else { continue };
        let entry = by_name
            .entry(node.to_string())
            .or_insert_with(|| NodeCapacity {
                name: node.to_string(),
                capacity: Amount::default(),
                allocatable: Amount::default(),
                requested: Amount::default(),
            });
        entry.requested += pod_requests(p);
    }
    ClusterNodes {
        nodes: by_name.into_values().collect(),
        incomplete,
    }
}

/// The largest allocatable CPU and memory among `nodes` (each taken apart: the CPUs of
/// one node and the memory of another), the most one sandbox may ask for.
pub fn largest<'a>(nodes: impl Iterator<Item = &'a Node>) -> Option<Capacity> {
    let mut best: Option<Amount> = None;
    for n in nodes {
        let alloc = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let a = amount(alloc);
        if a.millicpus == 0 || a.memory_bytes == 0 {
            continue;
        }
        best = Some(best.map_or(a, |b| b.max(a)));
    }
    best.map(|b| Capacity {
        cpus: b.cores(),
        memory_bytes: b.memory_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A node as a kind/k3s kubelet reports it (the fields read, and some that are not).
    fn node(name: &str, cpu: &str, alloc_cpu: &str, memory: &str, alloc_memory: &str) -> Node {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "812",
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": {
                "capacity": {"cpu": cpu, "ephemeral-storage": "102626232Ki",
                             "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                             "memory": memory, "pods": "110"},
                "allocatable": {"cpu": alloc_cpu, "ephemeral-storage": "94580335255",
                                "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                                "memory": alloc_memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True",
                                "lastHeartbeatTime": "2025-01-01T00:00:00Z",
                                "lastTransitionTime": "2025-01-01T00:00:00Z",
                                "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
                "images": [{"names": ["docker.io/library/busybox@sha256:00", "docker.io/library/busybox:latest"],
                            "sizeBytes": 2155000}],
                "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "containerd://1.7",
                             "kernelVersion": "6.1", "kubeProxyVersion": "", "kubeletVersion": "v1.31.0",
                             "machineID": "", "operatingSystem": "linux", "osImage": "Debian", "systemUUID": ""}
            }
        }))
        .unwrap()
    }

    /// A sandbox pod as the API server answers it: the agent's init container, the
    /// sandbox container, requests defaulted from limits.
    fn pod(name: &str, node: Option<&str>, phase: &str, cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "orchard-sandboxes", "uid": format!("uid-{name}")},
            "spec": {
                "nodeName": node,
                "initContainers": [{"name": "agent-inject", "image": "orchard-agent",
                                    "resources": {"limits": {"cpu": "100m", "memory": "32Mi"},
                                                  "requests": {"cpu": "100m", "memory": "32Mi"}}}],
                "containers": [{"name": "sandbox", "image": "busybox",
                                "resources": {"limits": {"cpu": cpu, "memory": memory},
                                              "requests": {"cpu": cpu, "memory": memory}}}]
            },
            "status": {"phase": phase, "qosClass": "Guaranteed"}
        }))
        .unwrap()
    }

    #[test]
    fn nodes_carry_their_capacity_allocatable_and_their_pods_requests() {
        let nodes = [
            node("kind-worker", "8", "7800m", "16326272Ki", "16223872Ki"),
            node("kind-control-plane", "2", "2", "8039952Ki", "7937552Ki"),
        ];
        let pods = [
            pod("sb-a", Some("kind-worker"), "Running", "250m", "256Mi"),
            pod("sb-b", Some("kind-worker"), "Pending", "1", "1Gi"),
            // Not bound yet: on no node.
            pod("sb-c", None, "Pending", "4", "16Gi"),
            // Ended: its requests are free again.
            pod("sb-d", Some("kind-worker"), "Failed", "2", "2Gi"),
            pod("sb-e", Some("kind-worker"), "Succeeded", "2", "2Gi"),
        ];
        let r = aggregate(nodes.iter(), pods.iter(), None);
        assert_eq!(r.incomplete, None);
        let names: Vec<_> = r.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["kind-control-plane", "kind-worker"], "by name");
        let w = &r.nodes[1];
        assert_eq!(w.capacity.millicpus, 8000);
        assert_eq!(w.capacity.memory_bytes, 16_326_272 * 1024);
        assert_eq!(w.allocatable.millicpus, 7800);
        assert_eq!(w.allocatable.memory_bytes, 16_223_872 * 1024);
        assert_eq!(w.requested.millicpus, 1250);
        assert_eq!(w.requested.memory_bytes, (256 << 20) + (1 << 30));
        assert_eq!(r.nodes[0].requested, Amount::default());
    }

    #[test]
    fn a_pods_request_is_its_containers_or_its_largest_init_container_plus_overhead() {
        let mut p = pod("sb", Some("n"), "Running", "250m", "256Mi");
        assert_eq!(
            pod_requests(&p),
            Amount {
                millicpus: 250,
                memory_bytes: 256 << 20
            }
        );
        // An init container larger than the containers, in memory only.
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![serde_json::from_value(json!({
            "name": "big-init", "resources": {"requests": {"memory": "1Gi", "cpu": "10m"}}
        }))
        .unwrap()]);
        // A sidecar keeps running beside the containers.
        spec.init_containers.as_mut().unwrap().push(
            serde_json::from_value(json!({
                "name": "sidecar", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}
            }))
            .unwrap(),
        );
        // A container with no requests at all (BestEffort) adds nothing.
        spec.containers
            .push(serde_json::from_value(json!({"name": "idle"})).unwrap());
        spec.overhead = Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("10m".into())),
            ("memory".to_string(), Quantity("10Mi".into())),
        ]));
        assert_eq!(
            pod_requests(&p),
            Amount {
                millicpus: 250 + 50 + 10,
                memory_bytes: (1 << 30) + (10 << 20)
            }
        );
        let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(pod_requests(&bare), Amount::default());
    }

    /// Without the node watch, a pod's node is still known: it is reported with its
    /// requests, its capacity zero, and the answer says why.
    #[test]
    fn without_nodes_the_pods_nodes_are_reported_with_their_requests() {
        let pods = [pod("sb-a", Some("n1"), "Running", "500m", "1Gi")];
        let r = aggregate(std::iter::empty(), pods.iter(), Some("forbidden".into()));
        assert_eq!(r.incomplete.as_deref(), Some("forbidden"));
        assert_eq!(r.nodes.len(), 1);
        assert_eq!(r.nodes[0].name, "n1");
        assert_eq!(r.nodes[0].allocatable, Amount::default());
        assert_eq!(r.nodes[0].requested.millicpus, 500);
    }

    #[test]
    fn the_largest_node_is_taken_per_resource_and_unreadable_nodes_are_skipped() {
        let nodes = [
            node("a", "2", "1900m", "8Gi", "8Gi"),
            node("b", "4", "4", "2Gi", "2048Mi"),
            // Beyond the compatible API's 1024-core cap on a create's cpu.
            node("c", "2048", "2000", "1Gi", "not-a-quantity"),
        ];
        let c = largest(nodes.iter()).unwrap();
        assert_eq!((c.cpus, c.memory_bytes), (4.0, 8 << 30));
        assert_eq!(largest(std::iter::empty()), None);
    }
}
