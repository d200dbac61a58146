//! The configuration's own tests: the state and backend choices, the features a
//! build left out, the sandbox disk, quotas and host bounds, the create concurrency and
//! registry credentials. What every setting's sources give is pinned in `pins`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::image::gc::Budget;
use crate::image::Credentials;
use crate::service::SandboxDefaults;

/// An `orchard.toml` holding `toml`, in a new directory that lives as long as the
/// answer's first half.
fn config_file(toml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orchard.toml");
    std::fs::write(&file, toml).unwrap();
    (dir, file)
}

/// The configuration from `file` alone.
fn resolve_file(file: &Path) -> Config {
    Config::resolve(ServeArgs {
        config: Some(file.to_path_buf()),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn key_lists_split_on_commas_spaces_and_newlines() {
    assert_eq!(
        split_keys("k1,k2 k3\nk4,\n  k5\t,,"),
        ["k1", "k2", "k3", "k4", "k5"]
    );
    assert!(split_keys(" , \n").is_empty());
}

#[test]
#[cfg(feature = "redis")]
fn the_state_is_memory_or_a_redis_url_from_the_flag_or_the_file() {
    let (_dir, file) =
        config_file("state = \"redis://10.0.0.5:6379/2\"\nstate_prefix = \"team-a\"\n");
    let c = resolve_file(&file);
    assert_eq!(
        c.state,
        StateChoice::Redis {
            url: "redis://10.0.0.5:6379/2".into(),
            prefix: "team-a".into()
        }
    );
    assert!(
        c.keep_sandboxes_on_exit,
        "a replica's exit keeps the shared sandboxes"
    );
    let c = Config::resolve(ServeArgs {
        config: Some(file),
        state: Some("memory".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.state, StateChoice::Memory, "the flag wins");
    assert!(!c.keep_sandboxes_on_exit);
    assert_eq!(
        Config::resolve(ServeArgs::default()).unwrap().state,
        StateChoice::Memory
    );
    for (state, prefix) in [("postgres://x", None), ("redis://x", Some(""))] {
        let err = Config::resolve(ServeArgs {
            state: Some(state.into()),
            state_prefix: prefix.map(String::from),
            ..Default::default()
        })
        .err()
        .unwrap();
        assert!(matches!(err, ConfigError::Invalid(_)), "{err}");
    }
}

/// A build without a backend's or a store's feature refuses to be configured with
/// it, whichever way it is chosen, and names the feature.
#[test]
fn choosing_a_part_left_out_of_the_build_names_its_feature() {
    let (_dir, file) = config_file("backend = \"k8s\"\nstate = \"redis://10.0.0.5:6379\"\n");
    // Each feature, chosen by its flag and by the file.
    let chosen = [
        (
            "kubernetes",
            cfg!(feature = "kubernetes"),
            [
                ServeArgs {
                    backend: Some("kubernetes".into()),
                    ..Default::default()
                },
                ServeArgs {
                    config: Some(file.clone()),
                    state: Some("memory".into()),
                    ..Default::default()
                },
            ],
        ),
        (
            "redis",
            cfg!(feature = "redis"),
            [
                ServeArgs {
                    state: Some("rediss://cache:6380".into()),
                    ..Default::default()
                },
                ServeArgs {
                    config: Some(file.clone()),
                    backend: Some("local".into()),
                    ..Default::default()
                },
            ],
        ),
    ];
    for (feature, built, args) in chosen
        .into_iter()
        .flat_map(|(f, b, args)| args.map(|a| (f, b, a)))
    {
        match Config::resolve(args) {
            Err(ConfigError::NotCompiled { feature: f, .. }) if !built => {
                assert_eq!(f, feature)
            }
            Err(e) if !built => panic!("not the feature's error: {e}"),
            // With the feature the choice resolves (the cluster or Redis is reached
            // only when serving starts).
            Ok(_) if built => {}
            other => panic!("{feature} built: {built}, got {other:?}"),
        }
    }
    let err = ConfigError::NotCompiled {
        setting: "backend \"kubernetes\"".into(),
        feature: "kubernetes",
        instead: "local",
    };
    assert_eq!(
        err.to_string(),
        "backend \"kubernetes\": this orchard was built without the `kubernetes` feature; \
         build it with `cargo build -p orchard --features kubernetes` (on by default) or \
         use local"
    );
}

#[test]
fn each_sandbox_disk_is_bounded_by_default_and_the_bound_can_be_turned_off() {
    let c = Config::resolve(ServeArgs::default()).unwrap();
    assert_eq!(
        c.sandbox_disk,
        Some(crate::backend::local::disk::DiskLimit {
            bytes: 10 << 30,
            inodes: 1 << 20
        })
    );
    for off in ["0", "none", "None"] {
        let c = Config::resolve(ServeArgs {
            sandbox_disk: Some(off.into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.sandbox_disk, None, "{off}");
    }
    let c = Config::resolve(ServeArgs {
        sandbox_disk: Some("64Mi".into()),
        sandbox_disk_inodes: Some(4096),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        c.sandbox_disk.map(|d| (d.bytes, d.inodes)),
        Some((64 << 20, 4096))
    );
}

#[test]
fn per_key_quotas_are_on_by_default_and_zero_turns_each_off() {
    let c = Config::resolve(ServeArgs::default()).unwrap();
    assert_eq!(
        c.service.quotas.max_sandboxes,
        DEFAULT_MAX_SANDBOXES_PER_KEY
    );
    assert_eq!(
        c.service.quotas.creates_per_minute,
        DEFAULT_CREATES_PER_MINUTE_PER_KEY
    );
    assert_eq!(
        c.service.quotas.snapshot_bytes,
        DEFAULT_SNAPSHOT_BYTES_PER_KEY
    );
    let c = Config::resolve(ServeArgs {
        max_sandboxes_per_key: Some(0),
        creates_per_minute_per_key: Some(0),
        snapshot_bytes_per_key: Some("0".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        (
            c.service.quotas.max_sandboxes,
            c.service.quotas.creates_per_minute,
            c.service.quotas.snapshot_bytes
        ),
        (0, 0, 0)
    );
}

#[test]
fn snapshots_and_upload_spools_are_bounded_on_the_host_by_default() {
    let c = Config::resolve(ServeArgs::default()).unwrap();
    assert_eq!(c.service.quotas.snapshot_bytes_total, Budget::Percent(50.0));
    assert_eq!(c.service.quotas.snapshot_min_free, Budget::Percent(5.0));
    assert_eq!(
        c.upload_spool,
        Budget::Bytes(4 << 30),
        "uploads' spools too"
    );
    let (_dir, file) = config_file("snapshot_bytes_total = \"100Gi\"\nsnapshot_min_free = \"0\"\n");
    let c = resolve_file(&file);
    assert_eq!(
        c.service.quotas.snapshot_bytes_total,
        Budget::Bytes(100 << 30)
    );
    assert_eq!(
        c.service.quotas.snapshot_min_free,
        Budget::Off,
        "0 turns it off"
    );
    let c = Config::resolve(ServeArgs {
        config: Some(file),
        snapshot_bytes_total: Some("1Mi".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        c.service.quotas.snapshot_bytes_total,
        Budget::Bytes(1 << 20),
        "flag wins"
    );
    let e = Config::resolve(ServeArgs {
        snapshot_min_free: Some("lots".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("snapshot_min_free"), "{e}");
}

#[test]
fn concurrent_creates_default_to_two_per_cpu_on_the_local_backend() {
    assert_eq!(default_concurrent_creates(true, 1), 4);
    assert_eq!(default_concurrent_creates(true, 2), 4);
    assert_eq!(default_concurrent_creates(true, 8), 16);
    assert_eq!(default_concurrent_creates(true, 64), 64);
    assert_eq!(default_concurrent_creates(false, 2), 64);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let c = Config::resolve(ServeArgs::default()).unwrap();
    assert_eq!(c.service.max_concurrent_creates, (2 * cpus).clamp(4, 64));
    let c = Config::resolve(ServeArgs {
        max_concurrent_creates: Some(100),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.service.max_concurrent_creates, 100);
}

#[test]
fn bad_defaults_are_refused_at_start() {
    for args in [
        ServeArgs {
            default_cpu: Some("lots".into()),
            ..Default::default()
        },
        ServeArgs {
            default_memory: Some("16 gigs".into()),
            ..Default::default()
        },
        ServeArgs {
            default_working_dir: Some("workspace".into()),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            Config::resolve(args),
            Err(ConfigError::Invalid(_))
        ));
    }
}

#[test]
fn registry_credentials_merge_per_host_and_the_budget_parses() {
    let dir = tempfile::tempdir().unwrap();
    let docker = dir.path().join("config.json");
    // base64("a:from-docker"), base64("b:from-docker")
    std::fs::write(
        &docker,
        r#"{"auths": {"one.io": {"auth": "YTpmcm9tLWRvY2tlcg=="}, "two.io": {"auth": "Yjpmcm9tLWRvY2tlcg=="}}}"#,
    )
    .unwrap();
    let file = dir.path().join("orchard.toml");
    std::fs::write(
        &file,
        format!(
            "registry_config = {:?}\nregistry_auth = [\"two.io=b:from-toml\", \"three.io=c:from-toml\"]\nimage_disk_budget = \"20Gi\"\n",
            docker.display()
        ),
    )
    .unwrap();
    let c = Config::resolve(ServeArgs {
        config: Some(file.clone()),
        registry_auth: Some(vec![Secret("three.io=c:from-flag".into())]),
        image_gc_interval_s: Some(60),
        ..Default::default()
    })
    .unwrap();
    let creds = &c.registry.credentials;
    assert_eq!(creds["one.io"], Credentials::basic("a", "from-docker"));
    assert_eq!(creds["two.io"], Credentials::basic("b", "from-toml"));
    assert_eq!(creds["three.io"], Credentials::basic("c", "from-flag"));
    let gc = c.registry.gc.unwrap();
    assert_eq!(gc.budget, Budget::Bytes(20 << 30));
    assert_eq!(gc.interval, Duration::from_secs(60));
    // Nothing secret in the configuration's debug form.
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("from-") && !debug.contains("Ynpm"),
        "{debug}"
    );
    assert!(!format!("{:?}", Secret("x=u:pw".into())).contains("pw"));
    let missing = Config::resolve(ServeArgs {
        registry_config: Some(dir.path().join("nope.json")),
        ..Default::default()
    })
    .unwrap_err();
    assert!(missing.to_string().contains("nope.json"), "{missing}");
    let off = Config::resolve(ServeArgs {
        registry_config: Some(docker),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        off.registry.gc.unwrap().budget,
        Budget::Off,
        "off by default"
    );
}

#[test]
fn flags_beat_the_file_and_the_file_beats_defaults() {
    let (dir, file) = config_file(
        "listen = \"127.0.0.1:9999\"\nttl_s = 60\nready_timeout_s = 10\napi_keys = [\"k1\"]\n",
    );
    let args = ServeArgs {
        config: Some(file.clone()),
        ready_timeout_s: Some(20),
        ..Default::default()
    };
    let c = Config::resolve(args).unwrap();
    assert_eq!(c.listen, "127.0.0.1:9999", "from the file");
    assert_eq!(
        c.service.policy.ready_timeout,
        Duration::from_secs(20),
        "flag wins"
    );
    assert_eq!(c.service.policy.default_ttl, Some(Duration::from_secs(60)));
    assert_eq!(
        c.service.policy.heartbeat_timeout,
        Duration::from_secs(300),
        "default"
    );
    assert!(!c.no_auth, "auth is on unless disabled explicitly");
    assert_eq!(
        c.service.policy.exec_timeout,
        Duration::from_secs(300),
        "Orchard's"
    );
    assert_eq!(c.service.defaults, SandboxDefaults::default());
    assert_eq!(
        (
            c.service.defaults.cpu.as_str(),
            c.service.defaults.memory.as_str()
        ),
        ("4", "16Gi")
    );
    assert!(c.service.policy.heartbeat_reaping);
    let unknown = dir.path().join("bad.toml");
    std::fs::write(&unknown, "lisen = \"x\"\n").unwrap();
    let e = Config::resolve(ServeArgs {
        config: Some(unknown),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("lisen"), "{e}");
}
