//! What a pod's status means for its sandbox: still starting, waiting for a node, its
//! agent up (with the pod IP), or failed for a reason a user can act on. Pure functions
//! over `Pod`, so every case Kubernetes reports is unit-tested with the status it really
//! sends.
//!
//! Failing fast is deliberate: an image that cannot be pulled, an eviction or an agent
//! that exited will not fix themselves within a create's readiness limit, so the create
//! fails at once with Kubernetes' reason and message rather than timing out minutes
//! later with none. A pod no node can take is the exception: a node may join (the
//! cluster autoscaler adds one for exactly such pods) or free up, so it waits, reported
//! as unschedulable with the scheduler's reason, within the readiness limit.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::objects::{INJECTOR_CONTAINER, SANDBOX_CONTAINER};

/// Waiting reasons of a container that mean its image will not be pulled.
const IMAGE_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
    "SignatureValidationFailed",
];
/// What an unschedulable pod reports when the scheduler said nothing more.
pub const NO_NODES: &str = "No nodes available";
/// Waiting reasons of a container that mean it will not start.
const START_FAILURES: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
    "PreCreateHookError",
    "PreStartHookError",
];

/// A pod's state, as its sandbox sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Still starting; the text says what it waits for.
    Starting(String),
    /// No node can take it now (`PodScheduled` is `False` with reason `Unschedulable`);
    /// the text is the scheduler's message. It may still run once capacity appears.
    Unschedulable(String),
    /// The agent's container runs and the pod has an IP.
    Running(IpAddr),
    /// It will not become ready; the text gives Kubernetes' reason.
    Failed(String),
}

fn join(reason: Option<&str>, message: Option<&str>) -> String {
    match (
        reason.filter(|r| !r.is_empty()),
        message.filter(|m| !m.is_empty()),
    ) {
        (Some(r), Some(m)) => format!("{r}: {m}"),
        (Some(r), None) => r.to_string(),
        (None, Some(m)) => m.to_string(),
        (None, None) => "no reason given".to_string(),
    }
}

/// Whether a container status says it cannot start; the failure text.
fn container_failure(what: &str, image: &str, s: &ContainerStatus) -> Option<String> {
    let state = s.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or_default();
        if IMAGE_FAILURES.contains(&reason) {
            return Some(format!(
                "image {image} cannot be pulled ({})",
                join(Some(reason), w.message.as_deref())
            ));
        }
        if START_FAILURES.contains(&reason) {
            return Some(format!(
                "the {what} cannot start ({})",
                join(Some(reason), w.message.as_deref())
            ));
        }
    }
    None
}

/// The state of `pod`.
pub fn pod_state(pod: &Pod) -> PodState {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Failed("the pod is being deleted".into());
    }
    let Some(status) = pod.status.as_ref() else {
        return PodState::Starting("not scheduled yet".into());
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    if phase == "Failed" || phase == "Succeeded" {
        let why = join(status.reason.as_deref(), status.message.as_deref());
        return PodState::Failed(format!("the pod ended ({phase}, {why})"));
    }
    for c in status.conditions.iter().flatten() {
        if c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
        {
            let message = c.message.as_deref().map(str::trim).unwrap_or_default();
            return PodState::Unschedulable(if message.is_empty() {
                NO_NODES.to_string()
            } else {
                message.to_string()
            });
        }
    }
    let spec = pod.spec.as_ref();
    let image_of = |name: &str, containers: Option<&Vec<k8s_openapi::api::core::v1::Container>>| {
        containers
            .and_then(|cs| cs.iter().find(|c| c.name == name))
            .and_then(|c| c.image.clone())
            .unwrap_or_default()
    };
    for s in status.init_container_statuses.iter().flatten() {
        let image = image_of(&s.name, spec.and_then(|p| p.init_containers.as_ref()));
        if let Some(f) = container_failure("injector", &image, s) {
            return PodState::Failed(f);
        }
        if let Some(t) = s.state.as_ref().and_then(|st| st.terminated.as_ref()) {
            if t.exit_code != 0 {
                return PodState::Failed(format!(
                    "{INJECTOR_CONTAINER} failed with exit code {} ({})",
                    t.exit_code,
                    join(t.reason.as_deref(), t.message.as_deref())
                ));
            }
        }
    }
    let main = status
        .container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == SANDBOX_CONTAINER);
    let Some(main) = main else {
        return PodState::Starting(format!("{phase}: injecting the agent"));
    };
    let image = image_of(SANDBOX_CONTAINER, spec.map(|p| &p.containers));
    if let Some(f) = container_failure("sandbox container", &image, main) {
        return PodState::Failed(f);
    }
    let state = main.state.as_ref();
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return PodState::Failed(format!(
            "the agent exited with code {} ({})",
            t.exit_code,
            join(t.reason.as_deref(), t.message.as_deref())
        ));
    }
    if state.and_then(|s| s.running.as_ref()).is_none() {
        let waiting = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
            .unwrap_or_else(|| "waiting".into());
        return PodState::Starting(format!("{phase}: {waiting}"));
    }
    match status.pod_ip.as_deref().and_then(|ip| ip.parse().ok()) {
        Some(ip) => PodState::Running(ip),
        None => PodState::Starting("running, no pod IP yet".into()),
    }
}

/// Whether the agent's container passed its readiness probe: the agent answers on the
/// pod IP. A warm pod is claimed only then, so the token rotation of a claim never
/// races the agent's start.
pub fn agent_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.name == SANDBOX_CONTAINER && c.ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sb-1"},
            "spec": {
                "initContainers": [{"name": INJECTOR_CONTAINER, "image": "inj:1"}],
                "containers": [{"name": SANDBOX_CONTAINER, "image": "docker.io/library/nope:1"}]
            },
            "status": status
        }))
        .unwrap()
    }

    fn main_waiting(reason: &str, message: &str) -> Pod {
        pod(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": SANDBOX_CONTAINER, "image": "x", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}}
            }]
        }))
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_with_its_name_and_reason() {
        let PodState::Failed(m) = pod_state(&main_waiting("ErrImagePull", "not found")) else {
            panic!()
        };
        assert!(
            m.contains("docker.io/library/nope:1") && m.contains("ErrImagePull: not found"),
            "{m}"
        );
        assert!(matches!(
            pod_state(&main_waiting("ImagePullBackOff", "")),
            PodState::Failed(_)
        ));
        assert!(matches!(
            pod_state(&main_waiting("ContainerCreating", "")),
            PodState::Starting(_)
        ));
    }

    /// The condition as the scheduler writes it (v1.37, a pod asking for more CPU than
    /// the node has), and after a node selector no node matches.
    #[test]
    fn an_unschedulable_pod_waits_with_the_schedulers_message() {
        let message = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes \
                       are available: 1 No preemption victims found for incoming pod.";
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "lastProbeTime": null,
                            "lastTransitionTime": "2026-12-04T10:00:00Z",
                            "message": message}]
        }));
        assert_eq!(pod_state(&p), PodState::Unschedulable(message.into()));
        let selector = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}]
        }));
        let PodState::Unschedulable(m) = pod_state(&selector) else {
            panic!()
        };
        assert!(
            m.contains("didn't match Pod's node affinity/selector"),
            "{m}"
        );
    }

    #[test]
    fn an_unschedulable_pod_without_a_message_has_no_nodes_available() {
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        }));
        assert_eq!(pod_state(&p), PodState::Unschedulable(NO_NODES.into()));
    }

    /// Scheduled at last: the condition turns `True` and the pod starts like any other;
    /// a `False` condition for another reason (a scheduling gate) is not unschedulable.
    #[test]
    fn a_scheduled_pod_is_starting_again() {
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [{
                "name": INJECTOR_CONTAINER, "image": "inj:1", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}
            }]
        }));
        assert!(matches!(pod_state(&p), PodState::Starting(_)));
        let gated = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False",
                            "reason": "SchedulingGated", "message": "Scheduling is blocked"}]
        }));
        assert!(matches!(pod_state(&gated), PodState::Starting(_)));
    }

    #[test]
    fn a_deleted_or_ended_pod_fails_even_when_it_was_unschedulable() {
        let conditions = serde_json::json!([{"type": "PodScheduled", "status": "False",
                                             "reason": "Unschedulable", "message": "0/1"}]);
        let mut deleting = pod(serde_json::json!({"phase": "Pending", "conditions": conditions}));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(matches!(pod_state(&deleting), PodState::Failed(_)));
        let ended = pod(
            serde_json::json!({"phase": "Failed", "reason": "DeadlineExceeded",
                                          "conditions": conditions}),
        );
        assert!(matches!(pod_state(&ended), PodState::Failed(_)));
    }

    #[test]
    fn evictions_and_deadlines_fail_with_the_pods_reason() {
        let p = pod(serde_json::json!({"phase": "Failed", "reason": "Evicted",
                                      "message": "The node was low on resource: memory."}));
        let PodState::Failed(m) = pod_state(&p) else {
            panic!()
        };
        assert!(
            m.contains("Evicted") && m.contains("low on resource"),
            "{m}"
        );
    }

    #[test]
    fn a_failed_injector_fails_the_pod_with_its_exit_code() {
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "initContainerStatuses": [{
                "name": INJECTOR_CONTAINER, "image": "inj:1", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "no agent"}}
            }]
        }));
        let PodState::Failed(m) = pod_state(&p) else {
            panic!()
        };
        assert!(m.contains("exit code 1") && m.contains("no agent"), "{m}");
    }

    #[test]
    fn a_running_agent_with_an_ip_is_running() {
        let p = pod(serde_json::json!({
            "phase": "Running", "podIP": "198.18.0.7",
            "containerStatuses": [{
                "name": SANDBOX_CONTAINER, "image": "x", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"running": {}}
            }]
        }));
        assert_eq!(
            pod_state(&p),
            PodState::Running("198.18.0.7".parse().unwrap())
        );
        let mut deleting = p.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(matches!(pod_state(&deleting), PodState::Failed(_)));
    }

    #[test]
    fn only_a_probed_agent_is_ready() {
        let status = |ready: bool| {
            serde_json::json!({
                "phase": "Running", "podIP": "198.18.0.7",
                "containerStatuses": [{
                    "name": SANDBOX_CONTAINER, "image": "x", "imageID": "", "ready": ready,
                    "restartCount": 0, "state": {"running": {}}
                }]
            })
        };
        assert!(!agent_ready(&pod(status(false))));
        assert!(agent_ready(&pod(status(true))));
        assert!(!agent_ready(&pod(serde_json::json!({"phase": "Pending"}))));
    }

    #[test]
    fn an_exited_agent_fails() {
        let p = pod(serde_json::json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": SANDBOX_CONTAINER, "image": "x", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 127, "reason": "Error"}}
            }]
        }));
        let PodState::Failed(m) = pod_state(&p) else {
            panic!()
        };
        assert!(m.contains("127"), "{m}");
    }
}
