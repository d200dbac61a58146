//! Local backend tests: real runc sandboxes over overlayfs from hand-built layers. Every
//! test has its own backend root and ends with an empty leak audit.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use orchard::backend::local::{
    process, FailPoint, Limits, LocalBackend, LocalError, NetworkMode, SandboxInfo, SandboxSpec,
};
use orchard::image::ImageConfig;
use orchard_protocol::ExecResult;
use serde_json::Value;

use crate::util::sandbox::*;

mod disk;
mod egress;
mod every_image;
mod paused;
mod pid1;
mod runtime_files;
mod shared;
mod snapshot_cache;

/// Waits (up to 60 s) until a create stopped at its fail point in sandbox directory
/// `dir`; answers the pid of the container's init that `runc create` wrote.
async fn init_pid_at_fail_point(dir: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("failpoint").exists() {
        assert!(
            Instant::now() < deadline,
            "the create never reached its fail point"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fs::read_to_string(dir.join("init.pid"))
        .expect("runc create wrote the init's pid")
        .trim()
        .parse()
        .expect("a pid")
}

fn annotations(bundle: &Path) -> Value {
    let config: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    config["annotations"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busybox_sandbox_runs_commands_and_records_its_labels() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = SandboxSpec::new(busybox_image());
    let id = unique_id("labels");
    spec.id = Some(id.clone());
    spec.labels = BTreeMap::from([("team".to_string(), "rl".to_string())]);
    spec.limits.memory_bytes = Some(256 << 20);
    let sb = tb.create(spec).await;
    assert_eq!(sb.id, id);
    assert_eq!(
        sh_ok(&sb, "echo hello; hostname").await,
        format!("hello\n{id}\n")
    );
    let health = sb.client().health().await.unwrap();
    assert!(health.pid1, "{health:?}");
    assert_eq!(tb.backend.list().len(), 1);
    assert_eq!(tb.backend.get(&id).unwrap().labels["team"], "rl");
    let a = annotations(&sb.bundle);
    assert_eq!(a["org.orchard.sandbox.id"], id.as_str());
    assert_eq!(a["org.orchard.label.team"], "rl");
    assert_eq!(
        a["org.orchard.image.reference"],
        "test.local/busybox:latest"
    );
    assert_eq!(
        a["org.orchard.limits.memory_bytes"],
        (256u64 << 20).to_string()
    );
    assert!(a["org.orchard.created"].as_str().unwrap().ends_with('Z'));
    let state: Value =
        serde_json::from_slice(&fs::read(sb.bundle.join("state.json")).unwrap()).unwrap();
    assert_eq!(state["phase"], "running");
    assert_eq!(state["labels"]["team"], "rl");
    // The memory limit reached the cgroup.
    let mem = sb.cgroup_dir("memory").expect("a memory cgroup");
    let limit = fs::read_to_string(mem.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(limit.trim(), (256u64 << 20).to_string());
    tb.backend.delete(&id).await.unwrap();
    assert!(!sb.bundle.exists());
    assert!(!mem.exists());
    assert!(tb.backend.list().is_empty());
    assert!(matches!(
        tb.backend.delete(&id).await,
        Err(LocalError::NotFound(_))
    ));
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_image_runs_the_agent_alone() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    for layers in [vec![layers().empty.clone()], vec![]] {
        let sb = tb
            .create(spec_of(
                image("empty", layers, ImageConfig::default()),
                "empty",
            ))
            .await;
        let r = exec(&sb, argv(&["/.orchard/bin/orchard-agent", "--version"])).await;
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        assert!(r.stdout.text_lossy().starts_with("orchard-agent "), "{r:?}");
        // No shell in the image: a shell string cannot run.
        assert!(sb.client().exec(&shell("true")).await.is_err());
        tb.backend.delete(&sb.id).await.unwrap();
    }
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_env_working_dir_user_and_layers_apply() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let l = layers();
    let config = ImageConfig {
        env: vec!["FOO=bar baz".into(), "PATH=/usr/bin:/bin".into()],
        working_dir: Some("/srv/app".into()),
        user: Some("app".into()),
        ..ImageConfig::default()
    };
    let mut spec = spec_of(
        image("app", vec![l.busybox.clone(), l.top.clone()], config),
        "env",
    );
    spec.env = vec!["EXTRA=1".into()];
    let sb = tb.create(spec).await;
    assert_eq!(sh_ok(&sb, "pwd").await, "/srv/app\n");
    let env = sh_ok(&sb, "env").await;
    for want in [
        "FOO=bar baz",
        "PATH=/usr/bin:/bin",
        "EXTRA=1",
        "HOME=/home/app",
    ] {
        assert!(
            env.lines().any(|l| l == want),
            "{want} missing from:\n{env}"
        );
    }
    assert!(!env.contains("ORCHARD_AGENT_TOKEN"), "{env}");
    // The top layer wins; the bottom one shows through where the top has nothing.
    assert_eq!(
        sh_ok(&sb, "cat /etc/motd /etc/only-bottom").await,
        "top\nfrom the bottom layer\n"
    );
    // Commands run as the image's user, with its supplementary groups; the agent
    // itself stays root.
    assert_eq!(
        sh_ok(&sb, "id -u; id -g; id -G").await,
        "1000\n1000\n1000 50\n"
    );
    assert_eq!(
        sh_ok(&sb, "grep ^Uid /proc/$PPID/status")
            .await
            .split_whitespace()
            .nth(1),
        Some("0")
    );
    let a = annotations(&sb.bundle);
    assert_eq!(a["org.orchard.image.user"], "app");
    assert_eq!(a["org.orchard.image.user.resolved"], "1000:1000,50");

    // Without a WorkingDir: /workspace when the image has it, else /.
    let ws = tb
        .create(spec_of(
            image(
                "ws",
                vec![l.busybox.clone(), l.top.clone()],
                ImageConfig::default(),
            ),
            "ws",
        ))
        .await;
    assert_eq!(sh_ok(&ws, "pwd").await, "/workspace\n");
    let bb = tb.busybox().await;
    assert_eq!(sh_ok(&bb, "pwd").await, "/\n");

    // An unknown user is refused before anything runs.
    let spec = spec_of(
        image(
            "nobody",
            vec![l.busybox.clone()],
            ImageConfig {
                user: Some("nobody".into()),
                ..ImageConfig::default()
            },
        ),
        "nobody",
    );
    let e = tb.backend.create(spec).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("\"nobody\" is not in the image's /etc/passwd"),
        "{e}"
    );
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_and_tmp_are_writable_and_the_injected_volume_is_read_only() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let sb = tb.busybox().await;
    sh_ok(
        &sb,
        "echo a > /tmp/a && echo b > /new-file && mkdir -p /root/x && cat /tmp/a /new-file",
    )
    .await;
    assert_eq!(sh_ok(&sb, "cat /tmp/a /new-file").await, "a\nb\n");
    assert!(sh_ok(&sb, "grep ' /tmp ' /proc/mounts")
        .await
        .contains("tmpfs"));
    for path in [
        "/.orchard/bin/x",
        "/.orchard/x",
        "/.orchard/bin/orchard-agent",
    ] {
        let r = sh(&sb, &format!("echo x > {path}")).await;
        assert_ne!(r.exit_code, Some(0), "{path} is writable: {r:?}");
        assert!(r.stderr.text_lossy().contains("Read-only"), "{path}: {r:?}");
    }
    assert!(sh(&sb, "echo x > /sys/x").await.exit_code != Some(0));
    // Writes land in the sandbox's upper dir, never in the shared layer.
    assert!(!layers().busybox.join("new-file").exists());
    assert!(sb.bundle.join("disk/upper/new-file").exists());
    // No part of /.orchard is writable, and the agent's socket is not in the sandbox.
    let r = sh(&sb, "echo x > /.orchard/run/x").await;
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(!sh_ok(&sb, "ls -A /.orchard/run 2>/dev/null; true")
        .await
        .contains("agent.sock"));
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_oom_killed_and_the_agent_survives() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = busybox_spec("oom");
    spec.limits.memory_bytes = Some(64 << 20);
    let sb = tb.create(spec).await;
    // dd allocates its 256 MiB block and fills it.
    let mut req = argv(&["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]);
    req.timeout_ms = Some(30_000);
    let r = exec(&sb, req).await;
    assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
    let h = sb.client().health().await.unwrap();
    assert!(h.pid1);
    assert_eq!(sh_ok(&sb, "echo alive").await, "alive\n");
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_stopped_by_the_pids_limit() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = busybox_spec("pids");
    spec.limits.pids = Some(64);
    let sb = tb.create(spec).await;
    // busybox sh stops at its first failed fork, so the loop runs in a subshell that
    // ignores errors while the leader sleeps.
    let mut req = shell("(while true; do sleep 10 & done) 2>/dev/null & exec sleep 1000");
    req.timeout_ms = Some(3_000);
    let started = Instant::now();
    let r = within(Duration::from_secs(60), sb.client().exec(&req))
        .await
        .expect("the fork bomb exec");
    assert!(r.timed_out, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let pids = sb.cgroup_dir("pids").expect("a pids cgroup");
    let max = fs::read_to_string(pids.join("pids.max")).unwrap();
    assert_eq!(max.trim(), "64");
    let events = fs::read_to_string(pids.join("pids.events")).unwrap();
    let refused: u64 = events
        .trim()
        .strip_prefix("max ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected pids.events: {events}"));
    assert!(refused > 0, "the limit was never hit: {events}");
    // The agent recovers once the bomb's processes are gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match within(CALL_LIMIT, sb.client().exec(&shell("echo ok"))).await {
            Ok(r) if r.stdout.text_lossy() == "ok\n" => break,
            other => assert!(
                Instant::now() < deadline,
                "the agent does not recover: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_quota_holds_busy_loops_to_half_a_core() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = busybox_spec("cpu");
    spec.limits.cpus = Some(0.5);
    let sb = tb.create(spec).await;
    let usage = sb
        .cgroup_dir("cpuacct")
        .expect("a cpuacct cgroup")
        .join("cpuacct.usage");
    let read = || -> u64 { fs::read_to_string(&usage).unwrap().trim().parse().unwrap() };
    let before = read();
    let t = Instant::now();
    // Two loops: unthrottled they would use up to two cores.
    let mut req = shell("busy() { while :; do :; done; }; busy & busy & sleep 2; kill %1 %2");
    req.timeout_ms = Some(20_000);
    let r = exec(&sb, req).await;
    let wall = t.elapsed().as_secs_f64();
    let cpu = (read() - before) as f64 / 1e9;
    let ratio = cpu / wall;
    eprintln!("cpu quota 0.5: {cpu:.2}s of CPU in {wall:.2}s of wall time (ratio {ratio:.2})");
    assert!(r.exit_code == Some(0), "{r:?}");
    // Half a core at most (with slack for the quota's period granularity); the lower
    // bound only checks that the loops ran (the host is shared).
    assert!(
        (0.1..=0.65).contains(&ratio),
        "used {cpu:.2}s of CPU in {wall:.2}s (ratio {ratio:.2}), expected about 0.5"
    );
    tb.finish().await;
}

/// A loopback listener and what it received.
fn listen() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Accepts one connection within `limit` and reads a line from it.
fn accept_one(listener: &TcpListener, limit: Duration) -> Option<String> {
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut buf = [0u8; 64];
                let n = stream.read(&mut buf).unwrap_or(0);
                return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => return None,
        }
    }
}

/// Asserts that "hello", sent with nc from `sb` to the host's loopback (10.0.2.2
/// through slirp4netns), reaches a listener there.
async fn assert_host_reachable(sb: &SandboxInfo) {
    let (listener, port) = listen();
    let accepted = std::thread::spawn(move || accept_one(&listener, Duration::from_secs(20)));
    let mut req = shell(&format!("echo hello | nc -w 5 10.0.2.2 {port}"));
    req.timeout_ms = Some(20_000);
    let r = exec(sb, req).await;
    assert_eq!(
        accepted.join().unwrap().as_deref(),
        Some("hello\n"),
        "the listener saw nothing; nc: {r:?}"
    );
}

/// Asserts that nc from `sb` connects to no listener on the host's loopback; answers
/// nc's result.
async fn assert_host_unreachable(sb: &SandboxInfo) -> ExecResult {
    let (listener, port) = listen();
    let mut req = shell(&format!("echo hello | nc -w 3 10.0.2.2 {port}"));
    req.timeout_ms = Some(10_000);
    let r = exec(sb, req).await;
    assert_eq!(
        accept_one(&listener, Duration::from_millis(500)),
        None,
        "{r:?}"
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_denied_by_default() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let sb = tb.busybox().await;
    let r = assert_host_unreachable(&sb).await;
    assert_ne!(r.exit_code, Some(0), "the connect succeeded: {r:?}");
    // Nothing but lo in the sandbox's network namespace.
    let links = sh_ok(&sb, "ls /sys/class/net").await;
    assert_eq!(
        links.split_whitespace().collect::<Vec<_>>(),
        ["lo"],
        "{links}"
    );
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_allowed_through_slirp4netns_when_asked() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = busybox_spec("egress");
    spec.network = NetworkMode::Egress {
        allow_host_loopback: true,
    };
    let sb = tb.create(spec).await;
    assert_host_reachable(&sb).await;
    assert!(sh_ok(&sb, "ls /sys/class/net").await.contains("tap0"));
    assert_eq!(
        sh_ok(&sb, "cat /etc/resolv.conf").await,
        "nameserver 10.0.2.3\n"
    );
    // Without allow_host_loopback, the host's loopback stays out of reach.
    let mut spec = busybox_spec("egress-nl");
    spec.network = NetworkMode::Egress {
        allow_host_loopback: false,
    };
    let sb2 = tb.create(spec).await;
    assert_host_unreachable(&sb2).await;
    let slirps: Vec<i32> = slirp_pids();
    assert!(!slirps.is_empty());
    tb.finish().await;
    for pid in slirps {
        assert!(
            process::stat(pid).unwrap().is_none(),
            "slirp4netns {pid} survived"
        );
    }
}

/// Pids of running slirp4netns processes.
fn slirp_pids() -> Vec<i32> {
    process::all_pids()
        .into_iter()
        .filter(|p| {
            process::stat(*p)
                .ok()
                .flatten()
                .is_some_and(|s| s.comm == "slirp4netns" && s.state != 'Z')
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sandboxes_see_neither_each_others_processes_nor_files() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let a = tb.busybox().await;
    let b = tb.busybox().await;
    let p = within(
        CALL_LIMIT,
        b.client().start_process(&argv(&["sleep", "1000"])),
    )
    .await
    .unwrap();
    sh_ok(
        &b,
        "echo secret > /root/b-secret && echo secret > /tmp/b-secret",
    )
    .await;
    let ps = sh_ok(&a, "ps -o pid,args").await;
    assert!(!ps.contains("sleep 1000"), "{ps}");
    let pids: Vec<&str> = ps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(pids.contains(&"1"), "{ps}");
    assert!(pids.len() <= 4, "A sees more than its own processes: {ps}");
    let r = sh(&a, "cat /root/b-secret /tmp/b-secret").await;
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    // B's sleep runs (in B), and no process of A has its command line.
    assert!(sh_ok(&b, &format!("cat /proc/{}/cmdline", p.pid))
        .await
        .contains("1000"));
    let cmdlines = sh_ok(&a, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo").await;
    assert!(!cmdlines.contains("sleep 1000"), "{cmdlines}");
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_fail_clearly_and_leave_nothing() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some("Not/valid".into());
    assert!(matches!(
        tb.backend.create(spec).await,
        Err(LocalError::InvalidId(_))
    ));
    let spec = spec_of(
        image(
            "missing",
            vec![PathBuf::from("/no/such/layer")],
            ImageConfig::default(),
        ),
        "missing",
    );
    let e = tb.backend.create(spec).await.unwrap_err();
    assert!(e.to_string().contains("/no/such/layer"), "{e}");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.env = vec!["NOVALUE".into()];
    let e = tb.backend.create(spec).await.unwrap_err();
    assert!(e.to_string().contains("NOVALUE"), "{e}");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.limits.cpus = Some(-1.0);
    assert!(matches!(
        tb.backend.create(spec).await,
        Err(LocalError::Invalid(_))
    ));
    let sb = tb.busybox().await;
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some(sb.id.clone());
    assert!(matches!(
        tb.backend.create(spec).await,
        Err(LocalError::AlreadyExists(_))
    ));
    assert_eq!(sh_ok(&sb, "echo still here").await, "still here\n");
    assert_clean(&tb.backend).await;
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_fails_to_start_is_reported_with_its_log_and_cleaned_up() {
    orchard_test_support::require_runc!();
    let mut config = test_config(&fresh_root());
    config.agent_args = vec!["--no-such-flag".into()];
    let tb = TestBackend::with_config(config);
    let spec = busybox_spec("broken");
    let e = tb.backend.create(spec).await.unwrap_err();
    match &e {
        LocalError::NotReady { log, .. } => assert!(log.contains("--no-such-flag"), "{e}"),
        other => panic!("expected NotReady, got {other}"),
    }
    assert!(tb.backend.list().is_empty());
    tb.finish().await;
}

/// Env naming the root the recovery child works on.
const CHILD_ROOT: &str = "ORCHARD_RECOVERY_CHILD_ROOT";

/// The backend process that gets killed: creates a healthy sandbox with egress, then
/// hangs half-way through creating a second. Runs only when re-invoked by
/// `recovery_after_the_backend_was_killed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by recovery_after_the_backend_was_killed"]
async fn recovery_child() {
    orchard_test_support::require_runc!();
    let Some(root) = std::env::var_os(CHILD_ROOT).map(PathBuf::from) else {
        return;
    };
    let backend = LocalBackend::open(test_config(&root)).expect("opening the backend");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some("adopt-me".into());
    spec.network = NetworkMode::Egress {
        allow_host_loopback: true,
    };
    backend.create(spec).await.expect("creating adopt-me");
    // Free the root's lock for a backend that stops half-way.
    drop(backend);
    let mut config = test_config(&root);
    config.fail_point = Some(FailPoint::HangAfterRuncCreate);
    let backend = LocalBackend::open(config).expect("reopening the backend");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some("half-made".into());
    spec.network = NetworkMode::Egress {
        allow_host_loopback: true,
    };
    let _ = backend.create(spec).await;
    unreachable!("the fail point never returns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_the_backend_was_killed() {
    orchard_test_support::require_runc!();
    // The killed backend's container inits and slirp4netns are re-parented to us.
    process::become_subreaper().unwrap();
    let root = fresh_root();
    let log_path = root.with_extension("child.log");
    let log = fs::File::create(&log_path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "local_backend::recovery_child",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ROOT, &root)
        .env(LAYERS_ENV, &layers().base)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let marker = root.join("sandboxes/half-made/failpoint");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !marker.exists() {
        let exited = child.try_wait().unwrap();
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            // Clean up whatever it made before failing.
            drop(TestBackend::with_config(test_config(&root)));
            panic!("the child backend did not reach its fail point ({exited:?}):\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = fs::remove_file(&log_path);

    let tb = TestBackend::with_config(test_config(&root));
    // Before recovery nothing on the root is accounted for: the audit sees it all.
    let leaks = tb.backend.audit().await.unwrap();
    let mut containers = leaks.runc_containers.clone();
    containers.sort();
    assert_eq!(containers, ["adopt-me", "half-made"], "{leaks}");
    for id in ["adopt-me", "half-made"] {
        let rootfs = root.join("sandboxes").join(id).join("rootfs");
        assert!(leaks.mounts.contains(&rootfs), "{id}: {leaks}");
        assert!(
            leaks.directories.contains(&root.join("sandboxes").join(id)),
            "{leaks}"
        );
        assert!(
            leaks
                .cgroups
                .iter()
                .any(|c| c.to_string_lossy().ends_with(id)),
            "{id}: {leaks}"
        );
        assert!(
            leaks.processes.iter().any(|p| p
                .reason
                .contains(&format!("slirp4netns of gone sandbox {id}"))),
            "{id}: {leaks}"
        );
    }
    assert!(
        leaks.processes.iter().any(|p| p.comm == "orchard-agent"),
        "{leaks}"
    );
    assert!(leaks.network_namespaces.len() >= 2, "{leaks}");
    let report = tb.backend.recover().await.expect("recovering");
    assert_eq!(report.adopted, ["adopt-me"], "{report:?}");
    assert_eq!(report.removed, ["half-made"], "{report:?}");
    assert!(report.problems.is_empty(), "{report:?}");
    assert!(!root.join("sandboxes/half-made").exists());
    // The adopted sandbox works, network included, with its recorded token.
    let sb = tb.backend.get("adopt-me").expect("adopt-me is listed");
    assert_eq!(sh_ok(&sb, "echo adopted").await, "adopted\n");
    assert_host_reachable(&sb).await;
    assert_clean(&tb.backend).await;
    // Recovering again changes nothing.
    let again = tb.backend.recover().await.unwrap();
    assert!(
        again.adopted.is_empty() && again.removed.is_empty(),
        "{again:?}"
    );
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_backend_on_the_same_root_is_refused() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut config = test_config(&tb.root);
    config.lock_wait = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let e = LocalBackend::open(config).unwrap_err();
    assert!(matches!(e, LocalError::Busy(_)), "{e}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited first"
    );
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_restart_waits_for_the_lock_of_a_process_still_dying() {
    orchard_test_support::require_runc!();
    // A server killed with SIGKILL keeps its flock until the kernel has torn it down
    // (seconds, with a large heap): the restart must wait, not exit "lock is held".
    use std::os::fd::AsRawFd;
    let root = fresh_root();
    std::fs::create_dir_all(&root).unwrap();
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join("lock"))
        .unwrap();
    assert_eq!(
        // SAFETY: flock on an fd this test owns.
        unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let dying = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(held);
    });
    let started = std::time::Instant::now();
    let tb = TestBackend::with_config(test_config(&root));
    assert!(started.elapsed() >= Duration::from_millis(400));
    dying.join().unwrap();
    tb.finish().await;
}

/// `make bench` runs it (release build, table in bench/results/backend.md); by hand:
/// `cargo test -p orchard --test integration bench_local_backend -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by make bench"]
async fn bench_local_backend() {
    orchard_test_support::require_runc!();
    use orchard_bench::local_backend as bench;
    let mut config = test_config(&fresh_root());
    config.ready_timeout = Duration::from_secs(300);
    let tb = TestBackend::with_config(config);
    let n = std::env::var("ORCHARD_BENCH_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let cfg = bench::BenchConfig {
        burst: n,
        ..bench::BenchConfig::default()
    };
    let report = bench::run(&tb.backend, &busybox_image(), &cfg)
        .await
        .expect("the benchmark");
    let mut markdown = report.to_markdown();
    tb.finish().await;

    // The same creates with the harness bundle injected (`make harness`), when built:
    // one copy on disk bind-mounted into every sandbox, so create should not change.
    let bundle = crate::util::registry::images_out().join("harness");
    if bundle.join("bin").is_dir() {
        let mut config = test_config(&fresh_root());
        config.ready_timeout = Duration::from_secs(300);
        config.harness = Some(bundle.clone());
        let prepared = Instant::now();
        let with = TestBackend::with_config(config);
        let inject_s = prepared.elapsed().as_secs_f64();
        let cfg = bench::BenchConfig {
            burst: 10,
            ..bench::BenchConfig::default()
        };
        let r = bench::run(&with.backend, &busybox_image(), &cfg)
            .await
            .expect("the benchmark with the harness");
        let size = Command::new("du")
            .args(["-sb"])
            .arg(&bundle)
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0);
        markdown.push_str(&format!(
            "\nWith the harness bundle ({:.2} GiB, injected once per backend in {inject_s:.1} s): \
             create to ready p50 {:.1} ms, {:.2}x the {:.1} ms without it.\n",
            size as f64 / (1u64 << 30) as f64,
            r.create_ms.p50,
            r.create_ms.p50 / report.create_ms.p50,
            report.create_ms.p50,
        ));
        with.finish().await;
    }
    println!("{markdown}");
    // `make bench` keeps the table with the agent's.
    if let Some(out) = std::env::var_os("ORCHARD_BENCH_OUT") {
        fs::write(out, &markdown).expect("writing the benchmark table");
    }
    let _ = Limits::DEFAULT;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_bundle_is_injected_read_only_and_on_path() {
    orchard_test_support::require_runc!();
    let (tb, harness) = backend_with_hello_harness();
    let manifest: Value = serde_json::from_slice(
        &fs::read(tb.backend.injection_dir().join("manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["harness"], true);
    let sb = tb.busybox().await;
    assert_eq!(sh_ok(&sb, "hello").await, "hello from the harness\n");
    // Where Orchard users look: appended to PATH (never prepended), read-only at
    // /opt/sandbox-tools, a shim in /usr/local/bin (busybox has no `hello`), a
    // profile entry for login shells.
    assert!(sh_ok(&sb, "echo $PATH")
        .await
        .ends_with(":/opt/sandbox-tools/bin\n"));
    for path in [
        "/.orchard/harness/bin/hello",
        "/opt/sandbox-tools/bin/hello",
    ] {
        let r = sh(&sb, &format!("echo x > {path}")).await;
        assert_ne!(r.exit_code, Some(0), "{path} is writable: {r:?}");
    }
    assert_eq!(
        sh_ok(&sb, "PATH=/usr/local/bin:/usr/bin:/bin; hello").await,
        "hello from the harness\n"
    );
    assert_eq!(
        sh_ok(
            &sb,
            "PATH=/usr/bin:/bin; . /etc/profile.d/orchard-sandbox-tools.sh; hello"
        )
        .await,
        "hello from the harness\n"
    );
    // Code in the sandbox can remove its shim, not the tools.
    sh_ok(&sb, "rm /usr/local/bin/hello").await;
    assert_eq!(sh_ok(&sb, "hello").await, "hello from the harness\n");
    tb.finish().await;
    fs::remove_dir_all(&harness).unwrap();
}

/// A create still in flight when the backend was destroyed (here hung after `runc
/// create`, its task then aborted as a runtime shutdown would) kept its table entry, so
/// `destroy` skipped it: its `runc init` and its cgroups outlived the backend, one
/// process and a cgroup per hierarchy for each such sandbox left on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_create_in_flight_when_the_backend_is_destroyed_leaves_no_process() {
    orchard_test_support::require_runc!();
    let mut config = test_config(&fresh_root());
    config.fail_point = Some(FailPoint::HangAfterRuncCreate);
    let tb = TestBackend::with_config(config);
    let id = unique_id("hang");
    let mut spec = SandboxSpec::new(busybox_image());
    spec.id = Some(id.clone());
    let backend = tb.backend.clone();
    let task = tokio::spawn(async move { backend.create(spec).await });
    let dir = tb.root.join("sandboxes").join(&id);
    let pid = init_pid_at_fail_point(&dir).await;
    task.abort();
    assert!(task.await.is_err(), "the hung create was aborted");
    tb.finish().await;
    let state = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z "),
        "the sandbox's runc init {pid} outlived the backend: {state}"
    );
}
