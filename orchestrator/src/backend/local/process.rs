//! Host processes the backend is responsible for (container inits, slirp4netns), named
//! by pid *and* start time so a recycled pid is never signalled by mistake, and waited
//! for whether or not they are our children.
//!
//! The backend makes its process a child subreaper: `runc create` exits once the
//! container is set up, and its init is then re-parented to us instead of to the
//! machine's PID 1, so we can reap it the moment it dies. A process whose parent we are
//! not (a sandbox adopted after a restart whose init went to PID 1) is waited for by
//! watching `/proc` until it is gone or a zombie; reaping it is then its parent's job.
//!
//! Invariant (issue 30, a connection flood deleted every sandbox): a failed read of
//! `/proc` (out of descriptors, `EIO`) is never taken for a dead process. Only
//! `ENOENT`/`ESRCH` (no such pid), another process under the pid, or a zombie is
//! evidence that a process stopped; anything else is [`Liveness::Unknown`].

use std::fs;
use std::io;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};
use serde::{Deserialize, Serialize};

pub use crate::backend::Liveness;

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(5);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error("cannot become a child subreaper: {0}")]
    Subreaper(io::Error),
    /// The process did not exit in time.
    #[error("process {pid} ({what}) did not exit within {waited:?}")]
    StillRunning {
        /// Its pid.
        pid: i32,
        /// What it is.
        what: String,
        /// How long we waited.
        waited: Duration,
    },
}

/// Makes this process a child subreaper (see the module doc). Process-wide and
/// idempotent.
pub fn become_subreaper() -> Result<(), ProcessError> {
    // rustix passes the pid on as prctl's flag, so any `Some` turns the flag on.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| ProcessError::Subreaper(e.into()))
}

/// What `/proc/PID/stat` says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// `comm`.
    pub comm: String,
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: i32,
    /// Start time in clock ticks after boot.
    pub start_time: u64,
}

/// Reads `/proc/PID/stat`: `Ok(None)` only when the process does not exist; a read
/// that failed for any other reason (no descriptor left, `EIO`, an unparsable answer)
/// is an error, which callers must not take for "gone".
pub fn stat(pid: i32) -> io::Result<Option<Stat>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).map(Some).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat: unparsable"),
            )
        }),
        Err(e) if is_no_such_process(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a failed read of `/proc/PID/...` says the process is gone: the directory is
/// missing (`ENOENT`), or it went away while being read (`ESRCH`).
fn is_no_such_process(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

fn parse_stat(text: &str) -> Option<Stat> {
    // comm may hold spaces and parentheses: it ends at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); start time is field 22.
    Some(Stat {
        comm,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        start_time: rest.get(19)?.parse().ok()?,
    })
}

/// A process named by pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    /// Host pid.
    pub pid: i32,
    /// Start time (clock ticks after boot), telling it apart from a later process that
    /// got the same pid.
    pub start_time: u64,
}

impl ProcRef {
    /// The running process `pid`, if there is one (and `/proc` could be read).
    pub fn of(pid: i32) -> Option<ProcRef> {
        stat(pid).ok().flatten().map(|s| ProcRef {
            pid,
            start_time: s.start_time,
        })
    }

    /// Whether this very process still runs, has stopped (gone, another process under
    /// its pid, or a zombie), or cannot be told (the read of `/proc` failed).
    pub fn liveness(&self) -> Liveness {
        match stat(self.pid) {
            Ok(Some(s)) if s.start_time == self.start_time && s.state != 'Z' => Liveness::Running,
            Ok(_) => Liveness::Stopped,
            // Not logged here: the create's readiness loop asks every millisecond, and
            // the callers that act on it (reconciliation, adoption) say what they did.
            Err(_) => Liveness::Unknown,
        }
    }

    /// Whether this very process is known to run (an unreadable `/proc` says no: for
    /// callers that only act on a running process; see [`ProcRef::liveness`]).
    pub fn is_running(&self) -> bool {
        self.liveness() == Liveness::Running
    }

    /// Whether this very process still exists, zombie or not; `None` when `/proc`
    /// could not be read.
    fn exists(&self) -> Option<bool> {
        match stat(self.pid) {
            Ok(s) => Some(s.is_some_and(|s| s.start_time == self.start_time)),
            Err(_) => None,
        }
    }

    /// Sends `signal` if this is still the same process (not when that cannot be told:
    /// the pid may have been recycled).
    pub fn signal(&self, signal: Signal) {
        if let (Some(true), Some(pid)) = (self.exists(), Pid::from_raw(self.pid.max(0))) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    /// Reaps the process if it is our child and has exited; answers whether it is gone
    /// (reaped, or exited and not ours to reap, or no longer this process). When
    /// `/proc` cannot be read, it is not known to be gone.
    pub fn try_reap(&self) -> bool {
        match self.exists() {
            Some(false) => return true,
            Some(true) => {}
            None => return false,
        }
        let Some(pid) = Pid::from_raw(self.pid.max(0)) else {
            return true;
        };
        match rustix::process::waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some(_)) => true,
            // Not exited yet.
            Ok(None) => false,
            // ECHILD: not our child; it is gone for us once it stopped running.
            Err(_) => self.liveness() == Liveness::Stopped,
        }
    }

    /// Waits up to `limit` for the process to exit (reaping it when it is our child).
    pub async fn wait_exit(&self, limit: Duration, what: &str) -> Result<(), ProcessError> {
        let deadline = Instant::now() + limit;
        loop {
            if self.try_reap() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::StillRunning {
                    pid: self.pid,
                    what: what.to_string(),
                    waited: limit,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM, then SIGKILL after `grace`, then waits up to `limit` more.
    pub async fn terminate(
        &self,
        grace: Duration,
        limit: Duration,
        what: &str,
    ) -> Result<(), ProcessError> {
        self.signal(Signal::TERM);
        if self.wait_exit(grace, what).await.is_ok() {
            return Ok(());
        }
        self.signal(Signal::KILL);
        self.wait_exit(limit, what).await
    }
}

/// Pids of every process on the host.
pub fn all_pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Host pid of this process.
pub fn own_pid() -> i32 {
    std::process::id() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_handles_odd_comms() {
        let line = "42 (a) b (c)) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 1 2";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.comm, "a) b (c)");
        assert_eq!((s.state, s.ppid, s.start_time), ('S', 7, 123456));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S"), None);
    }

    #[test]
    fn our_own_process_is_running_and_a_wrong_start_time_is_not() {
        let me = ProcRef::of(own_pid()).unwrap();
        assert!(me.is_running());
        let other = ProcRef {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.is_running());
        // Signalling a process that is not the recorded one is a no-op.
        other.signal(Signal::KILL);
        assert!(other.try_reap());
    }

    #[tokio::test]
    // The children are waited for through ProcRef, which is what is under test.
    #[allow(clippy::zombie_processes)]
    async fn a_child_is_reaped_when_it_exits() {
        let child = std::process::Command::new("/bin/busybox")
            .args(["sleep", "0.05"])
            .spawn()
            .unwrap();
        let p = ProcRef::of(child.id() as i32).unwrap();
        p.wait_exit(Duration::from_secs(10), "sleep").await.unwrap();
        assert!(!matches!(stat(p.pid), Ok(Some(s)) if s.start_time == p.start_time));
        let child = std::process::Command::new("/bin/busybox")
            .args(["sleep", "100"])
            .spawn()
            .unwrap();
        let p = ProcRef::of(child.id() as i32).unwrap();
        p.terminate(Duration::from_millis(500), Duration::from_secs(5), "sleep")
            .await
            .unwrap();
        assert!(!p.is_running());
    }
}
