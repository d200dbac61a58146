//! Child reaping for an agent that is PID 1 (or a subreaper).
//!
//! As PID 1 the agent inherits every orphan of the sandbox and must reap it, or zombies
//! pile up until the pids limit is hit. Reaping with `waitpid(-1)` would steal exit
//! statuses that the agent's own waits expect, so this module is the only place that
//! waits on children: it reaps everything and hands each status to whoever registered
//! that pid; statuses of unregistered pids (orphans) are dropped.
//!
//! The race to close is a child that exits before its pid is registered. Spawners hold
//! [`Reaper::spawn_lock`] for reading from before `fork` until the pid is registered;
//! the reaper holds it for writing while it calls `waitpid(-1)`. So a status is only
//! ever collected when its waiter is known, and the standard library's own `waitpid`
//! after a failed `exec` (inside `Command::spawn`) never finds the child already gone.
//!
//! Reaping runs on SIGCHLD, and also from the waiting task itself: each registered
//! child has a pidfd, which becomes readable when the child exits, and the task woken
//! by it reaps at once. That saves the signal's trip through the runtime, which is a
//! large part of the latency of a short exec.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use rustix::process::{waitpid, Pid, PidfdFlags, WaitOptions};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

/// How a process ended, decoded from a wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Exit {
    /// Decodes a raw `waitpid` status.
    pub fn from_raw(status: i32) -> Self {
        if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Code(libc::WEXITSTATUS(status))
        }
    }

    /// Exit code, if it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code(c) => Some(c),
            Exit::Signal(_) => None,
        }
    }

    /// Signal, if it was killed.
    pub fn signal(self) -> Option<i32> {
        match self {
            Exit::Signal(s) => Some(s),
            Exit::Code(_) => None,
        }
    }
}

/// The one owner of `waitpid` in the agent.
#[derive(Default)]
pub struct Reaper {
    /// Read-held by spawners from fork until registration; write-held while reaping.
    spawn_lock: RwLock<()>,
    /// Protects the pid -> waiter map; taken briefly by register and by reap.
    waiters: Mutex<HashMap<i32, oneshot::Sender<Exit>>>,
    /// Orphans reaped so far (children nobody registered).
    orphans_reaped: AtomicU64,
    /// Collect only registered children (`waitpid(pid)` each) instead of every child
    /// (`waitpid(-1)`): for a process that is not PID 1 and whose other code waits on
    /// children of its own, such as a test binary running the git CLI.
    only_registered: bool,
}

/// Held while spawning; register the child's pid before dropping it.
pub struct SpawnGuard<'a> {
    reaper: &'a Arc<Reaper>,
    _read: RwLockReadGuard<'a, ()>,
}

impl SpawnGuard<'_> {
    /// Registers `pid` and returns the waiter of its exit.
    pub fn register(&self, pid: i32) -> ExitWaiter {
        let (tx, rx) = oneshot::channel();
        self.reaper.lock_waiters().insert(pid, tx);
        ExitWaiter {
            rx,
            pidfd: pidfd_open(pid),
            reaper: self.reaper.clone(),
        }
    }
}

/// Opens a pidfd for `pid` and registers it with the runtime; `None` where pidfds are
/// unsupported (the SIGCHLD path then delivers the exit alone).
fn pidfd_open(pid: i32) -> Option<AsyncFd<OwnedFd>> {
    let pid = Pid::from_raw(pid.max(0))?;
    let owned = rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()?;
    // SAFETY: an OwnedFd stays open and keeps its number for as long as it is owned,
    // here by the AsyncFd.
    unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }.ok()
}

/// Resolves to a registered child's exit.
pub struct ExitWaiter {
    rx: oneshot::Receiver<Exit>,
    pidfd: Option<AsyncFd<OwnedFd>>,
    reaper: Arc<Reaper>,
}

impl ExitWaiter {
    /// Waits for the exit. Cancel-safe: dropping the future and calling again is fine.
    /// `None` only if the reaper vanished.
    pub async fn wait(&mut self) -> Option<Exit> {
        if let Some(pidfd) = &self.pidfd {
            tokio::select! {
                biased;
                exit = &mut self.rx => return exit.ok(),
                ready = pidfd.readable() => {
                    if ready.is_ok() {
                        // It has exited: reap now rather than wait for SIGCHLD's turn.
                        // If a spawn holds the lock, the SIGCHLD path delivers instead.
                        self.reaper.try_reap();
                    }
                    self.pidfd = None;
                }
            }
        }
        (&mut self.rx).await.ok()
    }
}

impl Reaper {
    /// A reaper with no waiters, collecting every child (PID 1's duty).
    pub fn new() -> Self {
        Self::default()
    }

    /// A reaper that collects only the children registered with it.
    pub fn only_registered() -> Self {
        Self {
            only_registered: true,
            ..Self::default()
        }
    }

    /// Makes this process the reaper of its orphaned descendants when it is not PID 1,
    /// so that the agent behaves the same when run outside a sandbox.
    pub fn become_subreaper() {
        // Best effort, as before: when it fails, orphans go to the real PID 1. (rustix
        // passes the pid on as prctl's flag, so any `Some` turns the flag on.)
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    }

    /// Takes the spawn lock; hold it across fork/exec and register the pid.
    pub fn spawn_guard(self: &Arc<Self>) -> SpawnGuard<'_> {
        let read = self.spawn_lock.read().unwrap_or_else(|p| p.into_inner());
        SpawnGuard {
            reaper: self,
            _read: read,
        }
    }

    fn lock_waiters(&self) -> std::sync::MutexGuard<'_, HashMap<i32, oneshot::Sender<Exit>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reaps every child that has exited, delivering registered statuses. Returns how
    /// many children were reaped.
    pub fn reap(&self) -> usize {
        let write = self.spawn_lock.write().unwrap_or_else(|p| p.into_inner());
        self.reap_locked(write)
    }

    /// Like [`Reaper::reap`], but `None` instead of waiting when a spawn is in flight.
    pub fn try_reap(&self) -> Option<usize> {
        match self.spawn_lock.try_write() {
            Ok(write) => Some(self.reap_locked(write)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(self.reap_locked(p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    fn reap_locked(&self, _write: std::sync::RwLockWriteGuard<'_, ()>) -> usize {
        if self.only_registered {
            let pids: Vec<i32> = self.lock_waiters().keys().copied().collect();
            let mut reaped = 0;
            for pid in pids {
                let Some(child) = Pid::from_raw(pid.max(0)) else {
                    continue;
                };
                if let Ok(Some((_, status))) = waitpid(Some(child), WaitOptions::NOHANG) {
                    reaped += 1;
                    if let Some(tx) = self.lock_waiters().remove(&pid) {
                        let _ = tx.send(Exit::from_raw(status.as_raw()));
                    }
                }
            }
            return reaped;
        }
        let mut reaped = 0;
        // `wait` is waitpid(-1): any child, whatever its process group. (rustix's
        // `waitpid(None)` is waitpid(0), this process's group only, which would never
        // collect the commands: each runs in a group of its own.) Until nothing more
        // has exited (`None`) or no children are left (ECHILD).
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            reaped += 1;
            match self.lock_waiters().remove(&pid.as_raw_pid()) {
                Some(tx) => {
                    let _ = tx.send(Exit::from_raw(status.as_raw()));
                }
                None => {
                    self.orphans_reaped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        reaped
    }

    /// Pids of registered children that have not been reaped yet.
    pub fn live_pids(&self) -> Vec<i32> {
        self.lock_waiters().keys().copied().collect()
    }

    /// Orphans reaped since start.
    pub fn orphans_reaped(&self) -> u64 {
        self.orphans_reaped.load(Ordering::Relaxed)
    }

    /// Reaps on every SIGCHLD, forever. Call once, from inside the runtime.
    pub fn spawn_loop(self: Arc<Self>) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigchld = signal(SignalKind::child())?;
        tokio::spawn(async move {
            loop {
                // A spawn holds the lock for one posix_spawn; yielding until it is done
                // is cheaper than moving the wait to a blocking thread.
                while self.try_reap().is_none() {
                    tokio::task::yield_now().await;
                }
                if sigchld.recv().await.is_none() {
                    break;
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn exit_decodes_codes_and_signals() {
        assert_eq!(Exit::from_raw(3 << 8), Exit::Code(3));
        assert_eq!(Exit::from_raw(9), Exit::Signal(9));
    }

    /// Every unit test that spawns must share this one reaper: two reapers in one
    /// process would steal each other's children.
    pub(crate) fn shared() -> std::sync::Arc<Reaper> {
        static SHARED: std::sync::OnceLock<std::sync::Arc<Reaper>> = std::sync::OnceLock::new();
        SHARED
            // Other tests (git) wait on children of their own: never waitpid(-1) here.
            .get_or_init(|| std::sync::Arc::new(Reaper::only_registered()))
            .clone()
    }

    #[tokio::test]
    // The reaper collects the child, not `Child::wait`: that is what is under test.
    #[allow(clippy::zombie_processes)]
    async fn a_waiter_gets_its_childs_status_through_the_pidfd() {
        let reaper = shared();
        let guard = reaper.spawn_guard();
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let mut waiter = guard.register(child.id() as i32);
        drop(guard);
        // No SIGCHLD loop runs in unit tests: only the pidfd path can deliver this.
        let exit = tokio::time::timeout(std::time::Duration::from_secs(10), waiter.wait())
            .await
            .expect("child never reaped");
        assert_eq!(exit, Some(Exit::Code(7)));
    }
}
