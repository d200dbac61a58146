//! The Kubernetes objects of a sandbox, built as plain values with no API call, so each
//! field is unit-tested: its pod, its token Secret, its egress policy, and the
//! namespace-wide NetworkPolicies.
//!
//! The pod, and why it looks the way it does:
//! - An init container runs `orchard-injector` from the injector image, copying the
//!   static agent (and the harness bundle when configured) into an emptyDir; the main
//!   container mounts it read-only at `/.orchard`, so the agent needs nothing from the
//!   user's image, which is used unmodified.
//! - The main container's command is the agent, listening on the pod IP. The token
//!   comes from the sandbox's Secret as `ORCHARD_AGENT_TOKEN` (a `secretKeyRef`, never
//!   in clear in the pod spec; the agent removes it from its commands' environment).
//! - `command` replaces the image's entrypoint, and no `args` drops its CMD; the image's
//!   user, env and working directory stay the runtime's, so they are honoured as on the
//!   local backend (on Kubernetes the agent itself runs as the image's user).
//! - Requests equal limits (CPU, memory; ephemeral storage when configured), so a
//!   sandbox gets what it asked for and no more. `activeDeadlineSeconds` is the TTL
//!   plus a margin: a backstop that stops the pod if no server is left to delete it.
//! - No service-account token, no service links, `restartPolicy: Never` (a sandbox
//!   whose agent died is failed, not silently restarted with its state gone).
//! - Everything carries `app.kubernetes.io/managed-by: orchard`, the one label the
//!   watch, the policies and the cleanup select on; the server's own labels travel as
//!   one JSON annotation (their values are not valid label values).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Pod, PodSpec, Probe, ResourceRequirements, Secret, SecretKeySelector,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;

use super::config::KubeConfig;
use super::error::KubeError;

/// The label on everything this backend makes.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY_VALUE: &str = "orchard";
/// The label naming the sandbox an object belongs to.
pub const SANDBOX_LABEL: &str = "orchard.dev/sandbox";
/// The label of an unclaimed warm pod (and its Secret): its pool's key.
pub const POOL_LABEL: &str = "orchard.dev/pool";
/// The annotation holding the server's labels as a JSON object.
pub const LABELS_ANNOTATION: &str = "orchard.dev/labels";
/// The annotation holding the normalised image reference.
pub const IMAGE_ANNOTATION: &str = "orchard.dev/image";
/// The label the orchestrator's own pods carry (ingress to agents is allowed from them).
pub const ORCHESTRATOR_LABEL: (&str, &str) = ("app.kubernetes.io/name", "orchard");
/// The key of the token in the sandbox's Secret.
pub const TOKEN_KEY: &str = "token";
/// The init container.
pub const INJECTOR_CONTAINER: &str = "orchard-injector";
/// The main container.
pub const SANDBOX_CONTAINER: &str = "sandbox";
/// The emptyDir the injector fills.
pub const INJECT_VOLUME: &str = "orchard";
/// Where it is mounted in both containers.
pub const INJECT_MOUNT: &str = "/.orchard";
/// The agent in the sandbox.
pub const AGENT_IN_SANDBOX: &str = "/.orchard/bin/orchard-agent";
/// Where the harness tools are mounted when injected (as on the local backend).
pub const TOOLS_MOUNT: &str = "/opt/sandbox-tools";
/// Where the injector image keeps its two binaries and the harness bundle.
pub const INJECTOR_BIN: &str = "/orchard-injector";
/// The agent in the injector image.
pub const AGENT_IN_INJECTOR: &str = "/orchard-agent";
/// The harness bundle in the injector image.
pub const HARNESS_IN_INJECTOR: &str = "/harness";
/// The namespace-wide policy denying egress to every sandbox.
pub const DENY_EGRESS_POLICY: &str = "orchard-deny-egress";
/// The namespace-wide policy allowing ingress to agents only from the orchestrator and
/// the peers the operator names.
pub const AGENT_INGRESS_POLICY: &str = "orchard-agent-ingress";
/// Seconds past the TTL before Kubernetes stops a pod nobody deleted.
pub const DEADLINE_MARGIN_S: i64 = 60;

/// The selector of everything this backend makes.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}={MANAGED_BY_VALUE}")
}

/// The name of a sandbox's token Secret.
pub fn secret_name(id: &str) -> String {
    format!("{id}-token")
}

/// The name of a sandbox's egress policy.
pub fn egress_policy_name(id: &str) -> String {
    format!("{id}-egress")
}

/// Whether `id` can name a pod: a DNS-1123 label (the server's ids also allow `_` and
/// `.`, which pod names and host names do not).
pub fn check_pod_name(id: &str) -> Result<(), KubeError> {
    let b = id.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(KubeError::Invalid(format!(
            "sandbox id {id:?} cannot name a pod: on Kubernetes ids are lower-case letters, \
             digits and '-', starting and ending with a letter or digit"
        )))
    }
}

fn labels(id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (SANDBOX_LABEL.to_string(), id.to_string()),
    ])
}

/// Labels of a pod or Secret: a sandbox's, or an unclaimed warm pod's (`pool`).
fn owner_labels(id: &str, pool: Option<&str>) -> BTreeMap<String, String> {
    match pool {
        None => labels(id),
        Some(key) => BTreeMap::from([
            (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
            (POOL_LABEL.to_string(), key.to_string()),
        ]),
    }
}

/// What one sandbox's pod is made of (backend-neutral values, already checked).
#[derive(Debug, Clone)]
pub struct PodInput<'a> {
    /// Sandbox id, also the pod's name.
    pub id: &'a str,
    /// Normalised image reference.
    pub image: &'a str,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// `KEY=value` added to the image's environment.
    pub env: &'a [String],
    /// The server's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Lifetime.
    pub ttl: Option<Duration>,
    /// The warm pool's key when this is an unclaimed warm pod (`id` is then the pod's
    /// name, and a claim gives it a sandbox id).
    pub pool: Option<&'a str>,
}

/// CPUs as a Kubernetes quantity in millicores (`1.5` is `1500m`).
pub fn cpu_quantity(cpus: f64) -> Result<Quantity, KubeError> {
    if !cpus.is_finite() || cpus <= 0.0 || cpus > 1e6 {
        return Err(KubeError::Invalid(format!("invalid CPU count {cpus}")));
    }
    let milli = (cpus * 1000.0).ceil() as u64;
    Ok(Quantity(format!("{milli}m")))
}

/// The pod of a sandbox.
pub fn pod(cfg: &KubeConfig, input: &PodInput<'_>) -> Result<Pod, KubeError> {
    check_pod_name(input.id)?;
    let labels_json = serde_json::to_string(input.labels)
        .map_err(|e| KubeError::Invalid(format!("labels: {e}")))?;
    let mut annotations = BTreeMap::from([
        (LABELS_ANNOTATION.to_string(), labels_json),
        (IMAGE_ANNOTATION.to_string(), input.image.to_string()),
    ]);
    annotations.extend(cfg.pod_annotations.clone());

    let env = pod_env(input)?;
    let resources = pod_resources(cfg, input)?;
    let sandbox = sandbox_container(cfg, input, env, resources);
    let injector = injector_container(cfg);
    let deadline = input
        .ttl
        .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX / 2) + DEADLINE_MARGIN_S);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(input.id.to_string()),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(owner_labels(input.id, input.pool)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![injector]),
            containers: vec![sandbox],
            volumes: Some(vec![Volume {
                name: INJECT_VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }]),
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(cfg.grace_period_s),
            active_deadline_seconds: deadline,
            runtime_class_name: cfg.runtime_class.clone(),
            node_selector: (!cfg.node_selector.is_empty()).then(|| cfg.node_selector.clone()),
            ..Default::default()
        }),
        status: None,
    })
}

/// The pod's step 1: the sandbox's environment, the token from its Secret first.
fn pod_env(input: &PodInput<'_>) -> Result<Vec<EnvVar>, KubeError> {
    let mut env = vec![EnvVar {
        name: "ORCHARD_AGENT_TOKEN".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret_name(input.id),
                key: TOKEN_KEY.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    for kv in input.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            KubeError::Invalid(format!("environment entry {kv:?} is not KEY=value"))
        })?;
        if k.is_empty() || k == "ORCHARD_AGENT_TOKEN" {
            return Err(KubeError::Invalid(format!(
                "environment variable {k:?} cannot be set"
            )));
        }
        env.push(EnvVar {
            name: k.to_string(),
            value: Some(v.to_string()),
            ..Default::default()
        });
    }
    Ok(env)
}

/// The pod's step 2: the sandbox container's resources, requests equal to limits.
fn pod_resources(
    cfg: &KubeConfig,
    input: &PodInput<'_>,
) -> Result<Option<ResourceRequirements>, KubeError> {
    let mut limits = BTreeMap::new();
    if let Some(cpus) = input.cpus {
        limits.insert("cpu".to_string(), cpu_quantity(cpus)?);
    }
    if let Some(bytes) = input.memory_bytes {
        limits.insert("memory".to_string(), Quantity(bytes.to_string()));
    }
    if let Some(q) = &cfg.ephemeral_storage {
        limits.insert("ephemeral-storage".to_string(), Quantity(q.clone()));
    }
    Ok((!limits.is_empty()).then(|| ResourceRequirements {
        requests: Some(limits.clone()),
        limits: Some(limits),
        ..Default::default()
    }))
}

/// The pod's step 3: the sandbox container, running the injected agent.
fn sandbox_container(
    cfg: &KubeConfig,
    input: &PodInput<'_>,
    env: Vec<EnvVar>,
    resources: Option<ResourceRequirements>,
) -> Container {
    let port = i32::from(cfg.agent_port);
    let mut command = vec![
        AGENT_IN_SANDBOX.to_string(),
        "--tcp".into(),
        format!("0.0.0.0:{port}"),
    ];
    let mut mounts = vec![VolumeMount {
        name: INJECT_VOLUME.into(),
        mount_path: INJECT_MOUNT.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    if cfg.harness {
        command.extend(["--publish-tools".to_string(), TOOLS_MOUNT.into()]);
        mounts.push(VolumeMount {
            name: INJECT_VOLUME.into(),
            mount_path: TOOLS_MOUNT.into(),
            sub_path: Some("harness".into()),
            read_only: Some(true),
            ..Default::default()
        });
    }
    Container {
        name: SANDBOX_CONTAINER.into(),
        image: Some(input.image.to_string()),
        image_pull_policy: Some(cfg.image_pull_policy.clone()),
        command: Some(command),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("agent".into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/livez".into()),
                port: IntOrString::Int(port),
                ..Default::default()
            }),
            period_seconds: Some(2),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources,
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's step 4: the init container that copies the agent (and the harness) in.
fn injector_container(cfg: &KubeConfig) -> Container {
    let mut inject = vec![
        INJECTOR_BIN.to_string(),
        "--agent".into(),
        AGENT_IN_INJECTOR.into(),
        "--target".into(),
        INJECT_MOUNT.into(),
    ];
    if cfg.harness {
        inject.extend(["--harness".to_string(), HARNESS_IN_INJECTOR.into()]);
    }
    Container {
        name: INJECTOR_CONTAINER.into(),
        image: Some(cfg.injector_image.clone()),
        image_pull_policy: Some(cfg.injector_pull_policy.clone()),
        command: Some(inject),
        volume_mounts: Some(vec![VolumeMount {
            name: INJECT_VOLUME.into(),
            mount_path: INJECT_MOUNT.into(),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".into())),
                ("memory".to_string(), Quantity("32Mi".into())),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("500m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Secret holding a pod's token. Made before the pod (the kubelet would otherwise
/// hold the container in `CreateContainerConfigError`), then owned by it. A warm pod's
/// (`pool`) is mutable: a claim writes the sandbox's own token into it.
pub fn secret(cfg: &KubeConfig, pod: &str, token: &str, pool: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(pod)),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(owner_labels(pod, pool)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        type_: Some("Opaque".into()),
        immutable: Some(pool.is_none()),
        ..Default::default()
    }
}

/// An owner reference to `pod`, so the garbage collector removes what hangs off it.
pub fn owned_by(pod: &Pod) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
        block_owner_deletion: Some(false),
        controller: Some(false),
    })
}

fn managed_pods() -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            MANAGED_BY.to_string(),
            MANAGED_BY_VALUE.to_string(),
        )])),
        ..Default::default()
    }
}

/// The per-sandbox policy allowing its egress (policies add up: this one opens what
/// the namespace-wide deny closes, for this pod only).
pub fn egress_policy(cfg: &KubeConfig, id: &str, owner: Option<OwnerReference>) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(egress_policy_name(id)),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels(id)),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    SANDBOX_LABEL.to_string(),
                    id.to_string(),
                )])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(egress_rules(&cfg.egress)),
            ..Default::default()
        }),
    }
}

/// Egress to the internet only (see `crate::egress`): everything but the denied ranges,
/// the operator's allowed ranges, and the cluster's DNS (kube-dns pods have private
/// addresses; without it no name resolves).
/// Whether `net` lies in the IPv4-mapped IPv6 range, `::ffff:0:0/96`.
fn is_v4_mapped(net: &crate::egress::IpNet) -> bool {
    match net {
        crate::egress::IpNet::V6(n) => n.addr().to_ipv4_mapped().is_some() && n.prefix_len() >= 96,
        crate::egress::IpNet::V4(_) => false,
    }
}

fn egress_rules(policy: &crate::egress::EgressPolicy) -> Vec<NetworkPolicyEgressRule> {
    use crate::egress::{denied, IpNet};
    let everything_but = |all: &str, v6: bool| {
        let except: Vec<String> = denied()
            .iter()
            .filter(|net| matches!(net, IpNet::V6(_)) == v6)
            // The API server refuses IPv4-mapped IPv6 blocks (`::ffff:0:0/96`: "must not
            // have an IPv4-mapped IPv6 address"); such packets leave as IPv4, which the
            // IPv4 block's exceptions cover.
            .filter(|net| !is_v4_mapped(net))
            .map(|net| net.to_string())
            .collect();
        NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: all.into(),
                except: Some(except),
            }),
            ..Default::default()
        }
    };
    let mut to = vec![
        everything_but("0.0.0.0/0", false),
        everything_but("::/0", true),
    ];
    to.extend(policy.allow.iter().map(|net| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: net.to_string(),
            except: None,
        }),
        ..Default::default()
    }));
    let dns_port = |protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: Some(protocol.into()),
        ..Default::default()
    };
    let dns = NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_string(),
                    "kube-system".to_string(),
                )])),
                ..Default::default()
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "k8s-app".to_string(),
                    "kube-dns".to_string(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![dns_port("UDP"), dns_port("TCP")]),
    };
    vec![
        NetworkPolicyEgressRule {
            to: Some(to),
            ports: None,
        },
        dns,
    ]
}

/// The namespace-wide policies: every sandbox's egress denied; ingress to agents only
/// from the orchestrator's pods (any namespace) and the CIDRs and pod labels the
/// operator names (trainers calling agents directly).
pub fn namespace_policies(cfg: &KubeConfig) -> Vec<NetworkPolicy> {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(cfg.namespace.clone()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY.to_string(),
            MANAGED_BY_VALUE.to_string(),
        )])),
        ..Default::default()
    };
    let deny = NetworkPolicy {
        metadata: meta(DENY_EGRESS_POLICY),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(managed_pods()),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(vec![]),
            ..Default::default()
        }),
    };
    let any_namespace = Some(LabelSelector::default());
    let mut from = vec![NetworkPolicyPeer {
        namespace_selector: any_namespace.clone(),
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                ORCHESTRATOR_LABEL.0.to_string(),
                ORCHESTRATOR_LABEL.1.to_string(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    }];
    for (k, v) in &cfg.ingress_pod_labels {
        from.push(NetworkPolicyPeer {
            namespace_selector: any_namespace.clone(),
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(k.clone(), v.clone())])),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    for cidr in &cfg.ingress_cidrs {
        from.push(NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: cidr.clone(),
                except: None,
            }),
            ..Default::default()
        });
    }
    let ingress = NetworkPolicy {
        metadata: meta(AGENT_INGRESS_POLICY),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(managed_pods()),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(i32::from(cfg.agent_port))),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            }]),
            ..Default::default()
        }),
    };
    vec![deny, ingress]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> KubeConfig {
        KubeConfig::default()
    }

    fn input<'a>(labels: &'a BTreeMap<String, String>, env: &'a [String]) -> PodInput<'a> {
        PodInput {
            id: "sb-1",
            image: "docker.io/library/python:3.11-slim",
            cpus: Some(1.5),
            memory_bytes: Some(256 << 20),
            env,
            labels,
            ttl: Some(Duration::from_secs(600)),
            pool: None,
        }
    }

    /// The kubelet writes `/etc/hosts` (localhost both ways, the pod IP and name) and
    /// `/etc/resolv.conf`, and containerd's CRI bind-mounts `/etc/hostname` and sets
    /// `HOSTNAME` (which the agent's commands inherit) for every pod as it is: nothing in
    /// the pod may take them over (issue 31).
    #[test]
    fn the_runtime_gives_the_pod_its_hosts_hostname_and_resolver() {
        let labels = BTreeMap::new();
        let pod = pod(&cfg(), &input(&labels, &[])).unwrap();
        let v = serde_json::to_value(&pod).unwrap();
        let spec = &v["spec"];
        for key in [
            "hostNetwork",
            "dnsPolicy",
            "dnsConfig",
            "hostname",
            "subdomain",
            "setHostnameAsFQDN",
            "hostAliases",
        ] {
            assert!(spec.get(key).is_none(), "{key}: {spec}");
        }
        let main = &spec["containers"][0];
        let names: Vec<&str> = main["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(!names.contains(&"HOSTNAME"), "{names:?}");
        for m in main["volumeMounts"].as_array().unwrap() {
            let path = m["mountPath"].as_str().unwrap_or_default();
            assert!(!path.starts_with("/etc"), "{m}");
        }
    }

    #[test]
    fn the_pod_runs_the_injected_agent_in_the_unmodified_image() {
        let labels = BTreeMap::from([("orchard.meta.image".into(), "python:3.11-slim".into())]);
        let env = vec!["A=1".to_string(), "B=x=y".to_string()];
        let pod = pod(&cfg(), &input(&labels, &env)).unwrap();
        let v = serde_json::to_value(&pod).unwrap();
        let spec = &v["spec"];
        let main = &spec["containers"][0];
        assert_eq!(main["image"], "docker.io/library/python:3.11-slim");
        assert_eq!(
            main["command"],
            serde_json::json!([AGENT_IN_SANDBOX, "--tcp", "0.0.0.0:7070"])
        );
        assert!(main.get("args").is_none(), "the image's CMD is dropped");
        assert!(main.get("workingDir").is_none() && spec.get("securityContext").is_none());
        assert_eq!(main["volumeMounts"][0]["mountPath"], INJECT_MOUNT);
        assert_eq!(main["volumeMounts"][0]["readOnly"], true);
        let init = &spec["initContainers"][0];
        assert_eq!(init["image"], cfg().injector_image);
        assert_eq!(init["volumeMounts"][0]["mountPath"], INJECT_MOUNT);
        assert!(init["volumeMounts"][0].get("readOnly").is_none());
        assert_eq!(main["resources"]["limits"]["cpu"], "1500m");
        assert_eq!(main["resources"]["limits"]["memory"], "268435456");
        assert_eq!(main["resources"]["requests"], main["resources"]["limits"]);
        assert_eq!(spec["activeDeadlineSeconds"], 660);
        assert_eq!(spec["restartPolicy"], "Never");
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(main["readinessProbe"]["httpGet"]["path"], "/livez");
        assert_eq!(v["metadata"]["labels"][SANDBOX_LABEL], "sb-1");
        let back: BTreeMap<String, String> = serde_json::from_str(
            v["metadata"]["annotations"][LABELS_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(back, labels);
        assert_eq!(main["env"][2]["name"], "B");
        assert_eq!(main["env"][2]["value"], "x=y");
    }

    #[test]
    fn the_token_comes_from_the_secret_never_in_clear() {
        let labels = BTreeMap::new();
        let pod = pod(&cfg(), &input(&labels, &[])).unwrap();
        let text = serde_json::to_string(&pod).unwrap();
        let v = serde_json::to_value(&pod).unwrap();
        let token = &v["spec"]["containers"][0]["env"][0];
        assert_eq!(token["name"], "ORCHARD_AGENT_TOKEN");
        assert!(token.get("value").is_none());
        assert_eq!(token["valueFrom"]["secretKeyRef"]["name"], "sb-1-token");
        let secret = secret(&cfg(), "sb-1", "s3cret-token", None);
        assert!(!text.contains("s3cret-token"));
        assert_eq!(secret.data.unwrap()["token"].0, b"s3cret-token");
    }

    #[test]
    fn the_token_variable_cannot_be_overridden_by_env() {
        let labels = BTreeMap::new();
        let env = vec!["ORCHARD_AGENT_TOKEN=mine".to_string()];
        assert!(matches!(
            pod(&cfg(), &input(&labels, &env)),
            Err(KubeError::Invalid(_))
        ));
    }

    #[test]
    fn ids_that_cannot_name_a_pod_are_refused() {
        for bad in ["a_b", "a.b", "-a", "a-", "", "A"] {
            assert!(check_pod_name(bad).is_err(), "{bad:?}");
        }
        check_pod_name("sb-0123456789ab").unwrap();
        assert!(check_pod_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn the_harness_is_injected_and_mounted_only_when_configured() {
        let labels = BTreeMap::new();
        let mut c = cfg();
        let plain = serde_json::to_value(pod(&c, &input(&labels, &[])).unwrap()).unwrap();
        assert!(!plain.to_string().contains(TOOLS_MOUNT));
        c.harness = true;
        let v = serde_json::to_value(pod(&c, &input(&labels, &[])).unwrap()).unwrap();
        let main = &v["spec"]["containers"][0];
        assert_eq!(main["volumeMounts"][1]["mountPath"], TOOLS_MOUNT);
        assert_eq!(main["volumeMounts"][1]["subPath"], "harness");
        assert!(v["spec"]["initContainers"][0]["command"]
            .to_string()
            .contains("--harness"));
    }

    #[test]
    fn policies_deny_egress_and_admit_only_named_peers() {
        let mut c = cfg();
        c.ingress_cidrs = vec!["10.0.0.0/8".into()];
        c.ingress_pod_labels = vec![("role".into(), "trainer".into())];
        let p = namespace_policies(&c);
        let deny = serde_json::to_value(&p[0]).unwrap();
        assert_eq!(deny["spec"]["policyTypes"], serde_json::json!(["Egress"]));
        assert_eq!(deny["spec"]["egress"], serde_json::json!([]));
        let ing = serde_json::to_value(&p[1]).unwrap();
        let from = &ing["spec"]["ingress"][0]["from"];
        assert_eq!(
            from[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
            "orchard"
        );
        assert_eq!(from[1]["podSelector"]["matchLabels"]["role"], "trainer");
        assert_eq!(from[2]["ipBlock"]["cidr"], "10.0.0.0/8");
        assert_eq!(ing["spec"]["ingress"][0]["ports"][0]["port"], 7070);
        let egress = serde_json::to_value(egress_policy(&c, "sb-1", None)).unwrap();
        assert_eq!(
            egress["spec"]["podSelector"]["matchLabels"][SANDBOX_LABEL],
            "sb-1"
        );
        let rules = egress["spec"]["egress"].as_array().unwrap();
        assert_eq!(rules[0]["to"][0]["ipBlock"]["cidr"], "0.0.0.0/0");
        assert_eq!(rules[1]["ports"][0]["port"], 53);
    }

    /// Issue 30, point 8: egress means the internet, not private, link-local (cloud
    /// metadata) or loopback ranges, unless the operator allowed them.
    #[test]
    fn the_egress_policy_excludes_private_and_link_local_ranges_but_allowed_ones() {
        let mut c = cfg();
        c.egress = crate::egress::EgressPolicy::parse(&["10.1.0.0/16"]).unwrap();
        let p = serde_json::to_value(egress_policy(&c, "sb-1", None)).unwrap();
        let rules = p["spec"]["egress"].as_array().unwrap();
        assert_eq!(rules.len(), 2, "{p}");
        let to = rules[0]["to"].as_array().unwrap();
        assert!(rules[0].get("ports").is_none(), "{p}");
        let except = |i: usize| -> Vec<&str> {
            to[i]["ipBlock"]["except"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect()
        };
        assert_eq!(to[0]["ipBlock"]["cidr"], "0.0.0.0/0");
        for range in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "127.0.0.0/8",
        ] {
            assert!(except(0).contains(&range), "{range} missing: {p}");
        }
        assert_eq!(to[1]["ipBlock"]["cidr"], "::/0");
        for range in ["fc00::/7", "fe80::/10", "::1/128"] {
            assert!(except(1).contains(&range), "{range} missing: {p}");
        }
        // The API server refuses IPv4-mapped blocks (the test cluster answered 422).
        assert!(
            !except(1).iter().any(|r| r.starts_with("::ffff:")),
            "an IPv4-mapped block: {p}"
        );
        // The operator's range, as a peer of its own (peers add up).
        assert_eq!(to[2]["ipBlock"]["cidr"], "10.1.0.0/16");
        assert!(to[2]["ipBlock"].get("except").is_none());
        assert_eq!(to.len(), 3);
        // The cluster's DNS only on port 53.
        let dns = &rules[1];
        assert_eq!(
            dns["to"][0]["podSelector"]["matchLabels"]["k8s-app"],
            "kube-dns"
        );
        assert_eq!(
            dns["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "kube-system"
        );
        let ports: Vec<(i64, &str)> = dns["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["port"].as_i64().unwrap(), p["protocol"].as_str().unwrap()))
            .collect();
        assert_eq!(ports, vec![(53, "UDP"), (53, "TCP")]);
    }

    #[test]
    fn the_ephemeral_storage_limit_is_set_when_configured() {
        let labels = BTreeMap::new();
        let mut c = cfg();
        let v = serde_json::to_value(pod(&c, &input(&labels, &[])).unwrap()).unwrap();
        assert!(v["spec"]["containers"][0]["resources"]["limits"]
            .get("ephemeral-storage")
            .is_none());
        c.ephemeral_storage = Some("10737418240".into());
        let v = serde_json::to_value(pod(&c, &input(&labels, &[])).unwrap()).unwrap();
        let r = &v["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"]["ephemeral-storage"], "10737418240");
        assert_eq!(r["requests"]["ephemeral-storage"], "10737418240");
    }

    #[test]
    fn cpu_quantities_round_up_to_a_millicore() {
        assert_eq!(cpu_quantity(2.0).unwrap().0, "2000m");
        assert_eq!(cpu_quantity(0.0001).unwrap().0, "1m");
        assert!(cpu_quantity(f64::NAN).is_err());
        assert!(cpu_quantity(0.0).is_err());
    }
}
