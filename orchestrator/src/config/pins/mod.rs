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
use crate::image::gc::Budget;
use crate::image::Credentials;
use crate::server::listen::ConnLimits;
use crate::service::{SandboxDefaults, DEFAULT_JOB_OUTPUT_CAP};

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

mod errors;
mod rows;

use rows::{KUBE_ROWS, REDIS_ROWS, ROWS};

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
        ok(argv, env, file).service.policy.ready_timeout.as_secs()
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
        format!("{:?}", c.service.policy),
        format!("{:?}", crate::service::Policy::default())
    );
    assert_eq!(c.service.defaults, SandboxDefaults::default());
    assert_eq!(c.service.create_queue, 4096);
    assert_eq!(c.service.job_output_cap, DEFAULT_JOB_OUTPUT_CAP);
    assert_eq!(
        c.service.job_output_budget,
        crate::service::jobs::DEFAULT_OUTPUT_BUDGET
    );
    assert_eq!(c.connections, ConnLimits::default());
    assert_eq!(c.service.quotas.max_sandboxes, 1024);
    assert_eq!(c.service.quotas.creates_per_minute, 6000);
    assert_eq!(c.service.quotas.snapshot_bytes, 20 << 30);
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
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/config/pins/serve-help.txt"
    );
    if std::env::var_os("ORCHARD_BLESS").is_some() {
        std::fs::write(path, &help).unwrap();
    }
    let pinned = std::fs::read_to_string(path).unwrap();
    assert!(
        help == pinned,
        "`orchard serve --help` changed; ORCHARD_BLESS=1 rewrites {path}:\n{help}"
    );
}
