//! `orchard serve` with registry credentials and an image disk budget: the real binary
//! pulling from a private `docker-registry` (htpasswd) with no credentials, a Docker
//! `config.json` found through `DOCKER_CONFIG`, `--registry-auth`, and
//! `ORCHARD_REGISTRY_AUTH` over a wrong `--registry-config`; a bad config.json stops
//! the start; and an in-process server whose image GC evicts the least recently used
//! unused image after a pull, keeps the image and the mounted layers of a running
//! sandbox, keeps layers shared with a kept image, and counts it all in `/metrics`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchard::image::gc::{Budget, GcPolicy};
use orchard::image::{ImageStore, StoreConfig};
use serde_json::json;

use crate::image_store::budget::layout_of;
use crate::util::registry::{auth_registry, registry, PushFormat, AUTH_PASSWORD, AUTH_USER};
use crate::util::sandbox::agent_binary;
use crate::util::server::{import, Options, ServerProcess, TestServer, KEY};

pub use crate::util::server::pull;

fn docker_config(dir: &Path, host: &str, password: &str) -> std::path::PathBuf {
    crate::image_store::registry_auth::docker_config(dir, host, password)
}

/// A server start: its name, environment, flags, and whether the pull is allowed.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>, bool);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchard_serve_pulls_from_a_private_registry_with_configured_credentials() {
    orchard_test_support::require_runc!();
    let private = auth_registry();
    private.push_image("busybox", "latest", "private/busybox:latest");
    let reference = format!("{}/private/busybox:latest", private.host);
    let scratch = tempfile::tempdir().unwrap();
    let no_docker = scratch.path().join("no-docker");
    let with_docker = scratch.path().join("docker");
    let wrong = scratch.path().join("wrong");
    for dir in [&no_docker, &with_docker, &wrong] {
        std::fs::create_dir_all(dir).unwrap();
    }
    docker_config(&with_docker, &private.host, AUTH_PASSWORD);
    let wrong_config = docker_config(&wrong, &private.host, "not-the-password");
    let flag = format!("{}={AUTH_USER}:{AUTH_PASSWORD}", private.host);
    let no_docker_env = no_docker.to_str().unwrap();
    let cases: [Case; 4] = [
        (
            "none",
            vec![("DOCKER_CONFIG", no_docker_env)],
            vec![],
            false,
        ),
        (
            "docker-config",
            vec![("DOCKER_CONFIG", with_docker.to_str().unwrap())],
            vec![],
            true,
        ),
        (
            "flag",
            vec![("DOCKER_CONFIG", no_docker_env)],
            vec!["--registry-auth", &flag],
            true,
        ),
        (
            "env-over-file",
            vec![
                ("DOCKER_CONFIG", no_docker_env),
                ("ORCHARD_REGISTRY_AUTH", &flag),
            ],
            vec!["--registry-config", wrong_config.to_str().unwrap()],
            true,
        ),
    ];
    for (name, env, extra, allowed) in cases {
        let data = scratch.path().join(name);
        let mut server = ServerProcess::start_with_env(&data, &[KEY], &env, &extra);
        let last = pull(&server.url, &reference).await;
        if allowed {
            assert_eq!(last["type"], "done", "{name}: {last}");
            assert_eq!(last["image"]["reference"], reference.as_str(), "{name}");
        } else {
            assert_eq!(last["type"], "error", "{name}: {last}");
            let detail = last["detail"].as_str().unwrap();
            assert!(detail.contains("authentication"), "{name}: {detail}");
        }
        assert!(server.stop().success());
        let log = std::fs::read_to_string(data.join("server.log")).unwrap();
        assert!(
            !log.contains(AUTH_PASSWORD),
            "{name}: a secret in the log:\n{log}"
        );
        assert!(!log.contains("not-the-password"), "{name}:\n{log}");
        assert_eq!(
            log.contains("registry credentials loaded"),
            allowed,
            "{name}:\n{log}"
        );
    }
}

#[test]
fn a_bad_registry_config_stops_the_start_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.json");
    std::fs::write(
        &bad,
        r#"{"auths": {"ghcr.io": {"auth": "!!not base64!!"}}}"#,
    )
    .unwrap();
    for args in [
        vec!["--registry-config".to_string(), bad.display().to_string()],
        vec![
            "--registry-auth".into(),
            "ghcr.io=token-without-user".into(),
        ],
        vec!["--image-disk-budget".into(), "lots".into()],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orchard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--agent")
            .arg(agent_binary())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A configuration error ends the process before it listens.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("orchard serve {args:?} did not stop");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{args:?}");
        match args[0].as_str() {
            "--registry-config" => {
                assert!(stderr.contains(&bad.display().to_string()), "{stderr}");
                assert!(stderr.contains("not valid base64"), "{stderr}");
            }
            "--registry-auth" => {
                assert!(stderr.contains("--registry-auth"), "{stderr}");
                assert!(!stderr.contains("token-without-user"), "{stderr}");
            }
            _ => assert!(stderr.contains("image disk budget"), "{stderr}"),
        }
    }
}

/// Waits until the GC has evicted `count` images in all: it runs on its own task after
/// a pull, and counts a pass once the pass is complete.
async fn evicted(srv: &TestServer, count: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = srv.metrics().await;
        if metric(&text, "orchard_image_gc_images_total") >= count {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the GC did not evict {count} images:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_gc_evicts_unused_images_and_keeps_what_sandboxes_use() {
    orchard_test_support::require_runc!();
    // a and b share a base layer; c has its own. Each layer is 256 KiB of noise.
    let layouts = [
        ("gc-srv/a:latest", layout_of(&[("base", 11), ("a", 12)])),
        ("gc-srv/b:latest", layout_of(&[("base", 11), ("b", 13)])),
        ("gc-srv/c:latest", layout_of(&[("c", 14)])),
    ];
    for (dest, layout) in &layouts {
        registry().push(layout.path(), "latest", dest, PushFormat::Oci);
    }
    // The budget: busybox and a fit, one more layer does not.
    let scratch = tempfile::tempdir().unwrap();
    let measure = ImageStore::open(scratch.path().join("store"), StoreConfig::default()).unwrap();
    import(&measure, "busybox", "busybox:latest");
    measure
        .import(layouts[0].1.path(), Some("gc-srv/a:latest"))
        .unwrap();
    let budget = measure.usage().unwrap() + (64 << 10);
    let configure = Arc::new(move |config: &mut orchard::config::Config| {
        config.registry.gc = Some(GcPolicy {
            budget: Budget::Bytes(budget),
            interval: Duration::from_secs(3600),
        });
    });
    let srv = TestServer::with(Options {
        configure: Some(configure),
        ..Options::default()
    })
    .await;
    let store = srv.service.images().clone();
    let busybox = store.get("busybox:latest").unwrap().unwrap();
    // busybox is the least recently used image, but a sandbox runs on it.
    let id = srv.sandbox().await;
    let name = |n: &str| format!("{}/gc-srv/{n}:latest", registry().host);
    let (a, b, c) = (name("a"), name("b"), name("c"));

    assert_eq!(pull(&srv.url, &a).await["type"], "done");
    let a_image = store.get(&a).unwrap().unwrap();
    assert_eq!(pull(&srv.url, &b).await["type"], "done");
    let b_image = store.get(&b).unwrap().unwrap();
    evicted(&srv, 1).await;
    assert_eq!(store.get(&a).unwrap(), None);
    assert!(!a_image.layers[1].exists(), "a's own layer is removed");
    assert!(a_image.layers[0].is_dir(), "the base shared with b stays");
    assert_eq!(store.get(&b).unwrap().as_ref(), Some(&b_image));
    assert_eq!(
        store.get("busybox:latest").unwrap().as_ref(),
        Some(&busybox)
    );
    assert!(store.usage().unwrap() <= budget);

    // busybox's record goes; its layers stay while the sandbox's overlay uses them.
    let (s, _) = srv.delete("/v1/images?reference=busybox:latest").await;
    assert_eq!(s, 200);
    assert_eq!(pull(&srv.url, &c).await["type"], "done");
    evicted(&srv, 2).await;
    assert_eq!(store.get(&b).unwrap(), None);
    assert!(busybox.layers.iter().all(|l| l.is_dir()));
    assert!(store.get(&c).unwrap().is_some());
    let (s, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "ls /bin/busybox && echo alive", "wait": true}),
        )
        .await;
    assert_eq!(
        (s, job["stdout"].as_str()),
        (200, Some("/bin/busybox\nalive\n")),
        "{job}"
    );

    let text = srv.metrics().await;
    assert_eq!(metric(&text, "orchard_image_gc_images_total"), 2, "{text}");
    assert!(
        metric(&text, "orchard_image_gc_layers_total") >= 3,
        "{text}"
    );
    assert!(
        metric(&text, "orchard_image_gc_bytes_total") >= 3 * (256 << 10),
        "{text}"
    );
    assert!(metric(&text, "orchard_image_store_bytes") > 0, "{text}");
    srv.finish().await;
}
