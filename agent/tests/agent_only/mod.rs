//! A rootfs with nothing but the agent.

use super::*;

fn agent_only() -> Sandbox {
    Sandbox::start(RootfsKind::AgentOnly, SandboxOpts::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_only_rootfs_runs_argv_commands() {
    orchard_test_support::require_runc!();
    let sb = agent_only();
    let r = sb
        .exec(argv(&["/.orchard/bin/orchard-agent", "--version"]))
        .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout.text_lossy(), format!("orchard-agent {VERSION}\n"));
    let h = ok("health", sb.client().health()).await;
    assert!(h.pid1);
    assert_eq!(h.version, VERSION);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_only_rootfs_refuses_shell_strings_with_no_shell() {
    orchard_test_support::require_runc!();
    let sb = agent_only();
    let err = sb.exec_err(shell("echo hi")).await;
    assert_api_error(&err, 400, ErrorCode::NoShell);
    let ClientError::Api { body, .. } = &err else {
        unreachable!()
    };
    assert!(
        body.message.contains("/bin/sh") && body.message.contains("does not exist"),
        "the message should say there is no shell: {}",
        body.message
    );
    let err = fails(
        "process with a shell string",
        sb.client().start_process(&shell("sleep 1")),
    )
    .await;
    assert_api_error(&err, 400, ErrorCode::NoShell);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_only_rootfs_serves_files_in_tmp() {
    orchard_test_support::require_runc!();
    let sb = agent_only();
    let c = sb.client();
    ok("write", c.write_file("/tmp/dir/f.txt", "payload", None)).await;
    assert_eq!(ok("read", c.read_file("/tmp/dir/f.txt")).await, "payload");
    assert_eq!(ok("stat", c.stat("/tmp/dir/f.txt")).await.size, 7);
    let list = ok("list", c.list_dir("/tmp", 2)).await;
    let paths: Vec<&str> = list.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, vec!["/tmp/dir", "/tmp/dir/f.txt"]);
    ok("remove", c.remove("/tmp/dir", true)).await;
    assert!(ok("list", c.list_dir("/tmp", 1)).await.entries.is_empty());
    sb.stop();
}
