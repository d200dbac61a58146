//! Where a new command starts: on the CPU of the agent thread that starts it.
//!
//! Why: when every core is busy (a build, a busy sandbox), a command started by the
//! agent waited for the scheduler's tick (4 ms at `HZ=250`) in about one call in
//! twenty, while the agent's own threads no longer did ([`orchard_sched`]). The kernel
//! places a new process on the least loaded CPU, at fork and again at exec. There the
//! sandbox's cgroup has had little recent load, so its scheduling entity on that CPU
//! has a small weight, and the little it ran there before counts as a large debt
//! (negative lag): it is not eligible to preempt the task running there, and waits
//! for that task's slice to end, which is noticed at the tick. On the CPU the agent
//! thread is on, the sandbox's entity is the one running and the child runs as soon as
//! the agent waits for it. Measured on one sandbox with a busy loop pinned to each of
//! the two cores, exec `true` p99 went from 4–8x p50 (a third of the calls over 2 ms)
//! to 1.5x (one or two calls in 600). What remains in the full scale bench (4–5x) is
//! the agent's and the server's own wake-ups (`docs/scale.md`).
//!
//! Only when no CPU is idle: when one is, the kernel's choice is right (the child starts
//! there at once, in parallel with the agent), and pinning cost 0.2 ms at p50.
//!
//! How: the spawning thread pins itself to its CPU for the length of the spawn, so the
//! child inherits the one-CPU mask through fork and exec (exec balancing cannot move
//! it). Once the spawn returns (the child has exec'd), the child gets the thread's
//! original mask back, and so does the thread.
//!
//! Keeping commands off the one-CPU mask: a thread or process the command created
//! before its mask came back would have inherited it, so after the child, its threads
//! and descendants are checked too: each task is restored before its own children are
//! listed, so a task created meanwhile inherits a restored mask, and passes repeat
//! until one restores nothing. Only descendants whose mask is exactly the one-CPU mask
//! are touched. Usually the child has not run yet when it is restored (the agent
//! thread is woken by the exec on the same CPU and runs first), and a pass is one
//! directory listing and a read per thread. Known gap: a process whose parent exits in
//! those microseconds is reparented to the agent and not found. Commands run as
//! another user are never pinned (giving their mask back needs CAP_SYS_NICE), and if
//! giving a mask back ever fails, pinning stops for the agent's life.

use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::Pid;
use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};

/// Set when a command's mask could not be given back: pinning stops for good.
static DISABLED: AtomicBool = AtomicBool::new(false);

/// Tasks checked at most when restoring a command's tree (a fork bomb in the window of
/// a few microseconds is not worth more).
const MAX_TASKS: usize = 256;

/// The calling thread pinned to its current CPU until dropped.
#[derive(Debug)]
pub struct Pin {
    saved: CpuSet,
    pinned: CpuSet,
}

impl Pin {
    /// Pins the calling thread to the CPU it is on when no CPU is idle; `None`
    /// (nothing changed) otherwise.
    pub fn when_busy() -> Option<Pin> {
        if DISABLED.load(Ordering::Relaxed) {
            return None;
        }
        let saved = sched_getaffinity(None).ok()?;
        let cpus = saved.count();
        if cpus <= 1 || !all_busy(cpus) {
            return None;
        }
        Pin::on_current_cpu(saved)
    }

    /// Pins the calling thread to the CPU it is on; `None` (nothing changed) when it
    /// may run on one CPU only anyway or the kernel refuses.
    pub fn current_cpu() -> Option<Pin> {
        let saved = sched_getaffinity(None).ok()?;
        if saved.count() <= 1 {
            return None;
        }
        Pin::on_current_cpu(saved)
    }

    /// Pins the calling thread, whose mask `saved` allows more than one CPU, to the CPU
    /// it is on.
    fn on_current_cpu(saved: CpuSet) -> Option<Pin> {
        let mut pinned = CpuSet::new();
        pinned.set(sched_getcpu());
        sched_setaffinity(None, &pinned).ok()?;
        Some(Pin { saved, pinned })
    }

    /// Gives `child` (just started under this pin), and anything it started since,
    /// the thread's original mask back.
    pub fn release(&self, child: i32) {
        let Some(pid) = Pid::from_raw(child) else {
            return;
        };
        match sched_setaffinity(Some(pid), &self.saved) {
            Ok(()) => {}
            // Gone already is fine: nothing of it can keep the mask.
            Err(rustix::io::Errno::SRCH) => return,
            Err(e) => {
                // The command keeps the one-CPU mask: never pin again.
                DISABLED.store(true, Ordering::Relaxed);
                tracing::warn!(error = %e, pid = child, "cannot give a command its CPU mask back; commands now start where the kernel puts them");
                return;
            }
        }
        let mut budget = MAX_TASKS;
        while budget > 0 && self.restore_descendants(child, &mut budget) > 0 {}
    }

    /// One pass over `pid`'s threads and, recursively, their children, restoring the
    /// pinned ones; answers how many were restored.
    fn restore_descendants(&self, pid: i32, budget: &mut usize) -> usize {
        let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return 0;
        };
        let mut restored = 0;
        for tid in threads.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            if tid != pid {
                restored += usize::from(self.restore_if_pinned(tid));
            }
            let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children"))
            else {
                continue;
            };
            for c in children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if self.restore_if_pinned(c) {
                    restored += 1;
                }
                restored += self.restore_descendants(c, budget);
            }
        }
        restored
    }

    /// Restores `tid` when its mask is the one-CPU mask this pin set.
    fn restore_if_pinned(&self, tid: i32) -> bool {
        let Some(pid) = Pid::from_raw(tid) else {
            return false;
        };
        match sched_getaffinity(Some(pid)) {
            Ok(mask) if mask == self.pinned => sched_setaffinity(Some(pid), &self.saved).is_ok(),
            _ => false,
        }
    }
}

/// Whether at least `cpus` other tasks are runnable on the machine right now (the
/// fourth field of `/proc/loadavg`, which counts the caller too), so that no CPU is
/// idle. When one is, the kernel's choice is right: the child starts there at once,
/// in parallel with the agent, and pinning it would make it wait for the agent.
fn all_busy(cpus: u32) -> bool {
    use std::os::unix::fs::FileExt;
    static LOADAVG: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let Some(file) = LOADAVG.get_or_init(|| std::fs::File::open("/proc/loadavg").ok()) else {
        return false;
    };
    let mut buf = [0u8; 128];
    let Ok(n) = file.read_at(&mut buf, 0) else {
        return false;
    };
    runnable(&buf[..n]).is_some_and(|r| r > cpus)
}

/// The runnable count of a `/proc/loadavg` line ("0.50 0.40 0.30 3/250 1234").
fn runnable(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    let field = line.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

impl Drop for Pin {
    fn drop(&mut self) {
        // Best effort: a refusal would leave this thread on one CPU, which is only
        // slower; the kernel does not refuse a mask it allowed before.
        let _ = sched_setaffinity(None, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn the_runnable_count_is_read_from_loadavg() {
        assert_eq!(runnable(b"0.50 0.40 0.30 3/250 1234\n"), Some(3));
        assert_eq!(runnable(b"garbage"), None);
    }

    fn mask_of(pid: i32) -> CpuSet {
        sched_getaffinity(Pid::from_raw(pid)).unwrap()
    }

    #[test]
    fn a_child_starts_on_the_threads_cpu_and_it_and_its_children_get_the_mask_back() {
        std::thread::spawn(|| {
            let before = sched_getaffinity(None).unwrap();
            let Some(pin) = Pin::current_cpu() else {
                eprintln!("one CPU only: nothing to pin");
                return;
            };
            assert_eq!(sched_getaffinity(None).unwrap().count(), 1);
            // A child that starts a grandchild (a thread-holding `sleep`) at once, and
            // tells us when it has, before the release: the window the walk covers.
            let mut child = Command::new("sh")
                .args(["-c", "sleep 5 & echo $!; wait"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(child.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            let grandchild: i32 = line.trim().parse().unwrap();
            assert_eq!(mask_of(grandchild).count(), 1, "inherited the pin");
            pin.release(pid);
            drop(pin);
            assert_eq!(mask_of(pid), before, "the child");
            assert_eq!(mask_of(grandchild), before, "the grandchild");
            assert_eq!(sched_getaffinity(None).unwrap(), before, "the thread");
            let _ = Command::new("kill").arg(grandchild.to_string()).status();
            let _ = child.wait();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_mask_the_command_chose_itself_is_left_alone() {
        std::thread::spawn(|| {
            let Some(pin) = Pin::current_cpu() else {
                return;
            };
            let mut child = Command::new("sleep").arg("5").spawn().unwrap();
            let pid = child.id() as i32;
            // The command's own choice: every CPU but the pinned one.
            let mut own = pin.saved;
            for cpu in 0..CpuSet::MAX_CPU {
                if pin.pinned.is_set(cpu) {
                    own.unset(cpu);
                }
            }
            sched_setaffinity(Pid::from_raw(pid), &own).unwrap();
            assert!(
                !pin.restore_if_pinned(pid),
                "a mask other than the pin is kept"
            );
            assert_eq!(mask_of(pid), own);
            drop(pin);
            let _ = child.kill();
            let _ = child.wait();
        })
        .join()
        .unwrap();
    }
}
