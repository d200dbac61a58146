//! The table of every setting: its flag, variable and file text, and what it sets.

use super::*;

/// Every setting of the top level that the resolved configuration holds.
pub(super) const ROWS: &[Row] = &[
    row(
        &["--listen", "0.0.0.0:9"],
        Some(("ORCHARD_LISTEN", "0.0.0.0:9")),
        Some("listen = \"0.0.0.0:9\""),
        |c| c.listen.clone(),
    ),
    row(
        &["--api-key", "k1", "--api-key", "k2"],
        Some(("ORCHARD_API_KEYS", "k1,k2")),
        Some("api_keys = [\"k1\", \"k2\"]"),
        |c| format!("{:?}", c.api_keys),
    ),
    row(
        &["--api-key", "k1", "--api-key", "k2"],
        Some(("API_KEYS", "k1 k2")),
        None,
        |c| format!("{:?}", c.api_keys),
    ),
    row(
        &["--operator-key", "k1", "--operator-key", "k2"],
        Some(("ORCHARD_OPERATOR_KEYS", "k1\nk2")),
        Some("operator_keys = [\"k1\", \"k2\"]"),
        |c| format!("{:?}", c.operator_keys),
    ),
    row(
        &["--no-auth"],
        Some(("ORCHARD_NO_AUTH", "true")),
        Some("no_auth = true"),
        |c| c.no_auth.to_string(),
    ),
    row(&["--no-auth", "true"], None, None, |c| {
        c.no_auth.to_string()
    }),
    row(
        &["--data-dir", "/srv/orchard"],
        Some(("ORCHARD_DATA_DIR", "/srv/orchard")),
        Some("data_dir = \"/srv/orchard\""),
        |c| format!("{:?}", c.service.data_dir),
    ),
    row(
        &["--agent", "/opt/agent"],
        Some(("ORCHARD_AGENT_BIN", "/opt/agent")),
        Some("agent = \"/opt/agent\""),
        |c| format!("{:?}", c.agent),
    ),
    row(
        &["--harness", "/opt/harness"],
        Some(("ORCHARD_HARNESS", "/opt/harness")),
        Some("harness = \"/opt/harness\""),
        |c| format!("{:?}", c.harness),
    ),
    row(
        &["--ready-file", "/run/ready"],
        Some(("ORCHARD_READY_FILE", "/run/ready")),
        Some("ready_file = \"/run/ready\""),
        |c| format!("{:?}", c.ready_file),
    ),
    row(
        &["--ready-timeout-s", "42"],
        Some(("ORCHARD_READY_TIMEOUT_S", "42")),
        Some("ready_timeout_s = 42"),
        |c| format!("{:?}", c.service.policy.ready_timeout),
    ),
    row(
        &["--ttl-s", "42"],
        Some(("ORCHARD_TTL_S", "42")),
        Some("ttl_s = 42"),
        |c| format!("{:?}", c.service.policy.default_ttl),
    ),
    row(
        &["--ttl-s", "0"],
        Some(("ORCHARD_TTL_S", "0")),
        Some("ttl_s = 0"),
        |c| format!("{:?}", c.service.policy.default_ttl),
    ),
    row(
        &["--heartbeat-timeout-s", "42"],
        Some(("ORCHARD_HEARTBEAT_TIMEOUT_S", "42")),
        Some("heartbeat_timeout_s = 42"),
        |c| format!("{:?}", c.service.policy.heartbeat_timeout),
    ),
    row(
        &["--policy-interval-ms", "42"],
        Some(("ORCHARD_POLICY_INTERVAL_MS", "42")),
        Some("policy_interval_ms = 42"),
        |c| format!("{:?}", c.service.policy.interval),
    ),
    row(
        &["--policy-interval-ms", "1"],
        Some(("ORCHARD_POLICY_INTERVAL_MS", "1")),
        Some("policy_interval_ms = 1"),
        |c| format!("{:?}", c.service.policy.interval),
    ),
    row(
        &["--reconcile-interval-s", "42"],
        Some(("ORCHARD_RECONCILE_INTERVAL_S", "42")),
        Some("reconcile_interval_s = 42"),
        |c| format!("{:?}", c.service.policy.reconcile_interval),
    ),
    row(
        &["--worker-lease-s", "0"],
        Some(("ORCHARD_WORKER_LEASE_S", "0")),
        Some("worker_lease_s = 0"),
        |c| format!("{:?}", c.service.policy.worker_lease),
    ),
    row(
        &["--worker-lease-s", "42"],
        Some(("ORCHARD_WORKER_LEASE_S", "42")),
        Some("worker_lease_s = 42"),
        |c| format!("{:?}", c.service.policy.worker_lease),
    ),
    row(
        &["--job-retention-s", "42"],
        Some(("ORCHARD_JOB_RETENTION_S", "42")),
        Some("job_retention_s = 42"),
        |c| format!("{:?}", c.service.policy.job_retention),
    ),
    row(
        &["--exec-timeout-s", "42"],
        Some(("ORCHARD_EXEC_TIMEOUT_S", "42")),
        Some("exec_timeout_s = 42"),
        |c| format!("{:?}", c.service.policy.exec_timeout),
    ),
    row(
        &["--heartbeat-reaping", "false"],
        Some(("ORCHARD_HEARTBEAT_REAPING", "false")),
        Some("heartbeat_reaping = false"),
        |c| c.service.policy.heartbeat_reaping.to_string(),
    ),
    row(
        &["--default-cpu", "2500m"],
        Some(("ORCHARD_DEFAULT_CPU", "2500m")),
        Some("default_cpu = \"2500m\""),
        |c| c.service.defaults.cpu.clone(),
    ),
    row(
        &["--default-memory", "1Gi"],
        Some(("ORCHARD_DEFAULT_MEMORY", "1Gi")),
        Some("default_memory = \"1Gi\""),
        |c| c.service.defaults.memory.clone(),
    ),
    row(
        &["--default-working-dir", "/w"],
        Some(("ORCHARD_DEFAULT_WORKING_DIR", "/w")),
        Some("default_working_dir = \"/w\""),
        |c| c.service.defaults.working_dir.clone(),
    ),
    row(
        &["--job-output-cap-bytes", "4096"],
        Some(("ORCHARD_JOB_OUTPUT_CAP_BYTES", "4096")),
        Some("job_output_cap_bytes = 4096"),
        |c| c.service.job_output_cap.to_string(),
    ),
    row(
        &["--job-output-cap-bytes", "5"],
        Some(("ORCHARD_JOB_OUTPUT_CAP_BYTES", "5")),
        Some("job_output_cap_bytes = 5"),
        |c| c.service.job_output_cap.to_string(),
    ),
    row(
        &["--job-output-budget-bytes", "4096"],
        Some(("ORCHARD_JOB_OUTPUT_BUDGET_BYTES", "4096")),
        Some("job_output_budget_bytes = 4096"),
        |c| c.service.job_output_budget.to_string(),
    ),
    row(
        &["--max-sandboxes-per-key", "7"],
        Some(("ORCHARD_MAX_SANDBOXES_PER_KEY", "7")),
        Some("max_sandboxes_per_key = 7"),
        |c| c.service.quotas.max_sandboxes.to_string(),
    ),
    row(
        &["--creates-per-minute-per-key", "7"],
        Some(("ORCHARD_CREATES_PER_MINUTE_PER_KEY", "7")),
        Some("creates_per_minute_per_key = 7"),
        |c| c.service.quotas.creates_per_minute.to_string(),
    ),
    row(
        &["--snapshot-bytes-per-key", "32Mi"],
        Some(("ORCHARD_SNAPSHOT_BYTES_PER_KEY", "32Mi")),
        Some("snapshot_bytes_per_key = \"32Mi\""),
        |c| c.service.quotas.snapshot_bytes.to_string(),
    ),
    row(
        &["--snapshot-bytes-total", "1Gi"],
        Some(("ORCHARD_SNAPSHOT_BYTES_TOTAL", "1Gi")),
        Some("snapshot_bytes_total = \"1Gi\""),
        |c| format!("{:?}", c.service.quotas.snapshot_bytes_total),
    ),
    row(
        &["--snapshot-min-free", "10%"],
        Some(("ORCHARD_SNAPSHOT_MIN_FREE", "10%")),
        Some("snapshot_min_free = \"10%\""),
        |c| format!("{:?}", c.service.quotas.snapshot_min_free),
    ),
    row(
        &["--sandbox-disk", "64Mi"],
        Some(("ORCHARD_SANDBOX_DISK", "64Mi")),
        Some("sandbox_disk = \"64Mi\""),
        |c| format!("{:?}", c.sandbox_disk),
    ),
    row(
        &["--sandbox-disk", "none"],
        Some(("ORCHARD_SANDBOX_DISK", "none")),
        Some("sandbox_disk = \"none\""),
        |c| format!("{:?}", c.sandbox_disk),
    ),
    row(
        &["--sandbox-disk-inodes", "4096"],
        Some(("ORCHARD_SANDBOX_DISK_INODES", "4096")),
        Some("sandbox_disk_inodes = 4096"),
        |c| format!("{:?}", c.sandbox_disk),
    ),
    row(
        &["--max-concurrent-creates", "7"],
        Some(("ORCHARD_MAX_CONCURRENT_CREATES", "7")),
        Some("max_concurrent_creates = 7"),
        |c| c.service.max_concurrent_creates.to_string(),
    ),
    row(
        &["--max-concurrent-creates", "0"],
        Some(("ORCHARD_MAX_CONCURRENT_CREATES", "0")),
        Some("max_concurrent_creates = 0"),
        |c| c.service.max_concurrent_creates.to_string(),
    ),
    row(
        &["--create-queue", "7"],
        Some(("ORCHARD_CREATE_QUEUE", "7")),
        Some("create_queue = 7"),
        |c| c.service.create_queue.to_string(),
    ),
    row(
        &["--max-connections", "7"],
        Some(("ORCHARD_MAX_CONNECTIONS", "7")),
        Some("max_connections = 7"),
        |c| format!("{:?}", c.connections),
    ),
    row(
        &["--max-connections-per-client", "0"],
        Some(("ORCHARD_MAX_CONNECTIONS_PER_CLIENT", "0")),
        Some("max_connections_per_client = 0"),
        |c| format!("{:?}", c.connections),
    ),
    row(
        &["--max-header-bytes", "7000"],
        Some(("ORCHARD_MAX_HEADER_BYTES", "7000")),
        Some("max_header_bytes = 7000"),
        |c| format!("{:?}", c.connections),
    ),
    row(
        &["--header-read-timeout-s", "0"],
        Some(("ORCHARD_HEADER_READ_TIMEOUT_S", "0")),
        Some("header_read_timeout_s = 0"),
        |c| format!("{:?}", c.connections),
    ),
    row(
        &["--body-timeout-s", "7"],
        Some(("ORCHARD_BODY_TIMEOUT_S", "7")),
        Some("body_timeout_s = 7"),
        |c| format!("{:?}", c.connections),
    ),
    row(
        &["--upload-spool-bytes", "1Gi"],
        Some(("ORCHARD_UPLOAD_SPOOL_BYTES", "1Gi")),
        Some("upload_spool_bytes = \"1Gi\""),
        |c| format!("{:?}", c.upload_spool),
    ),
    row(
        &["--keep-sandboxes-on-exit"],
        Some(("ORCHARD_KEEP_SANDBOXES_ON_EXIT", "true")),
        Some("keep_sandboxes_on_exit = true"),
        |c| c.keep_sandboxes_on_exit.to_string(),
    ),
    row(
        &[
            "--registry-mirror",
            "docker.io=http://127.0.0.1:5000",
            "--registry-mirror",
            "ghcr.io=http://m",
        ],
        None,
        Some("registry_mirrors = [\"docker.io=http://127.0.0.1:5000\", \"ghcr.io=http://m\"]"),
        |c| format!("{:?}", c.registry_mirrors),
    ),
    row(
        &[
            "--allow-registry",
            "127.0.0.1",
            "--allow-registry",
            "localhost:5000",
        ],
        Some(("ORCHARD_ALLOW_REGISTRIES", "127.0.0.1, localhost:5000")),
        Some("allow_registries = [\"127.0.0.1\", \"localhost:5000\"]"),
        |c| format!("{:?}", c.allow_registries),
    ),
    row(
        &[
            "--egress-allow-cidr",
            "10.1.0.0/16",
            "--egress-allow-cidr",
            "fd00::/8",
        ],
        Some(("ORCHARD_EGRESS_ALLOW_CIDRS", "10.1.0.0/16 fd00::/8")),
        Some("egress_allow_cidrs = [\"10.1.0.0/16\", \"fd00::/8\"]"),
        |c| format!("{:?}", c.egress),
    ),
    row(
        &["--allow-user-namespaces"],
        Some(("ORCHARD_ALLOW_USER_NAMESPACES", "true")),
        Some("allow_user_namespaces = true"),
        |c| c.allow_user_namespaces.to_string(),
    ),
    row(
        &["--log-level", "debug"],
        Some(("ORCHARD_LOG", "debug")),
        Some("log_level = \"debug\""),
        |c| c.log_level.clone(),
    ),
    row(
        &[
            "--registry-auth",
            "one.io=a:pw1",
            "--registry-auth",
            "two.io=b:p,w=2",
        ],
        Some(("ORCHARD_REGISTRY_AUTH", "one.io=a:pw1\ntwo.io=b:p,w=2")),
        Some("registry_auth = [\"one.io=a:pw1\", \"two.io=b:p,w=2\"]"),
        |c| {
            let mut hosts: Vec<_> = c.registry.credentials.iter().collect();
            hosts.sort_by_key(|(h, _)| h.as_str());
            format!("{hosts:?}")
        },
    ),
    row(
        &["--image-disk-budget", "20Gi"],
        Some(("ORCHARD_IMAGE_DISK_BUDGET", "20Gi")),
        Some("image_disk_budget = \"20Gi\""),
        |c| format!("{:?}", c.registry.gc),
    ),
    row(
        &["--image-gc-interval-s", "60"],
        Some(("ORCHARD_IMAGE_GC_INTERVAL_S", "60")),
        Some("image_gc_interval_s = 60"),
        |c| format!("{:?}", c.registry.gc),
    ),
];

/// The settings of the Redis store.
pub(super) const REDIS_ROWS: &[Row] = &[
    row(
        &["--state", "redis://10.0.0.5:6379/2"],
        Some(("ORCHARD_STATE", "redis://10.0.0.5:6379/2")),
        Some("state = \"redis://10.0.0.5:6379/2\""),
        |c| format!("{:?} {}", c.state, c.keep_sandboxes_on_exit),
    ),
    Row {
        with: &["--state", "redis://h"],
        ..row(
            &["--state-prefix", "team-a"],
            Some(("ORCHARD_STATE_PREFIX", "team-a")),
            Some("state_prefix = \"team-a\""),
            |c| format!("{:?}", c.state),
        )
    },
];

/// A setting of the Kubernetes backend (`--backend kubernetes` given with each).
const fn k(
    flags: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
    file: Option<&'static str>,
    probe: fn(&Config) -> String,
) -> Row {
    Row {
        with: &["--backend", "kubernetes"],
        ..row(flags, env, file, probe)
    }
}

/// Every setting of the Kubernetes backend (the file's `[kubernetes]` table).
pub(super) const KUBE_ROWS: &[Row] = &[
    row(
        &["--backend", "k8s"],
        Some(("ORCHARD_BACKEND", "k8s")),
        Some("backend = \"k8s\""),
        |c| format!("{:?}", c.backend),
    ),
    k(
        &["--kubeconfig", "/k/config"],
        Some(("ORCHARD_KUBECONFIG", "/k/config")),
        Some("[kubernetes]\nkubeconfig = \"/k/config\""),
        |c| format!("{:?}", kube(c).kubeconfig),
    ),
    k(
        &["--namespace", "ns-x"],
        Some(("ORCHARD_NAMESPACE", "ns-x")),
        Some("[kubernetes]\nnamespace = \"ns-x\""),
        |c| kube(c).namespace.clone(),
    ),
    k(
        &["--injector-image", "reg/inj:1"],
        Some(("ORCHARD_INJECTOR_IMAGE", "reg/inj:1")),
        Some("[kubernetes]\ninjector_image = \"reg/inj:1\""),
        |c| kube(c).injector_image.clone(),
    ),
    k(
        &["--injector-pull-policy", "Always"],
        Some(("ORCHARD_INJECTOR_PULL_POLICY", "Always")),
        Some("[kubernetes]\ninjector_pull_policy = \"Always\""),
        |c| kube(c).injector_pull_policy.clone(),
    ),
    k(
        &["--kube-image-pull-policy", "Never"],
        Some(("ORCHARD_KUBE_IMAGE_PULL_POLICY", "Never")),
        Some("[kubernetes]\nimage_pull_policy = \"Never\""),
        |c| kube(c).image_pull_policy.clone(),
    ),
    k(
        &["--kube-agent-port", "7071"],
        Some(("ORCHARD_KUBE_AGENT_PORT", "7071")),
        Some("[kubernetes]\nagent_port = 7071"),
        |c| kube(c).agent_port.to_string(),
    ),
    k(
        &["--kube-grace-period-s", "9"],
        Some(("ORCHARD_KUBE_GRACE_PERIOD_S", "9")),
        Some("[kubernetes]\ngrace_period_s = 9"),
        |c| kube(c).grace_period_s.to_string(),
    ),
    k(
        &["--kube-ephemeral-storage", "1Gi"],
        Some(("ORCHARD_KUBE_EPHEMERAL_STORAGE", "1Gi")),
        Some("[kubernetes]\nephemeral_storage = \"1Gi\""),
        |c| format!("{:?}", kube(c).ephemeral_storage),
    ),
    k(
        &["--kube-harness"],
        Some(("ORCHARD_KUBE_HARNESS", "true")),
        Some("[kubernetes]\nharness = true"),
        |c| kube(c).harness.to_string(),
    ),
    k(
        &["--kube-runtime-class", "gvisor"],
        Some(("ORCHARD_KUBE_RUNTIME_CLASS", "gvisor")),
        Some("[kubernetes]\nruntime_class = \"gvisor\""),
        |c| format!("{:?}", kube(c).runtime_class),
    ),
    k(
        &[
            "--kube-ingress-cidr",
            "10.0.0.0/8",
            "--kube-ingress-cidr",
            "::1/128",
        ],
        Some(("ORCHARD_KUBE_INGRESS_CIDRS", " 10.0.0.0/8 ,::1/128,")),
        Some("[kubernetes]\ningress_cidrs = [\"10.0.0.0/8\", \"::1/128\"]"),
        |c| format!("{:?}", kube(c).ingress_cidrs),
    ),
    k(
        &[
            "--kube-ingress-pod-label",
            "role=trainer",
            "--kube-ingress-pod-label",
            "a=b",
        ],
        Some(("ORCHARD_KUBE_INGRESS_POD_LABELS", "role=trainer,a=b")),
        Some("[kubernetes]\ningress_pod_labels = [\"role=trainer\", \"a=b\"]"),
        |c| format!("{:?}", kube(c).ingress_pod_labels),
    ),
    k(
        &[
            "--kube-warm-pool",
            "python:3.11-slim=4",
            "--kube-warm-pool",
            "busybox=0",
        ],
        Some(("ORCHARD_KUBE_WARM_POOLS", "python:3.11-slim=4, busybox=0")),
        Some("[kubernetes]\nwarm_pools = [\"python:3.11-slim=4\", \"busybox=0\"]"),
        |c| format!("{:?}", kube(c).warm_pools),
    ),
];
