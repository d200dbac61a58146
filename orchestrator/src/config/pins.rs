//! Pins of what an operator sees of the settings: for every setting, its flag, its
//! `ORCHARD_*` variable and its TOML key give the same resolved value; the precedence
//! flags > environment > file > defaults; the defaults; the error a bad value gives,
//! whichever way it came; and `orchard serve --help` (`serve-help.txt`).
//!
//! No test here changes the process's environment: a test's variables are given as a
//! map, and clap's `env` attributes are played by flags parsed beneath the command
//! line's ([`parse`]).

use std::collections::HashMap;

use clap::parser::ValueSource;
use clap::{Args, Command, FromArgMatches};

use super::*;

/// Why a resolve failed: clap refused a flag or a variable, or the resolve refused.
#[derive(Debug)]
enum Failure {
    Clap(clap::error::ErrorKind, String),
    Config(ConfigError),
}

/// `orchard serve`'s arguments, reading no variable of the process.
fn serve_command() -> Command {
    ServeArgs::augment_args(Command::new("serve"))
        .mut_args(|a| a.env(clap::builder::Resettable::Reset))
}

/// `orchard serve ARGV` in an environment of `env` alone. What clap's `env` attribute
/// does (the variable's value for an argument the command line leaves out) is done by
/// appending `--flag=VALUE` for such arguments, so a bad value fails as it would.
fn parse(argv: &[String], env: &HashMap<String, String>) -> Result<ServeArgs, clap::Error> {
    let named = ServeArgs::augment_args(Command::new("serve"));
    let mut line: Vec<String> = vec!["serve".into()];
    line.extend(argv.iter().cloned());
    let given = serve_command().try_get_matches_from(&line)?;
    for arg in named.get_arguments() {
        let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let Some(value) = var.to_str().and_then(|v| env.get(v)) else {
            continue;
        };
        if given.value_source(arg.get_id().as_str()) != Some(ValueSource::CommandLine) {
            line.push(format!("--{long}={value}"));
        }
    }
    let matches = serve_command().try_get_matches_from(&line)?;
    ServeArgs::from_arg_matches(&matches)
}

/// Resolves `orchard serve ARGV` with `env` as its environment and, when given, `file`
/// as its configuration file.
fn resolve(argv: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Result<Config, Failure> {
    let dir = tempfile::tempdir().unwrap();
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    if let Some(text) = file {
        let path = dir.path().join("orchard.toml");
        std::fs::write(&path, text).unwrap();
        argv.extend(["--config".to_string(), path.display().to_string()]);
    }
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = parse(&argv, &env).map_err(|e| Failure::Clap(e.kind(), e.to_string()))?;
    Config::resolve_in(args, &Env::from(env)).map_err(Failure::Config)
}

fn ok(argv: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Config {
    resolve(argv, env, file).unwrap_or_else(|e| panic!("{argv:?} {env:?} {file:?}: {e:?}"))
}

fn kube(c: &Config) -> &crate::backend::kubernetes::KubeConfig {
    match &c.backend {
        BackendChoice::Kubernetes(k) => k,
        other => panic!("not kubernetes: {other:?}"),
    }
}

/// One setting: its flags (as given on the command line), its variable and value, its
/// file text, what all three need besides (`with`, on the command line), and the part
/// of the resolved configuration it sets.
struct Row {
    flags: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
    file: Option<&'static str>,
    with: &'static [&'static str],
    probe: fn(&Config) -> String,
}

const fn row(
    flags: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
    file: Option<&'static str>,
    probe: fn(&Config) -> String,
) -> Row {
    Row {
        flags,
        env,
        file,
        with: &[],
        probe,
    }
}

/// Every setting of the top level that the resolved configuration holds.
const ROWS: &[Row] = &[
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
        |c| format!("{:?}", c.data_dir),
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
        |c| format!("{:?}", c.policy.ready_timeout),
    ),
    row(
        &["--ttl-s", "42"],
        Some(("ORCHARD_TTL_S", "42")),
        Some("ttl_s = 42"),
        |c| format!("{:?}", c.policy.default_ttl),
    ),
    row(
        &["--ttl-s", "0"],
        Some(("ORCHARD_TTL_S", "0")),
        Some("ttl_s = 0"),
        |c| format!("{:?}", c.policy.default_ttl),
    ),
    row(
        &["--heartbeat-timeout-s", "42"],
        Some(("ORCHARD_HEARTBEAT_TIMEOUT_S", "42")),
        Some("heartbeat_timeout_s = 42"),
        |c| format!("{:?}", c.policy.heartbeat_timeout),
    ),
    row(
        &["--policy-interval-ms", "42"],
        Some(("ORCHARD_POLICY_INTERVAL_MS", "42")),
        Some("policy_interval_ms = 42"),
        |c| format!("{:?}", c.policy.interval),
    ),
    row(
        &["--policy-interval-ms", "1"],
        Some(("ORCHARD_POLICY_INTERVAL_MS", "1")),
        Some("policy_interval_ms = 1"),
        |c| format!("{:?}", c.policy.interval),
    ),
    row(
        &["--reconcile-interval-s", "42"],
        Some(("ORCHARD_RECONCILE_INTERVAL_S", "42")),
        Some("reconcile_interval_s = 42"),
        |c| format!("{:?}", c.policy.reconcile_interval),
    ),
    row(
        &["--worker-lease-s", "0"],
        Some(("ORCHARD_WORKER_LEASE_S", "0")),
        Some("worker_lease_s = 0"),
        |c| format!("{:?}", c.policy.worker_lease),
    ),
    row(
        &["--worker-lease-s", "42"],
        Some(("ORCHARD_WORKER_LEASE_S", "42")),
        Some("worker_lease_s = 42"),
        |c| format!("{:?}", c.policy.worker_lease),
    ),
    row(
        &["--job-retention-s", "42"],
        Some(("ORCHARD_JOB_RETENTION_S", "42")),
        Some("job_retention_s = 42"),
        |c| format!("{:?}", c.policy.job_retention),
    ),
    row(
        &["--exec-timeout-s", "42"],
        Some(("ORCHARD_EXEC_TIMEOUT_S", "42")),
        Some("exec_timeout_s = 42"),
        |c| format!("{:?}", c.policy.exec_timeout),
    ),
    row(
        &["--heartbeat-reaping", "false"],
        Some(("ORCHARD_HEARTBEAT_REAPING", "false")),
        Some("heartbeat_reaping = false"),
        |c| c.policy.heartbeat_reaping.to_string(),
    ),
    row(
        &["--default-cpu", "2500m"],
        Some(("ORCHARD_DEFAULT_CPU", "2500m")),
        Some("default_cpu = \"2500m\""),
        |c| c.defaults.cpu.clone(),
    ),
    row(
        &["--default-memory", "1Gi"],
        Some(("ORCHARD_DEFAULT_MEMORY", "1Gi")),
        Some("default_memory = \"1Gi\""),
        |c| c.defaults.memory.clone(),
    ),
    row(
        &["--default-working-dir", "/w"],
        Some(("ORCHARD_DEFAULT_WORKING_DIR", "/w")),
        Some("default_working_dir = \"/w\""),
        |c| c.defaults.working_dir.clone(),
    ),
    row(
        &["--job-output-cap-bytes", "4096"],
        Some(("ORCHARD_JOB_OUTPUT_CAP_BYTES", "4096")),
        Some("job_output_cap_bytes = 4096"),
        |c| c.job_output_cap.to_string(),
    ),
    row(
        &["--job-output-cap-bytes", "5"],
        Some(("ORCHARD_JOB_OUTPUT_CAP_BYTES", "5")),
        Some("job_output_cap_bytes = 5"),
        |c| c.job_output_cap.to_string(),
    ),
    row(
        &["--job-output-budget-bytes", "4096"],
        Some(("ORCHARD_JOB_OUTPUT_BUDGET_BYTES", "4096")),
        Some("job_output_budget_bytes = 4096"),
        |c| c.job_output_budget.to_string(),
    ),
    row(
        &["--max-sandboxes-per-key", "7"],
        Some(("ORCHARD_MAX_SANDBOXES_PER_KEY", "7")),
        Some("max_sandboxes_per_key = 7"),
        |c| c.quotas.max_sandboxes.to_string(),
    ),
    row(
        &["--creates-per-minute-per-key", "7"],
        Some(("ORCHARD_CREATES_PER_MINUTE_PER_KEY", "7")),
        Some("creates_per_minute_per_key = 7"),
        |c| c.quotas.creates_per_minute.to_string(),
    ),
    row(
        &["--snapshot-bytes-per-key", "32Mi"],
        Some(("ORCHARD_SNAPSHOT_BYTES_PER_KEY", "32Mi")),
        Some("snapshot_bytes_per_key = \"32Mi\""),
        |c| c.quotas.snapshot_bytes.to_string(),
    ),
    row(
        &["--snapshot-bytes-total", "1Gi"],
        Some(("ORCHARD_SNAPSHOT_BYTES_TOTAL", "1Gi")),
        Some("snapshot_bytes_total = \"1Gi\""),
        |c| format!("{:?}", c.quotas.snapshot_bytes_total),
    ),
    row(
        &["--snapshot-min-free", "10%"],
        Some(("ORCHARD_SNAPSHOT_MIN_FREE", "10%")),
        Some("snapshot_min_free = \"10%\""),
        |c| format!("{:?}", c.quotas.snapshot_min_free),
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
        |c| c.max_concurrent_creates.to_string(),
    ),
    row(
        &["--max-concurrent-creates", "0"],
        Some(("ORCHARD_MAX_CONCURRENT_CREATES", "0")),
        Some("max_concurrent_creates = 0"),
        |c| c.max_concurrent_creates.to_string(),
    ),
    row(
        &["--create-queue", "7"],
        Some(("ORCHARD_CREATE_QUEUE", "7")),
        Some("create_queue = 7"),
        |c| c.create_queue.to_string(),
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
const REDIS_ROWS: &[Row] = &[
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
const KUBE_ROWS: &[Row] = &[
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

/// Each setting's flag, variable and file key give one value, which is not the default.
#[test]
fn every_setting_resolves_the_same_from_its_flag_its_variable_and_its_file_key() {
    let mut rows: Vec<&Row> = ROWS.iter().collect();
    if cfg!(feature = "redis") {
        rows.extend(REDIS_ROWS);
    }
    if cfg!(feature = "kubernetes") {
        rows.extend(KUBE_ROWS);
    }
    for row in rows {
        let name = row.flags[0];
        let probe = |argv: &[&str], env: &[(&str, &str)], file: Option<&str>| {
            let mut line: Vec<&str> = row.with.to_vec();
            line.extend_from_slice(argv);
            (row.probe)(&ok(&line, env, file))
        };
        let by_flag = probe(row.flags, &[], None);
        assert_ne!(by_flag, probe(&[], &[], None), "{name}: the default");
        if let Some((var, value)) = row.env {
            assert_eq!(probe(&[], &[(var, value)], None), by_flag, "{name}: {var}");
        }
        if let Some(text) = row.file {
            assert_eq!(probe(&[], &[], Some(text)), by_flag, "{name}: {text}");
        }
    }
}

/// A flag wins over its variable, the variable over the file, the file over the
/// default; the file itself may be named by a variable.
#[test]
fn flags_beat_variables_beat_the_file_beat_defaults() {
    let ready = |argv: &[&str], env: &[(&str, &str)], file: Option<&str>| {
        ok(argv, env, file).policy.ready_timeout.as_secs()
    };
    let env = [("ORCHARD_READY_TIMEOUT_S", "2")];
    let file = Some("ready_timeout_s = 3");
    assert_eq!(ready(&["--ready-timeout-s", "1"], &env, file), 1);
    assert_eq!(ready(&[], &env, file), 2);
    assert_eq!(ready(&[], &[], file), 3);
    assert_eq!(ready(&[], &[], None), 300);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("by-env.toml");
    std::fs::write(&path, "listen = \"0.0.0.0:7\"").unwrap();
    let c = ok(&[], &[("ORCHARD_CONFIG", path.to_str().unwrap())], None);
    assert_eq!(c.listen, "0.0.0.0:7", "ORCHARD_CONFIG names the file");

    // Lists: the repeated flag, else the variable (ORCHARD_API_KEYS, else API_KEYS),
    // else the file. A variable that is set but holds no key counts as set.
    let keys = |argv: &[&str], env: &[(&str, &str)], file: Option<&str>| {
        ok(argv, env, file).api_keys.join(",")
    };
    let env = [("ORCHARD_API_KEYS", "e1"), ("API_KEYS", "o1")];
    let file = Some("api_keys = [\"f1\"]");
    assert_eq!(keys(&["--api-key", "a1"], &env, file), "a1");
    assert_eq!(keys(&[], &env, file), "e1");
    assert_eq!(keys(&[], &env[1..], file), "o1");
    assert_eq!(keys(&[], &[("ORCHARD_API_KEYS", " ,")], file), "f1");
    assert_eq!(
        keys(&[], &[("ORCHARD_API_KEYS", ""), ("API_KEYS", "o1")], file),
        "f1"
    );
    assert_eq!(keys(&[], &[], file), "f1");
    assert_eq!(keys(&[], &[], None), "");

    // Registry credentials merge per host, the config.json lowest, then the file,
    // the variable and the flags.
    let docker = dir.path().join("config.json");
    // base64("d:docker") for one.io and two.io
    std::fs::write(
        &docker,
        r#"{"auths": {"one.io": {"auth": "ZDpkb2NrZXI="}, "two.io": {"auth": "ZDpkb2NrZXI="}, "three.io": {"auth": "ZDpkb2NrZXI="}, "four.io": {"auth": "ZDpkb2NrZXI="}}}"#,
    )
    .unwrap();
    let c = ok(
        &[
            "--registry-config",
            docker.to_str().unwrap(),
            "--registry-auth",
            "four.io=f:flag",
        ],
        &[("ORCHARD_REGISTRY_AUTH", "three.io=e:env four.io=e:env")],
        Some("registry_auth = [\"two.io=t:file\", \"three.io=t:file\", \"four.io=t:file\"]"),
    );
    let creds = &c.registry.credentials;
    assert_eq!(creds["one.io"], Credentials::basic("d", "docker"));
    assert_eq!(creds["two.io"], Credentials::basic("t", "file"));
    assert_eq!(creds["three.io"], Credentials::basic("e", "env"));
    assert_eq!(creds["four.io"], Credentials::basic("f", "flag"));
    assert_eq!(
        c.registry.credential_sources[1..],
        [
            "registry_auth in the config file",
            "ORCHARD_REGISTRY_AUTH",
            "--registry-auth"
        ]
    );
}

#[test]
#[cfg(feature = "kubernetes")]
fn kubernetes_settings_layer_like_the_others_and_its_maps_come_from_the_file() {
    let file = Some(
        "[kubernetes]\nnamespace = \"from-file\"\ningress_cidrs = [\"10.0.0.0/8\"]\n\
         node_selector = { pool = \"sandboxes\" }\npod_annotations = { a = \"b\" }\n",
    );
    let with = ["--backend", "kubernetes"];
    let c = ok(&with, &[("ORCHARD_NAMESPACE", "from-env")], file);
    let k = kube(&c);
    assert_eq!(k.namespace, "from-env");
    assert_eq!(k.ingress_cidrs, ["10.0.0.0/8"]);
    assert_eq!(k.node_selector["pool"], "sandboxes");
    assert_eq!(k.pod_annotations["a"], "b");
    let c = ok(
        &[
            "--backend",
            "kubernetes",
            "--kube-ingress-cidr",
            "1.2.3.0/24",
        ],
        &[("ORCHARD_KUBE_INGRESS_CIDRS", "5.0.0.0/8")],
        file,
    );
    assert_eq!(kube(&c).ingress_cidrs, ["1.2.3.0/24"]);
    let c = ok(&with, &[("ORCHARD_KUBE_INGRESS_CIDRS", "5.0.0.0/8")], file);
    assert_eq!(kube(&c).ingress_cidrs, ["5.0.0.0/8"]);
    let c = ok(&with, &[], None);
    assert_eq!(
        *kube(&c),
        crate::backend::kubernetes::KubeConfig::default(),
        "the defaults"
    );
}

/// What nothing set resolves to.
#[test]
fn the_defaults() {
    let c = ok(&[], &[], None);
    assert_eq!(c.backend, BackendChoice::Local);
    assert_eq!(c.state, StateChoice::Memory);
    assert_eq!(c.listen, "127.0.0.1:8000");
    assert!(c.api_keys.is_empty() && c.operator_keys.is_empty() && !c.no_auth);
    assert_eq!(c.harness, None);
    assert_eq!(c.ready_file, None);
    assert_eq!(
        format!("{:?}", c.policy),
        format!("{:?}", crate::service::Policy::default())
    );
    assert_eq!(c.defaults, SandboxDefaults::default());
    assert_eq!(c.create_queue, 4096);
    assert_eq!(c.job_output_cap, DEFAULT_JOB_OUTPUT_CAP);
    assert_eq!(
        c.job_output_budget,
        crate::service::jobs::DEFAULT_OUTPUT_BUDGET
    );
    assert_eq!(c.connections, ConnLimits::default());
    assert_eq!(c.quotas.max_sandboxes, 1024);
    assert_eq!(c.quotas.creates_per_minute, 6000);
    assert_eq!(c.quotas.snapshot_bytes, 20 << 30);
    assert_eq!(c.upload_spool, Budget::Bytes(4 << 30));
    assert!(!c.keep_sandboxes_on_exit && !c.allow_user_namespaces);
    assert!(c.registry_mirrors.is_empty() && c.allow_registries.is_empty());
    assert_eq!(c.egress, crate::egress::EgressPolicy::default());
    assert_eq!(c.log_level, "info");
    let gc = c.registry.gc.unwrap();
    assert_eq!((gc.budget, gc.interval.as_secs()), (Budget::Off, 300));
}

/// `workers`, `latency_slice_us` and `group_nice` are read before the runtime starts:
/// flags and variables only, and no file key.
#[test]
fn the_runtime_settings_are_flags_and_variables() {
    let env: HashMap<String, String> = [
        ("ORCHARD_WORKERS", "3"),
        ("ORCHARD_LATENCY_SLICE_US", "0"),
        ("ORCHARD_GROUP_NICE", "-5"),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    let by_env = parse(&[], &env).unwrap();
    let line: Vec<String> = [
        "--workers",
        "3",
        "--latency-slice-us",
        "0",
        "--group-nice",
        "-5",
    ]
    .map(String::from)
    .to_vec();
    let by_flag = parse(&line, &HashMap::new()).unwrap();
    for a in [by_env, by_flag] {
        assert_eq!(
            (a.workers, a.latency_slice_us, a.group_nice),
            (Some(3), Some(0), Some(-5))
        );
    }
    for key in [
        "workers = 2",
        "latency_slice_us = 5",
        "group_nice = 1",
        "config = \"x\"",
    ] {
        let e = resolve(&[], &[], Some(key)).unwrap_err();
        assert!(
            matches!(e, Failure::Config(ConfigError::Parse { .. })),
            "{key}: {e:?}"
        );
    }
}

/// A bad value fails the same way from its flag, its variable and its file key.
#[test]
fn a_bad_value_gives_the_same_error_from_every_source() {
    // (flag, variable, file, value, TOML value, the message)
    let invalid: &[(&str, &str, &str, &str, &str, &str)] = &[
        (
            "--ready-timeout-s",
            "ORCHARD_READY_TIMEOUT_S",
            "ready_timeout_s",
            "0",
            "0",
            "ready_timeout_s must be at least 1",
        ),
        (
            "--exec-timeout-s",
            "ORCHARD_EXEC_TIMEOUT_S",
            "exec_timeout_s",
            "0",
            "0",
            "exec_timeout_s must be at least 1",
        ),
        (
            "--image-gc-interval-s",
            "ORCHARD_IMAGE_GC_INTERVAL_S",
            "image_gc_interval_s",
            "0",
            "0",
            "image_gc_interval_s must be at least 1",
        ),
        (
            "--default-cpu",
            "ORCHARD_DEFAULT_CPU",
            "default_cpu",
            "lots",
            "\"lots\"",
            "default_cpu: ",
        ),
        (
            "--default-memory",
            "ORCHARD_DEFAULT_MEMORY",
            "default_memory",
            "16 gigs",
            "\"16 gigs\"",
            "default_memory: ",
        ),
        (
            "--default-working-dir",
            "ORCHARD_DEFAULT_WORKING_DIR",
            "default_working_dir",
            "w",
            "\"w\"",
            "default_working_dir \"w\": must be an absolute path",
        ),
        (
            "--snapshot-bytes-per-key",
            "ORCHARD_SNAPSHOT_BYTES_PER_KEY",
            "snapshot_bytes_per_key",
            "x",
            "\"x\"",
            "snapshot_bytes_per_key: ",
        ),
        (
            "--snapshot-bytes-total",
            "ORCHARD_SNAPSHOT_BYTES_TOTAL",
            "snapshot_bytes_total",
            "x",
            "\"x\"",
            "snapshot_bytes_total \"x\": use 0 (off)",
        ),
        (
            "--snapshot-min-free",
            "ORCHARD_SNAPSHOT_MIN_FREE",
            "snapshot_min_free",
            "200%",
            "\"200%\"",
            "snapshot_min_free \"200%\": a percentage must be above 0 and at most 100",
        ),
        (
            "--upload-spool-bytes",
            "ORCHARD_UPLOAD_SPOOL_BYTES",
            "upload_spool_bytes",
            "x",
            "\"x\"",
            "upload_spool_bytes \"x\"",
        ),
        (
            "--sandbox-disk",
            "ORCHARD_SANDBOX_DISK",
            "sandbox_disk",
            "lots",
            "\"lots\"",
            "sandbox_disk: ",
        ),
        (
            "--image-disk-budget",
            "ORCHARD_IMAGE_DISK_BUDGET",
            "image_disk_budget",
            "x",
            "\"x\"",
            "image disk budget \"x\"",
        ),
        (
            "--backend",
            "ORCHARD_BACKEND",
            "backend",
            "docker",
            "\"docker\"",
            "backend \"docker\": use local or kubernetes",
        ),
        (
            "--state",
            "ORCHARD_STATE",
            "state",
            "postgres://x",
            "\"postgres://x\"",
            "state \"postgres://x\": use `memory` or a Redis URL such as redis://127.0.0.1:6379",
        ),
        (
            "--state-prefix",
            "ORCHARD_STATE_PREFIX",
            "state_prefix",
            "a b",
            "\"a b\"",
            "state_prefix \"a b\": must be a non-empty word",
        ),
        (
            "--registry-mirror",
            "",
            "registry_mirrors",
            "nope",
            "[\"nope\"]",
            "registry mirror \"nope\": use REGISTRY=URL, e.g. docker.io=http://127.0.0.1:5000",
        ),
        (
            "--egress-allow-cidr",
            "ORCHARD_EGRESS_ALLOW_CIDRS",
            "egress_allow_cidrs",
            "nope",
            "[\"nope\"]",
            "egress_allow_cidrs: ",
        ),
    ];
    for &(flag, var, key, value, toml, message) in invalid {
        let mut errors = vec![resolve(&[flag, value], &[], None)];
        if !var.is_empty() {
            errors.push(resolve(&[], &[(var, value)], None));
        }
        errors.push(resolve(&[], &[], Some(&format!("{key} = {toml}"))));
        let texts: Vec<String> = errors
            .into_iter()
            .map(|e| match e {
                Err(Failure::Config(ConfigError::Invalid(m))) => m,
                other => panic!("{flag}: {other:?}"),
            })
            .collect();
        assert!(texts[0].starts_with(message), "{flag}: {}", texts[0]);
        assert!(texts.iter().all(|t| *t == texts[0]), "{flag}: {texts:?}");
    }
    // Values clap parses are refused by clap, from the flag and the variable alike,
    // and by the file's parser from the file.
    let typed: &[(&str, &str, &str, &str, &str)] = &[
        ("--ready-timeout-s", "ORCHARD_READY_TIMEOUT_S", "ready_timeout_s", "x",
         "invalid value 'x' for '--ready-timeout-s <READY_TIMEOUT_S>': invalid digit found in string"),
        ("--no-auth", "ORCHARD_NO_AUTH", "no_auth", "maybe",
         "invalid value 'maybe' for '--no-auth [<NO_AUTH>]'"),
        ("--kube-agent-port", "ORCHARD_KUBE_AGENT_PORT", "kubernetes.agent_port", "70000",
         "invalid value '70000' for '--kube-agent-port <KUBE_AGENT_PORT>': 70000 is not in 0..=65535"),
        ("--group-nice", "ORCHARD_GROUP_NICE", "", "30",
         "invalid value '30' for '--group-nice <GROUP_NICE>': 30 is not in -20..=19"),
        ("--max-connections", "ORCHARD_MAX_CONNECTIONS", "max_connections", "-1",
         "invalid value '-1' for '--max-connections <MAX_CONNECTIONS>'"),
    ];
    for &(flag, var, key, value, message) in typed {
        let by_flag = format!("{flag}={value}");
        for e in [
            resolve(&[&by_flag], &[], None),
            resolve(&[], &[(var, value)], None),
        ] {
            match e {
                Err(Failure::Clap(kind, text)) => {
                    use clap::error::ErrorKind;
                    assert!(
                        matches!(kind, ErrorKind::ValueValidation | ErrorKind::InvalidValue),
                        "{flag}: {kind:?}"
                    );
                    assert!(text.contains(message), "{flag}: {text}");
                }
                other => panic!("{flag}: {other:?}"),
            }
        }
        if key.is_empty() {
            continue;
        }
        let text = match key.split_once('.') {
            Some((table, k)) => format!("[{table}]\n{k} = \"{value}\""),
            None => format!("{key} = \"{value}\""),
        };
        match resolve(&[], &[], Some(&text)) {
            Err(Failure::Config(ConfigError::Parse { message, .. })) => {
                assert!(message.contains("invalid type"), "{key}: {message}")
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    // The file: unknown keys (also in [kubernetes]), a file that is not there.
    for text in [
        "lisen = \"x\"",
        "[kubernetes]\nagent_prot = 1",
        "[kubernetes]\nkube_agent_port = 1",
    ] {
        match resolve(&[], &[], Some(text)) {
            Err(Failure::Config(ConfigError::Parse { message, .. })) => {
                assert!(message.contains("unknown field"), "{text}: {message}")
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let e = resolve(&["--config", "/nonexistent/orchard.toml"], &[], None).unwrap_err();
    assert!(
        matches!(e, Failure::Config(ConfigError::Read { .. })),
        "{e:?}"
    );
    let e = resolve(
        &[],
        &[("ORCHARD_REGISTRY_CONFIG", "/nonexistent/c.json")],
        None,
    );
    assert!(
        matches!(e, Err(Failure::Config(ConfigError::Credentials(_)))),
        "{e:?}"
    );
    let e = resolve(&["--registry-auth", "nohost"], &[], None);
    assert!(
        matches!(e, Err(Failure::Config(ConfigError::Credentials(_)))),
        "{e:?}"
    );
}

#[test]
#[cfg(feature = "kubernetes")]
fn a_bad_kubernetes_value_gives_the_same_error_from_every_source() {
    let invalid: &[(&str, &str, &str, &str, &str)] = &[
        (
            "--namespace",
            "ORCHARD_NAMESPACE",
            "namespace = \"Bad_NS\"",
            "Bad_NS",
            "namespace \"Bad_NS\" is not a valid namespace name",
        ),
        (
            "--injector-pull-policy",
            "ORCHARD_INJECTOR_PULL_POLICY",
            "injector_pull_policy = \"Sometimes\"",
            "Sometimes",
            "injector pull policy \"Sometimes\": use Always, IfNotPresent or Never",
        ),
        (
            "--kube-grace-period-s",
            "ORCHARD_KUBE_GRACE_PERIOD_S",
            "grace_period_s = -1",
            "-1",
            "kube grace period must be 0 or more seconds",
        ),
        (
            "--kube-agent-port",
            "ORCHARD_KUBE_AGENT_PORT",
            "agent_port = 0",
            "0",
            "the kube agent port must not be 0",
        ),
        (
            "--kube-ingress-cidr",
            "ORCHARD_KUBE_INGRESS_CIDRS",
            "ingress_cidrs = [\"10.0.0.0\"]",
            "10.0.0.0",
            "kube ingress CIDR \"10.0.0.0\": use ADDRESS/LENGTH, e.g. 10.0.0.0/8",
        ),
        (
            "--kube-ingress-pod-label",
            "ORCHARD_KUBE_INGRESS_POD_LABELS",
            "ingress_pod_labels = [\"role\"]",
            "role",
            "kube ingress pod label \"role\": use key=value",
        ),
        (
            "--kube-warm-pool",
            "ORCHARD_KUBE_WARM_POOLS",
            "warm_pools = [\"python\"]",
            "python",
            "kube warm pool \"python\": no =N (use IMAGE=N, e.g. python:3.11-slim=4)",
        ),
    ];
    for &(flag, var, file, value, message) in invalid {
        let with = "--backend=kubernetes";
        let by_flag = format!("{flag}={value}");
        let file = format!("[kubernetes]\n{file}");
        for e in [
            resolve(&[with, &by_flag], &[], None),
            resolve(&[with], &[(var, value)], None),
            resolve(&[with], &[], Some(&file)),
        ] {
            match e {
                Err(Failure::Config(ConfigError::Invalid(m))) => assert_eq!(m, message),
                other => panic!("{flag}: {other:?}"),
            }
        }
    }
}

/// `orchard serve --help` and `-h` as `serve-help.txt` has them (the variables'
/// current values left out). `ORCHARD_BLESS=1` rewrites the file after a deliberate
/// change.
#[test]
fn the_help_is_unchanged() {
    let help = |flag| {
        // As `main.rs` builds it: the subcommand's about is its variant's doc.
        let serve = ServeArgs::augment_args(Command::new("serve"))
            .about("Serve the REST API (Orchard-compatible routes and /v1)")
            .mut_args(|a| a.hide_env_values(true));
        let e = Command::new("orchard")
            .subcommand(serve)
            .try_get_matches_from(["orchard", "serve", flag])
            .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        e.to_string()
    };
    let help = format!("{}--\n{}", help("--help"), help("-h"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/config/serve-help.txt");
    if std::env::var_os("ORCHARD_BLESS").is_some() {
        std::fs::write(path, &help).unwrap();
    }
    let pinned = std::fs::read_to_string(path).unwrap();
    assert!(
        help == pinned,
        "`orchard serve --help` changed; ORCHARD_BLESS=1 rewrites {path}:\n{help}"
    );
}

// --- Before the refactor: the list variables are read from the process. ---
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
const LISTS: &[&str] = &[
    "ORCHARD_API_KEYS",
    "API_KEYS",
    "ORCHARD_OPERATOR_KEYS",
    "ORCHARD_ALLOW_REGISTRIES",
    "ORCHARD_EGRESS_ALLOW_CIDRS",
    "ORCHARD_REGISTRY_AUTH",
    "ORCHARD_KUBE_INGRESS_CIDRS",
    "ORCHARD_KUBE_INGRESS_POD_LABELS",
    "ORCHARD_KUBE_WARM_POOLS",
];
struct Env(HashMap<String, String>);
impl From<HashMap<String, String>> for Env {
    fn from(m: HashMap<String, String>) -> Env {
        Env(m)
    }
}
impl Config {
    fn resolve_in(args: ServeArgs, env: &Env) -> Result<Config, ConfigError> {
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for v in LISTS {
            match env.0.get(*v) {
                Some(x) => std::env::set_var(v, x),
                None => std::env::remove_var(v),
            }
        }
        let r = Config::resolve(args);
        for v in LISTS {
            std::env::remove_var(v);
        }
        r
    }
}
