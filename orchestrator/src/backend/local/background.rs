//! Commands the local backend starts as background work (runc, `mkfs.ext4`): each in a
//! session of its own, so in an autogroup of its own, weighed at nice 19.
//!
//! Why (issue 30): where the server runs in the root CPU cgroup, each sandbox is a
//! cgroup beside the autogroups of sessions, and a group's weight does not depend on
//! the nice values inside it. runc and mkfs at nice 10 in the server's autogroup only
//! yielded to the server's own threads, while the group, them included, took its whole
//! weight against the running sandboxes: tenant A's 50 creates took the cores from
//! tenant B's sandbox (B's exec p99 19 to 29 ms against 2 ms quiet). In autogroups of
//! their own at nice 19 they weigh 15 each against a sandbox's 1024.
//!
//! It also runs under the `SCHED_IDLE` policy (util-linux's `chrt --idle 0`, when the
//! host has it), which its threads and children inherit: a task of a normal policy
//! that wakes preempts an idle one at once, where against runc at nice 19 tenant B's
//! agent still waited for the end of runc's slice (issue 30). runc's children, the
//! sandbox's init and agent, get the normal policy back when the sandbox is ready
//! (`cgroup::run_at_normal_priority`).
//!
//! The command is started through util-linux's `setsid` (when the host has it), with
//! nothing run between fork and exec, so the standard library uses `posix_spawn` (see
//! `runc.rs`). Where the server is not in the root CPU cgroup (a systemd service with
//! CPU accounting, a container), autogroups do not apply and the nice value inherited
//! from the starting thread does the work.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Where `setsid` is looked for.
const SETSID: [&str; 2] = ["/usr/bin/setsid", "/bin/setsid"];
/// Where `chrt` is looked for.
const CHRT: [&str; 2] = ["/usr/bin/chrt", "/bin/chrt"];
/// The nice value of a background command's autogroup.
const GROUP_NICE: &str = "19";
/// How long a started command is given to lead its session before its autogroup is
/// left alone (`setsid` calls it at once after its exec).
const SESSION_WAIT: Duration = Duration::from_millis(10);

/// The first of `places` that exists, looked for once (`found` keeps the answer).
fn tool(found: &'static OnceLock<Option<PathBuf>>, places: &[&str]) -> Option<&'static Path> {
    found
        .get_or_init(|| places.iter().map(PathBuf::from).find(|p| p.exists()))
        .as_deref()
}

/// The host's `setsid`, found once.
pub fn setsid() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    tool(&FOUND, &SETSID)
}

/// The host's `chrt`, found once.
fn chrt() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    tool(&FOUND, &CHRT)
}

/// What runs `program` as background work: `chrt --idle 0` and `setsid` where the
/// host has them, then the program; the first is what is spawned. `chrt` goes first:
/// once the command leads its session (what [`lower`] waits for), it is idle already.
fn wrapped(program: &Path) -> Vec<&Path> {
    let mut argv: Vec<&Path> = Vec::new();
    if let Some(chrt) = chrt() {
        argv.extend([chrt, Path::new("--idle"), Path::new("0")]);
    }
    argv.extend(setsid());
    argv.push(program);
    argv
}

/// `program` to be started as background work: through `setsid` and `chrt` when the
/// host has them.
pub fn command(program: &Path) -> tokio::process::Command {
    std_command(program).into()
}

/// [`command`] for a thread of its own (no runtime).
pub fn std_command(program: &Path) -> std::process::Command {
    let argv = wrapped(program);
    let mut cmd = std::process::Command::new(argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// Through `setsid` or `chrt` a missing program would be their failure (exit status 1),
/// not a spawn error: this answers the spawn error the caller would have had.
pub fn check_runnable(program: &Path) -> std::io::Result<()> {
    if wrapped(program).len() > 1 && !on_path(program) {
        return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
    }
    Ok(())
}

/// Weighs the autogroup of `pid`, started by [`command`], at nice 19, once it leads a
/// session of its own: before its `setsid`, its autogroup is still the server's, which
/// must not be touched.
pub async fn lower(pid: Option<u32>) {
    let Some(pid) = pid.filter(|_| setsid().is_some()) else {
        return;
    };
    let start = std::time::Instant::now();
    while start.elapsed() < SESSION_WAIT {
        if leads_session(pid) {
            return write_group_nice(pid);
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// [`lower`] for a thread of its own.
pub fn lower_blocking(pid: u32) {
    if setsid().is_none() {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < SESSION_WAIT {
        if leads_session(pid) {
            return write_group_nice(pid);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn write_group_nice(pid: u32) {
    // Best effort: a kernel without autogroups has no such file.
    let _ = std::fs::write(format!("/proc/{pid}/autogroup"), GROUP_NICE);
}

/// Whether `binary` names a file: itself if it has a `/`, else in a `PATH` directory.
fn on_path(binary: &Path) -> bool {
    if binary.components().count() > 1 {
        return binary.is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(binary).is_file()))
}

/// Whether process `pid` leads its session (field 6 of its stat, after the command's
/// name, which may hold spaces and parentheses, so read after its last `)`).
pub fn leads_session(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let session = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(3)?
                .to_string();
            session.parse::<u32>().ok()
        })
        == Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A background command runs in a session of its own, whose autogroup weighs nice
    /// 19, under the idle policy, and the caller's own autogroup is left as it was.
    #[tokio::test]
    async fn a_background_command_runs_in_a_session_and_autogroup_of_its_own() {
        if setsid().is_none() {
            eprintln!("no setsid here: commands run in the server's session");
            return;
        }
        let own = std::fs::read_to_string("/proc/self/autogroup").ok();
        let mut child = command(Path::new("sleep")).arg("30").spawn().unwrap();
        let pid = child.id().unwrap();
        lower(Some(pid)).await;
        assert!(leads_session(pid), "the command does not lead a session");
        if let Some(own) = own {
            let theirs = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).unwrap();
            assert!(theirs.trim_end().ends_with("nice 19"), "{theirs}");
            let ours = std::fs::read_to_string("/proc/self/autogroup").unwrap();
            assert_eq!(ours, own, "the caller's autogroup changed");
        }
        // SAFETY: sched_getscheduler only reads the policy of process `pid`.
        let policy = unsafe { libc::sched_getscheduler(pid as libc::pid_t) };
        if chrt().is_some() {
            assert_eq!(policy, libc::SCHED_IDLE, "the command is not SCHED_IDLE");
        }
        child.kill().await.unwrap();
        assert_eq!(
            check_runnable(Path::new("/no/such/tool"))
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
        check_runnable(Path::new("sleep")).unwrap();
    }
}
