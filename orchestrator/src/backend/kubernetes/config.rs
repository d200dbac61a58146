//! Settings of the Kubernetes backend: flags (`--kube-*`, plus `--kubeconfig` and
//! `--namespace`), `ORCHARD_*` variables, and the TOML file's `[kubernetes]` table, with
//! the same precedence as every other setting (flags, environment, file, defaults).
//! [`KubeArgs`] declares each once (flattened into `orchard serve`'s settings, layered
//! by `crate::config`); [`KubeConfig::resolve`] adds the defaults and checks.
//!
//! The defaults match what `make cluster` imports into the test cluster, so
//! `orchard serve --backend kubernetes --kubeconfig FILE` needs nothing else there.

use std::collections::BTreeMap;
use std::path::PathBuf;

use merge::Merge;
use serde::Deserialize;

/// The injector image's default name: this release's, as `make k8s-images` builds it
/// and `make cluster` imports it.
pub const DEFAULT_INJECTOR_IMAGE: &str = concat!(
    "ghcr.io/orchard-env/orchard-injector:",
    env!("CARGO_PKG_VERSION")
);
/// The namespace sandboxes live in by default.
pub const DEFAULT_NAMESPACE: &str = "orchard-sandboxes";
/// The port agents listen on in their pods.
pub const DEFAULT_AGENT_PORT: u16 = 7070;

/// The resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeConfig {
    /// Kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Where sandboxes' pods, secrets and policies live.
    pub namespace: String,
    /// The injector image (agent, injector, optionally the harness bundle).
    pub injector_image: String,
    /// Its pull policy (`IfNotPresent`: an imported image is never pulled).
    pub injector_pull_policy: String,
    /// Pull policy of sandbox images.
    pub image_pull_policy: String,
    /// The agent's port.
    pub agent_port: u16,
    /// Seconds between SIGTERM and SIGKILL when a sandbox is deleted.
    pub grace_period_s: i64,
    /// Each sandbox's ephemeral-storage limit (a quantity), if any.
    pub ephemeral_storage: Option<String>,
    /// The injector image carries the harness bundle: inject and publish it.
    pub harness: bool,
    /// CIDRs allowed to reach agents (trainers calling them directly; the host when
    /// the orchestrator runs outside the cluster).
    pub ingress_cidrs: Vec<String>,
    /// Pod labels (`key=value`, any namespace) allowed to reach agents.
    pub ingress_pod_labels: Vec<(String, String)>,
    /// RuntimeClass of sandbox pods (gVisor, Kata), if any.
    pub runtime_class: Option<String>,
    /// Node selector of sandbox pods.
    pub node_selector: BTreeMap<String, String>,
    /// Extra annotations on sandbox pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// Warm pools: (normalised image, pods kept ready).
    pub warm_pools: Vec<(String, usize)>,
    /// CPUs of warm pods: a create claims one only when it asks for exactly this (the
    /// server sets it to its default CPU limit).
    pub warm_cpus: Option<f64>,
    /// Memory of warm pods, likewise (the server's default memory limit).
    pub warm_memory_bytes: Option<u64>,
    /// Non-public ranges a sandbox with egress may reach anyway (`--egress-allow-cidr`,
    /// shared with the local backend; set by `serve`).
    pub egress: crate::egress::EgressPolicy,
}

impl Default for KubeConfig {
    fn default() -> KubeConfig {
        KubeConfig {
            kubeconfig: None,
            namespace: DEFAULT_NAMESPACE.into(),
            injector_image: DEFAULT_INJECTOR_IMAGE.into(),
            injector_pull_policy: "IfNotPresent".into(),
            image_pull_policy: "IfNotPresent".into(),
            agent_port: DEFAULT_AGENT_PORT,
            grace_period_s: 2,
            ephemeral_storage: None,
            harness: false,
            ingress_cidrs: Vec::new(),
            ingress_pod_labels: Vec::new(),
            runtime_class: None,
            node_selector: BTreeMap::new(),
            pod_annotations: BTreeMap::new(),
            warm_pools: Vec::new(),
            warm_cpus: None,
            warm_memory_bytes: None,
            egress: crate::egress::EgressPolicy::default(),
        }
    }
}

/// Flags and environment of the Kubernetes backend (flattened into `orchard serve`);
/// the file's `[kubernetes]` table, whose keys drop the flags' `kube_`.
#[derive(clap::Args, Deserialize, Merge, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
#[merge(strategy = merge::option::overwrite_none)]
pub struct KubeArgs {
    /// Kubeconfig file of the Kubernetes backend [default: KUBECONFIG, ~/.kube/config,
    /// then the in-cluster service account].
    #[arg(long, env = "ORCHARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the sandboxes' pods [default: orchard-sandboxes; made when missing].
    #[arg(long, env = "ORCHARD_NAMESPACE")]
    pub namespace: Option<String>,
    /// The injector image [default: ghcr.io/orchard-env/orchard-injector:VERSION].
    #[arg(long, env = "ORCHARD_INJECTOR_IMAGE")]
    pub injector_image: Option<String>,
    /// Pull policy of the injector image [default: IfNotPresent].
    #[arg(long, env = "ORCHARD_INJECTOR_PULL_POLICY")]
    pub injector_pull_policy: Option<String>,
    /// Pull policy of sandbox images [default: IfNotPresent].
    #[arg(long, env = "ORCHARD_KUBE_IMAGE_PULL_POLICY")]
    #[serde(rename = "image_pull_policy")]
    pub kube_image_pull_policy: Option<String>,
    /// The agents' port in their pods [default: 7070].
    #[arg(long, env = "ORCHARD_KUBE_AGENT_PORT")]
    #[serde(rename = "agent_port")]
    pub kube_agent_port: Option<u16>,
    /// Seconds between SIGTERM and SIGKILL when a sandbox pod is deleted [default: 2].
    #[arg(long, env = "ORCHARD_KUBE_GRACE_PERIOD_S")]
    #[serde(rename = "grace_period_s")]
    pub kube_grace_period_s: Option<i64>,
    /// Ephemeral-storage limit of each sandbox pod, like "10Gi" [default: --sandbox-disk,
    /// else none].
    #[arg(long, env = "ORCHARD_KUBE_EPHEMERAL_STORAGE")]
    #[serde(rename = "ephemeral_storage")]
    pub kube_ephemeral_storage: Option<String>,
    /// The injector image carries the harness bundle: publish it in sandboxes
    /// [default: false].
    #[arg(long, env = "ORCHARD_KUBE_HARNESS", num_args = 0..=1, default_missing_value = "true")]
    #[serde(rename = "harness")]
    pub kube_harness: Option<bool>,
    /// A CIDR allowed to reach agents (repeatable; ORCHARD_KUBE_INGRESS_CIDRS takes a
    /// comma-separated list): trainers, or this host when the server runs outside the
    /// cluster [default: none; the orchestrator's pods always may].
    #[arg(long = "kube-ingress-cidr")]
    #[serde(rename = "ingress_cidrs")]
    pub kube_ingress_cidrs: Option<Vec<String>>,
    /// Pod labels `key=value` (any namespace) allowed to reach agents (repeatable;
    /// ORCHARD_KUBE_INGRESS_POD_LABELS takes a comma-separated list).
    #[arg(long = "kube-ingress-pod-label")]
    #[serde(rename = "ingress_pod_labels")]
    pub kube_ingress_pod_labels: Option<Vec<String>>,
    /// RuntimeClass of sandbox pods (gVisor, Kata) [default: the cluster's].
    #[arg(long, env = "ORCHARD_KUBE_RUNTIME_CLASS")]
    #[serde(rename = "runtime_class")]
    pub kube_runtime_class: Option<String>,
    /// A warm pool, `IMAGE=N`: N pods of IMAGE kept started with their agent ready, so
    /// a create of IMAGE with the default CPU and memory and no extra environment is a
    /// claim, not a pod start (repeatable; ORCHARD_KUBE_WARM_POOLS takes a
    /// comma-separated list) [default: none].
    #[arg(long = "kube-warm-pool")]
    #[serde(rename = "warm_pools")]
    pub kube_warm_pools: Option<Vec<String>>,
    /// Node selector of sandbox pods (the file only: a table has no flag).
    #[arg(skip)]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Extra annotations on sandbox pods (the file only).
    #[arg(skip)]
    pub pod_annotations: Option<BTreeMap<String, String>>,
}

/// `IMAGE=N` as (normalised image, N).
fn parse_pool(text: &str) -> Result<(String, usize), String> {
    let bad = |why: &str| {
        format!("kube warm pool {text:?}: {why} (use IMAGE=N, e.g. python:3.11-slim=4)")
    };
    let (image, n) = text.rsplit_once('=').ok_or_else(|| bad("no =N"))?;
    let n: usize = n.trim().parse().map_err(|_| bad("N is not a number"))?;
    if n > 1000 {
        return Err(bad("at most 1000 pods per pool"));
    }
    let image = crate::image::Reference::parse(image.trim())
        .map_err(|e| bad(&e.to_string()))?
        .to_string();
    Ok((image, n))
}

impl KubeConfig {
    /// The layered settings (flags, environment, file) over the defaults.
    pub fn resolve(s: &KubeArgs) -> Result<KubeConfig, String> {
        let d = KubeConfig::default();
        let policy = |v: &Option<String>, what: &str, default: String| match v.as_deref() {
            None => Ok(default),
            Some(p @ ("Always" | "IfNotPresent" | "Never")) => Ok(p.to_string()),
            Some(p) => Err(format!("{what} {p:?}: use Always, IfNotPresent or Never")),
        };
        let ingress_pod_labels = s
            .kube_ingress_pod_labels
            .iter()
            .flatten()
            .map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| format!("kube ingress pod label {l:?}: use key=value"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ingress_cidrs = s.kube_ingress_cidrs.clone().unwrap_or_default();
        for c in &ingress_cidrs {
            let ok = c.split_once('/').is_some_and(|(ip, len)| {
                ip.parse::<std::net::IpAddr>().is_ok() && len.parse::<u8>().is_ok_and(|l| l <= 128)
            });
            if !ok {
                return Err(format!(
                    "kube ingress CIDR {c:?}: use ADDRESS/LENGTH, e.g. 10.0.0.0/8"
                ));
            }
        }
        let namespace = s.namespace.clone().unwrap_or(d.namespace);
        if !crate::backend::valid_id(&namespace) || namespace.contains(['_', '.']) {
            return Err(format!(
                "namespace {namespace:?} is not a valid namespace name"
            ));
        }
        let grace_period_s = s.kube_grace_period_s.unwrap_or(d.grace_period_s);
        if grace_period_s < 0 {
            return Err("kube grace period must be 0 or more seconds".into());
        }
        let warm_pools = s
            .kube_warm_pools
            .iter()
            .flatten()
            .map(|p| parse_pool(p))
            .collect::<Result<Vec<_>, _>>()?;
        let agent_port = s.kube_agent_port.unwrap_or(d.agent_port);
        if agent_port == 0 {
            return Err("the kube agent port must not be 0".into());
        }
        Ok(KubeConfig {
            kubeconfig: s.kubeconfig.clone(),
            namespace,
            injector_image: s.injector_image.clone().unwrap_or(d.injector_image),
            injector_pull_policy: policy(
                &s.injector_pull_policy,
                "injector pull policy",
                d.injector_pull_policy,
            )?,
            image_pull_policy: policy(
                &s.kube_image_pull_policy,
                "image pull policy",
                d.image_pull_policy,
            )?,
            agent_port,
            grace_period_s,
            ephemeral_storage: s.kube_ephemeral_storage.clone(),
            harness: s.kube_harness.unwrap_or(d.harness),
            ingress_cidrs,
            ingress_pod_labels,
            runtime_class: s.kube_runtime_class.clone(),
            node_selector: s.node_selector.clone().unwrap_or_default(),
            pod_annotations: s.pod_annotations.clone().unwrap_or_default(),
            warm_pools,
            ..d
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let file: KubeArgs = toml::from_str(
            "namespace = \"from-file\"\ninjector_image = \"file/img:1\"\ningress_cidrs = [\"10.0.0.0/8\"]",
        )
        .unwrap();
        let mut args = KubeArgs {
            namespace: Some("from-flag".into()),
            ..Default::default()
        };
        args.merge(file);
        let c = KubeConfig::resolve(&args).unwrap();
        assert_eq!(c.namespace, "from-flag");
        assert_eq!(c.injector_image, "file/img:1");
        assert_eq!(c.ingress_cidrs, vec!["10.0.0.0/8".to_string()]);
        assert_eq!(c.agent_port, DEFAULT_AGENT_PORT);
        let d = KubeConfig::resolve(&KubeArgs::default()).unwrap();
        assert_eq!(d, KubeConfig::default());
    }

    #[test]
    fn warm_pools_name_a_normalised_image_and_a_count() {
        let args = KubeArgs {
            kube_warm_pools: Some(vec!["python:3.11-slim=4".into(), "busybox=0".into()]),
            ..Default::default()
        };
        let c = KubeConfig::resolve(&args).unwrap();
        assert_eq!(
            c.warm_pools,
            vec![
                ("docker.io/library/python:3.11-slim".to_string(), 4),
                ("docker.io/library/busybox:latest".to_string(), 0)
            ]
        );
        for bad in ["python", "python=x", "python=5000", "=3"] {
            let args = KubeArgs {
                kube_warm_pools: Some(vec![bad.into()]),
                ..Default::default()
            };
            assert!(
                KubeConfig::resolve(&args)
                    .unwrap_err()
                    .contains("warm pool"),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused_with_the_setting_named() {
        let bad = |args: KubeArgs| KubeConfig::resolve(&args).unwrap_err();
        assert!(bad(KubeArgs {
            kube_ingress_cidrs: Some(vec!["10.0.0.0".into()]),
            ..Default::default()
        })
        .contains("CIDR"));
        assert!(bad(KubeArgs {
            injector_pull_policy: Some("sometimes".into()),
            ..Default::default()
        })
        .contains("pull policy"));
        assert!(bad(KubeArgs {
            namespace: Some("Bad_NS".into()),
            ..Default::default()
        })
        .contains("namespace"));
        assert!(bad(KubeArgs {
            kube_ingress_pod_labels: Some(vec!["role".into()]),
            ..Default::default()
        })
        .contains("key=value"));
    }
}
