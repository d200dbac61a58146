//! PID 1 duties: reaping orphans, stopping on SIGTERM, and an environment in
//! `/proc/1/environ` as programs expect it (the agent's init, beside the protected agent).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reaped_and_no_zombie_is_left() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    // The sleeps outlive their subshells and are reparented to the agent.
    let r = sb.sh("(sleep 0.5 &); true").await;
    assert_eq!(r.exit_code, Some(0));
    let procs = sandbox_processes(&sb).await;
    assert!(
        procs
            .iter()
            .any(|(_, comm, ppid)| comm == "sleep" && *ppid == 1),
        "the orphaned sleep should be a child of PID 1: {procs:?}"
    );
    for _ in 0..5 {
        let r = sb.sh("(sleep 0.2 &); (sleep 0.1 &); true").await;
        assert_eq!(r.exit_code, Some(0));
    }
    poll_until(
        Duration::from_secs(10),
        "orphans finished and reaped",
        || async {
            let procs = sandbox_processes(&sb).await;
            let bad: Vec<_> = procs
                .iter()
                .filter(|(state, comm, _)| *state == 'Z' || comm == "sleep")
                .collect();
            if bad.is_empty() {
                Ok(())
            } else {
                Err(format!("{bad:?}"))
            }
        },
    )
    .await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_sandbox_promptly_and_cleanly() {
    orchard_test_support::require_runc!();
    let mut sb = Sandbox::busybox();
    let p = ok(
        "start",
        sb.client().start_process(&argv(&["sleep", "1000"])),
    )
    .await;
    assert_eq!(p.state, ProcessState::Running);
    let t0 = Instant::now();
    sb.kill("TERM");
    let status = sb.wait_exit(Duration::from_secs(5));
    let took = t0.elapsed();
    let Some(status) = status else {
        panic!(
            "the agent did not exit within 5 s of SIGTERM:\n{}",
            sb.diagnostics()
        );
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the agent should exit 0 on SIGTERM, wait status {status:#x}:\n{}",
        sb.diagnostics()
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(sb.runc_status().as_deref(), Some("stopped"));
    assert!(
        !sb.socket.exists(),
        "the agent removes its socket on shutdown"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_sandbox_even_when_a_command_ignores_it() {
    orchard_test_support::require_runc!();
    let mut sb = Sandbox::busybox();
    let p = ok(
        "start",
        sb.client()
            .start_process(&shell("trap '' TERM; sleep 1000")),
    )
    .await;
    assert_eq!(p.state, ProcessState::Running);
    let t0 = Instant::now();
    sb.kill("TERM");
    let Some(status) = sb.wait_exit(Duration::from_secs(6)) else {
        panic!(
            "the agent did not exit within 6 s of SIGTERM:\n{}",
            sb.diagnostics()
        );
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "wait status {status:#x}:\n{}",
        sb.diagnostics()
    );
    eprintln!("stopped in {:?}", t0.elapsed());
    sb.stop();
}

/// `/proc/1/environ` is what `kubectl exec` and Orchard's tool check read the image's
/// PATH from: readable by the sandbox's root, the image's environment exactly, and no
/// token. The agent beside it (the commands' parent) stays unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_1_shows_the_images_environment_and_no_token() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    // In a clean environment, as `kubectl exec` starts a command.
    let r = sb
        .exec(argv(&["env", "-i", "/bin/cat", "/proc/1/environ"]))
        .await;
    assert_eq!(r.exit_code, Some(0), "/proc/1/environ unreadable: {r:?}");
    let environ = r.stdout.text_lossy();
    let vars: Vec<&str> = environ.split('\0').filter(|v| !v.is_empty()).collect();
    assert_eq!(
        vars,
        [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME=/root"
        ],
        "{environ:?}"
    );
    assert!(
        !environ.contains(&sb.token),
        "the token is in PID 1's environ"
    );
    // What a program finds through that PATH, starting from nothing.
    let r = sb
        .exec(argv(&[
            "env",
            "-i",
            "/bin/sh",
            "-c",
            "export $(tr '\\0' '\\n' < /proc/1/environ | grep ^PATH=); which ls; \
             cat /proc/1/comm /proc/1/cmdline | tr '\\0' ' '",
        ]))
        .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let out = r.stdout.text_lossy();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "/bin/ls", "{out}");
    assert_eq!(lines[1], "orchard-init", "{out}");
    assert!(lines[2].contains("--pid1-init"), "{out}");
    assert!(
        !out.contains(&sb.token),
        "the token is in PID 1's argv: {out}"
    );
    // The agent itself: not dumpable, so neither its environ nor its memory is readable.
    let r = sb
        .sh("cat /proc/$PPID/comm; cat /proc/$PPID/environ >/dev/null && echo READ")
        .await;
    assert_eq!(r.stdout.text_lossy(), "orchard-agent\n", "{r:?}");
    assert!(r.stderr.text_lossy().contains("ermission denied"), "{r:?}");
    sb.stop();
}
