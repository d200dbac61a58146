//! Pins of the errors: a bad value fails the same way, with the same message, from its
//! flag, its variable and its file key; clap's refusals read the same from a flag and
//! a variable; the file's unknown keys and missing files.

use super::*;

/// Values the resolve refuses: (flag, variable, file key, value, TOML value, the
/// message's start).
const INVALID: &[(&str, &str, &str, &str, &str, &str)] = &[
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

/// Values clap refuses: (flag, variable, file key, value, clap's message).
const TYPED: &[(&str, &str, &str, &str, &str)] = &[
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

#[cfg(feature = "kubernetes")]
/// Kubernetes values the resolve refuses: (flag, variable, `[kubernetes]` line, value,
/// the message).
const KUBE_INVALID: &[(&str, &str, &str, &str, &str)] = &[
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

/// A bad value fails the same way from its flag, its variable and its file key.
#[test]
fn a_bad_value_gives_the_same_error_from_every_source() {
    let invalid = INVALID;
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
    let typed = TYPED;
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
    let invalid = KUBE_INVALID;
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
