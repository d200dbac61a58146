//! Commands started while every CPU is busy start on the agent thread's CPU
//! (`agent/src/proc/placement.rs`); nothing they start may keep that one-CPU mask.

use std::process::{Child, Command, Stdio};

use crate::util::*;

/// A busy loop per CPU on the host, bounded in time, killed on drop.
struct Busy(Vec<Child>);

impl Busy {
    fn start() -> Busy {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut busy = Busy(Vec::new());
        for _ in 0..cpus {
            let child = Command::new("timeout")
                .args(["20", "sh", "-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()
                .expect("busy loop");
            busy.0.push(child);
        }
        busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        // SIGTERM: `timeout` passes it on to its loop (SIGKILL would orphan the loop).
        for c in &mut self.0 {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }
}

/// While every host CPU is busy, twenty commands each print the agent's CPU mask, then
/// their own, those of two processes they start at once and of a grandchild: all must
/// be the agent's.
async fn assert_no_command_keeps_a_pin(sb: &Sandbox) {
    let _busy = Busy::start();
    for _ in 0..20 {
        let r = sb
            .sh("grep Cpus_allowed_list /proc/$PPID/status; \
                 sleep 2 & a=$!; sh -c 'sleep 2 & echo $$ $!; wait' | { read b g; \
                 for p in $$ $a $b $g; do grep Cpus_allowed_list /proc/$p/status; done; \
                 kill $a $b $g; }")
            .await;
        let out = r.stdout.text_lossy();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 5, "{out} {r:?}");
        assert!(lines[0].starts_with("Cpus_allowed_list:"), "{out}");
        for line in &lines[1..] {
            assert_eq!(
                line, &lines[0],
                "a command's process kept a pinned mask: {out}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_commands_started_while_every_cpu_is_busy_keep_no_one_cpu_mask() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    assert_no_command_keeps_a_pin(&sb).await;
}

/// Commands of the image's user: the agent (without CAP_SYS_NICE, as in runc's default
/// set) could not give such a command its mask back, so it must not pin it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_commands_of_another_user_are_never_left_on_one_cpu() {
    orchard_test_support::require_runc!();
    let opts = SandboxOpts {
        capabilities: vec!["CAP_SETUID".into(), "CAP_SETGID".into()],
        ..SandboxOpts::agent_args(&["--user", "1000:1000"])
    };
    let sb = Sandbox::start(RootfsKind::Busybox, opts);
    assert_no_command_keeps_a_pin(&sb).await;
    sb.stop();
}
