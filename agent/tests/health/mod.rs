//! Health: `GET /v1/health`, the agent's OOM score.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_pid1_version_and_process_count() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    // The fixture's leak check looks for these; make sure it looks in the right place.
    let cgroups = sb.cgroup_dirs();
    assert!(
        cgroups.iter().any(|d| d.is_dir()),
        "no cgroup of the running sandbox found at {cgroups:?}"
    );

    let h = ok("health", sb.client().health()).await;
    assert_eq!(h.status, "ok");
    assert!(h.pid1, "the agent must see itself as PID 1: {h:?}");
    assert_eq!(h.version, VERSION);
    assert!(h.processes >= 1, "{h:?}");
    assert_eq!(h.tracked_processes, 0);

    let p = ok(
        "start",
        sb.client().start_process(&argv(&["sleep", "1000"])),
    )
    .await;
    let h2 = ok("health", sb.client().health()).await;
    assert!(h2.processes >= 2, "a running sleep must be counted: {h2:?}");
    assert_eq!(h2.tracked_processes, 1);
    assert!(h2.uptime_ms >= h.uptime_ms);
    ok("delete", sb.client().delete_process(&p.id)).await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_score_adj_is_minus_998_for_the_agent_and_0_for_its_children() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let child = sb.exec(argv(&["cat", "/proc/self/oom_score_adj"])).await;
    let child = child.stdout.text_lossy();
    // Read by the agent itself (/proc/self; PID 1 is its init): while a spawn is in
    // flight the agent wears its children's score (so they start with it), and a child
    // reading the agent's could see that window.
    let agent = sb
        .client()
        .read_file("/proc/self/oom_score_adj")
        .await
        .unwrap();
    let agent = String::from_utf8_lossy(&agent);
    if host_has_cap_sys_resource() {
        assert_eq!(agent, "-998\n", "the agent's oom_score_adj");
        assert_eq!(child, "0\n", "a child's oom_score_adj");
    } else {
        // Without CAP_SYS_RESOURCE nobody on this host can lower a score: the agent
        // keeps 0 and its children get 500 instead.
        assert_eq!(agent, "0\n", "the agent's oom_score_adj");
        assert_eq!(child, "500\n", "a child's oom_score_adj");
    }
    sb.stop();
}

/// The point of the OOM scores is that a memory hog dies before PID 1. A sandbox
/// normally lacks CAP_SYS_RESOURCE (Docker's default set has none, and this host has
/// none to give), so the agent cannot lower its own score; it must still end up below
/// its children's, e.g. by having the children raise theirs, which needs no privilege.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_agent_oom_score_is_below_its_childrens_without_cap_sys_resource() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let read = |path: &'static str| {
        let sb = &sb;
        async move {
            let r = sb.exec(argv(&["cat", path])).await;
            r.stdout.text_lossy().trim().parse::<i32>().unwrap()
        }
    };
    let agent = sb
        .client()
        .read_file("/proc/self/oom_score_adj")
        .await
        .unwrap();
    let agent: i32 = String::from_utf8_lossy(&agent).trim().parse().unwrap();
    let child = read("/proc/self/oom_score_adj").await;
    assert!(
        agent < child,
        "the OOM killer must prefer a child over PID 1: agent oom_score_adj {agent}, \
         child {child} (CAP_SYS_RESOURCE on host: {})",
        host_has_cap_sys_resource()
    );
    sb.stop();
}
