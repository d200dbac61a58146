//! Commands started while every CPU is busy start on the agent thread's CPU
//! (`agent/src/placement.rs`); nothing they start may keep that one-CPU mask.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_commands_started_while_every_cpu_is_busy_keep_no_one_cpu_mask() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let agent = sb.sh("grep Cpus_allowed_list /proc/1/status").await;
    let agent = agent.stdout.text_lossy();
    assert!(agent.starts_with("Cpus_allowed_list:"), "{agent}");
    let _busy = Busy::start();
    for _ in 0..20 {
        // The shell, two processes it starts at once, and a grandchild: all must
        // have the agent's mask.
        let r = sb
            .sh(
                "sleep 2 & a=$!; sh -c 'sleep 2 & echo $!; wait' > /tmp/g & b=$!; \
                 while [ ! -s /tmp/g ]; do :; done; \
                 for p in $$ $a $b $(cat /tmp/g); do grep Cpus_allowed_list /proc/$p/status; done; \
                 kill $a $b $(cat /tmp/g); rm /tmp/g",
            )
            .await;
        let out = r.stdout.text_lossy();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out} {r:?}");
        for line in lines {
            assert_eq!(
                format!("{line}\n"),
                agent,
                "a command's process kept a pinned mask"
            );
        }
    }
}
