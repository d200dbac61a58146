//! PID 1 duties: reaping orphans, stopping on SIGTERM.

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
