//! The image store and the local backend together: every test image pulled from the
//! real local registry through a docker.io mirror, started as a sandbox, and used.

use orchard::image::{ImageStore, Progress, StoreConfig};
use orchard_protocol::{Command, ExecRequest, ExecResult};

use crate::util::registry::registry;
use crate::util::sandbox::{spec_of, TestBackend};

/// Pushes the test image `layout` to the registry as docker.io's
/// `library/{layout}:{tag}` and pulls it into `store` (through its mirror).
async fn pull(store: &ImageStore, layout: &str, tag: &str) {
    registry().push_image(layout, tag, &format!("library/{layout}:{tag}"));
    store
        .pull(&format!("{layout}:{tag}"), |_: Progress| {})
        .await
        .unwrap();
}

/// A store whose docker.io mirror is the test registry, with `layout:tag` pulled.
async fn pulled(layout: &str, tag: &str) -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::default();
    config
        .mirrors
        .insert("docker.io".into(), vec![registry().url()]);
    let store = ImageStore::open(dir.path().join("store"), config).unwrap();
    pull(&store, layout, tag).await;
    (dir, store)
}

async fn run(
    tb: &TestBackend,
    store: &ImageStore,
    reference: &str,
    command: Command,
) -> ExecResult {
    let image = store.get(reference).unwrap().expect("the pulled image");
    let sb = tb.create(spec_of(image, "e2e")).await;
    let req = ExecRequest {
        command,
        // Generous: the harness tools start slowly on a loaded machine.
        timeout_ms: Some(120_000),
        ..Default::default()
    };
    let result = sb.client().exec(&req).await.unwrap();
    tb.backend.delete(&sb.id).await.unwrap();
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_image_runs_the_quick_start() {
    orchard_test_support::require_runc!();
    let (_dir, store) = pulled("python", "3.11-slim").await;
    let tb = TestBackend::new();
    let r = run(&tb, &store, "python:3.11-slim", Command::Shell("python3 -c 'print(2+2)' && python -c 'import sys; print(sys.version_info[0])' && git --version && pwd".into())).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let out = r.stdout.text_lossy();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "4");
    assert_eq!(lines[1], "3");
    assert!(lines[2].starts_with("git version"), "{out}");
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_busybox_and_empty_images_run() {
    orchard_test_support::require_runc!();
    let (_dir, store) = pulled("busybox", "latest").await;
    pull(&store, "empty", "latest").await;
    let tb = TestBackend::new();
    let r = run(
        &tb,
        &store,
        "busybox:latest",
        Command::Shell("echo hi from $(hostname)".into()),
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.text_lossy().starts_with("hi from "));
    // Nothing in the image: only the injected agent can run, and without a shell.
    let r = run(
        &tb,
        &store,
        "empty:latest",
        Command::Argv(vec![
            "/.orchard/bin/orchard-agent".into(),
            "--version".into(),
        ]),
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.text_lossy().contains("orchard-agent"));
    tb.finish().await;
}

/// The harness bundle from `make harness`.
fn harness_bundle() -> std::path::PathBuf {
    let dir = crate::util::registry::images_out().join("harness");
    assert!(
        dir.join("bin").is_dir(),
        "no harness bundle at {}: run `make harness`",
        dir.display()
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_tools_run_where_they_can_and_say_why_where_they_cannot() {
    orchard_test_support::require_runc!();
    let (_dir, store) = pulled("python", "3.11-slim").await;
    pull(&store, "busybox", "latest").await;
    let mut config = crate::util::sandbox::test_config(&crate::util::sandbox::fresh_root());
    config.harness = Some(harness_bundle());
    let tb = TestBackend::with_config(config);

    // Debian: all five answer, the image's own python3 is still the image's, and the
    // bundle cannot be written.
    let r = run(
        &tb,
        &store,
        "python:3.11-slim",
        Command::Shell(
            "set -e; for t in codex claude opencode pi hermes; do $t --version >/dev/null; echo ok-$t; done; \
         command -v python3; for f in /.orchard/harness/bin/x /opt/sandbox-tools/bin/x; do if touch $f 2>/dev/null; then echo writable; fi; done"
                .into(),
        ),
    )
    .await;
    let out = r.stdout.text_lossy();
    assert_eq!(r.exit_code, Some(0), "{out}\n{}", r.stderr.text_lossy());
    for t in ["codex", "claude", "opencode", "pi", "hermes"] {
        assert!(
            out.contains(&format!("ok-{t}\n")),
            "{t} did not answer --version:\n{out}"
        );
    }
    assert!(
        out.contains("/usr/bin/python3\n"),
        "python3 is not the image's:\n{out}"
    );
    assert!(!out.contains("writable"), "the bundle is writable:\n{out}");

    // Where Orchard users find them: VERSIONS at /opt/sandbox-tools, shims in
    // /usr/local/bin for a PATH built without ours (kubectl exec), and a login shell,
    // which resets PATH in /etc/profile, still has them through /etc/profile.d.
    let r = run(
        &tb,
        &store,
        "python:3.11-slim",
        Command::Shell(
            r#"set -e; cat /opt/sandbox-tools/VERSIONS;
               env -i PATH=/usr/local/bin:/usr/bin:/bin codex --version >/dev/null; echo shim-ok;
               bash --login -c 'command -v codex; echo "$PATH"'"#
                .into(),
        ),
    )
    .await;
    let out = r.stdout.text_lossy();
    assert_eq!(r.exit_code, Some(0), "{out}\n{}", r.stderr.text_lossy());
    for t in ["codex", "claude", "opencode", "pi", "hermes"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{t} "))),
            "VERSIONS has no line for {t}:\n{out}"
        );
    }
    assert!(out.contains("shim-ok\n"), "{out}");
    assert!(
        out.contains("\n/usr/local/bin/codex\n"),
        "a login shell finds codex through its shim:\n{out}"
    );
    assert!(
        out.trim_end().ends_with(":/opt/sandbox-tools/bin"),
        "a login shell's PATH ends with the tools:\n{out}"
    );

    // busybox (no C library): the self-contained ones answer, the others explain.
    let r = run(
        &tb,
        &store,
        "busybox:latest",
        Command::Shell(
            "for t in codex pi hermes; do $t --version >/dev/null 2>&1 && echo ok-$t; done; \
         for t in claude opencode; do $t --version; echo rc-$t=$?; done"
                .into(),
        ),
    )
    .await;
    let out = r.stdout.text_lossy();
    let err = r.stderr.text_lossy();
    for t in ["codex", "pi", "hermes"] {
        assert!(
            out.contains(&format!("ok-{t}\n")),
            "{t} did not answer in busybox:\n{out}\n{err}"
        );
    }
    for t in ["claude", "opencode"] {
        assert!(
            out.contains(&format!("rc-{t}=127\n")),
            "{t} in busybox:\n{out}\n{err}"
        );
        assert!(
            err.contains(&format!("{t}: cannot run in this image")),
            "{err}"
        );
    }
    tb.finish().await;
}
