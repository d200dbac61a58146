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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

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
    /// Bumped on every spawn and SIGCHLD; the reaper thread sleeps on it when it has
    /// no child to wait for.
    generation: Mutex<u64>,
    /// Signalled with `generation`.
    wakeup: Condvar,
}

/// Held while spawning; register the child's pid before dropping it.
pub struct SpawnGuard<'a> {
    reaper: &'a Reaper,
    _read: RwLockReadGuard<'a, ()>,
}

impl SpawnGuard<'_> {
    /// Registers `pid` and returns the receiver of its exit.
    pub fn register(&self, pid: i32) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        self.reaper.lock_waiters().insert(pid, tx);
        self.reaper.wake();
        rx
    }
}

impl Reaper {
    /// A reaper with no waiters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes this process the reaper of its orphaned descendants when it is not PID 1,
    /// so that the agent behaves the same when run outside a sandbox.
    pub fn become_subreaper() {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integers.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
    }

    /// Takes the spawn lock; hold it across fork/exec and register the pid.
    pub fn spawn_guard(&self) -> SpawnGuard<'_> {
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
        let mut reaped = 0;
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            reaped += 1;
            match self.lock_waiters().remove(&pid) {
                Some(tx) => {
                    let _ = tx.send(Exit::from_raw(status));
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

    /// Starts the reaper: a dedicated thread that sleeps in `waitid(WNOWAIT)` until a
    /// child has exited, then reaps. A kernel wake-up of a blocked thread is the
    /// shortest path from a child's exit to its waiter, which is most of the latency
    /// of a short exec. SIGCHLD only wakes the thread when it had no child to wait on
    /// (an orphan was reparented to PID 1 in between). Call once, inside the runtime.
    pub fn spawn_loop(self: Arc<Self>) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigchld = signal(SignalKind::child())?;
        let waker = self.clone();
        tokio::spawn(async move {
            while sigchld.recv().await.is_some() {
                waker.wake();
            }
        });
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || self.thread_loop())?;
        Ok(())
    }

    fn thread_loop(&self) {
        loop {
            let seen = *self.lock_generation();
            // SAFETY: waitid with a zeroed siginfo out-parameter; WNOWAIT leaves the
            // child a zombie for `reap`, which does the collecting under the lock.
            let rc = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT)
            };
            if rc == 0 {
                self.reap();
                continue;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => {
                    // No child at all: sleep until one is spawned or SIGCHLD says an
                    // orphan arrived. The timeout bounds any missed wake-up.
                    let generation = self.lock_generation();
                    let _ = self
                        .wakeup
                        .wait_timeout_while(generation, Duration::from_secs(1), |g| *g == seen);
                }
            }
        }
    }

    fn lock_generation(&self) -> std::sync::MutexGuard<'_, u64> {
        self.generation.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the reaper thread if it sleeps for lack of children.
    fn wake(&self) {
        *self.lock_generation() += 1;
        self.wakeup.notify_all();
    }
}

#[cfg(test)]
mod tests {
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
        SHARED.get_or_init(Default::default).clone()
    }

    #[test]
    // The reaper collects the child, not `Child::wait`: that is what is under test.
    #[allow(clippy::zombie_processes)]
    fn registered_child_gets_its_status_even_when_reaped_by_the_loop() {
        let reaper = shared();
        let guard = reaper.spawn_guard();
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let mut rx = guard.register(child.id() as i32);
        drop(guard);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            reaper.reap();
            if let Ok(exit) = rx.try_recv() {
                assert_eq!(exit, Exit::Code(7));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "child never reaped");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
