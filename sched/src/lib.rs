//! Short scheduler slices for the threads that answer requests (the agent's and the
//! server's).
//!
//! Why: when every core runs something CPU-bound at the same nice level (a build, a
//! busy sandbox), a thread woken by a request is usually not allowed to preempt the
//! running task until that task's slice is used up, and the kernel only notices that
//! at its tick: 4 ms at `HZ=250`. A call that needs two or three wake-ups (the request,
//! the child's exit, the answer) then takes 4 or 8 ms while the command took 0.1 ms.
//!
//! Linux 6.12 and later (EEVDF custom slices) let a `SCHED_OTHER` thread ask for a
//! shorter slice through `sched_attr.sched_runtime` (0.1–100 ms, no privilege needed
//! for one's own threads); a waking thread whose slice is shorter than the running
//! task's preempts it at once (the `PREEMPT_SHORT` scheduler feature). The weight, and
//! so the share of CPU, is unchanged: this buys latency, not CPU. Threads and processes
//! forked afterwards inherit the slice, which is what a short command wants too.
//! Older kernels ignore the field for `SCHED_OTHER`; other errors are reported, never
//! fatal.
//!
//! There is no wrapper in `libc` or `rustix` for `sched_getattr`/`sched_setattr`, so the
//! two system calls are made here, with the kernel's own struct layout.

use std::io;
use std::time::Duration;

/// The slice asked for by default: the kernel's minimum.
pub const LATENCY_SLICE: Duration = Duration::from_micros(100);

/// `struct sched_attr` (`SCHED_ATTR_SIZE_VER1`: 56 bytes, with the utilization clamps).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

fn get_attr() -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: `attr` is a valid, writable `sched_attr` of `size` bytes; pid 0 is the
    // calling thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            size,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Asks the scheduler to give the calling thread slices of `slice` (clamped by the
/// kernel to 0.1–100 ms), keeping its policy and nice value. A thread under a real-time
/// or idle policy is left alone. `Duration::ZERO` returns to the kernel's default.
pub fn set_thread_slice(slice: Duration) -> io::Result<()> {
    let mut attr = get_attr()?;
    if attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH {
        return Ok(());
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    // The utilization clamps are only applied with their flags; keep flags clear
    // except reset-on-fork, which `sched_getattr` reports and `sched_setattr` accepts.
    attr.sched_flags &= 0x01;
    attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    attr.sched_deadline = 0;
    attr.sched_period = 0;
    // SAFETY: `attr` is a valid `sched_attr` of `attr.size` bytes; pid 0 is the calling
    // thread.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The nice value of the server's background threads, and so of what they start
/// (runc, a sandbox until it is ready) and of the bulk work of big reads: a request
/// thread at nice 0 weighs about ten times as much, so a tenant's burst of background
/// work leaves the cores to other tenants' calls (issue 30).
pub const BACKGROUND_NICE: i32 = 10;

/// Makes the calling thread a background thread: the kernel's default slice (so a
/// request thread, with its short one, preempts it on waking) and nice
/// [`BACKGROUND_NICE`]. Processes it starts afterwards inherit both, with no work
/// between their fork and exec. Both are tried; the first error is answered.
pub fn make_background_thread() -> io::Result<()> {
    let slice = set_thread_slice(Duration::ZERO);
    // On Linux a process priority with no pid is the calling thread's.
    let nice = rustix::process::setpriority_process(None, BACKGROUND_NICE).map_err(io::Error::from);
    slice.and(nice)
}

/// The calling thread's slice as the kernel reports it: the default slice when none was
/// asked for; `None` where the kernel reports none (before custom slices, it answers 0).
pub fn thread_slice() -> io::Result<Option<Duration>> {
    let attr = get_attr()?;
    Ok((attr.sched_runtime > 0).then(|| Duration::from_nanos(attr.sched_runtime)))
}

/// The nice level asked for the server's scheduling group by default (see
/// [`set_autogroup_nice`]): the weight of about nine busy sandboxes.
pub const SERVER_GROUP_NICE: i32 = -10;

/// Where the kernel shows, and takes, the nice level of the calling process's autogroup.
const AUTOGROUP: &str = "/proc/self/autogroup";

/// Why the server's scheduling group gets more weight: the local backend's sandboxes are
/// cgroups beside the server's autogroup, each with the default weight, so with a
/// hundred busy sandboxes the server, through which every call passes, got a hundredth
/// share and spent two thirds of its time runnable but waiting (measured with 256
/// clients on 2 cores: 5 to 8% of the machine idle while every client waited on it).
/// A nice of -10 weighs as much as about nine busy sandboxes: calls stop queueing behind
/// the server (the idle time went, +15 to 25% compatible execs per second) while a
/// server busy with its own work (unpacking an image) cannot take more than that share
/// from sandboxes that need the CPU.
///
/// Sets the nice level of the calling process's autogroup (the scheduling group of its
/// session, used while it is in the root CPU cgroup). Only a session leader does this,
/// so that a server started from a shell does not raise the whole terminal session with
/// it: answers `Ok(false)` and changes nothing otherwise, or when the kernel has no
/// autogroups.
pub fn set_autogroup_nice(nice: i32) -> io::Result<bool> {
    if !is_session_leader() {
        return Ok(false);
    }
    match std::fs::write(AUTOGROUP, nice.to_string()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the calling process leads its session.
///
/// `getsid` answers 0 when the session's leader lives outside the caller's PID namespace
/// (a server in a container started by a runtime that did not make it a leader), so the
/// answer is read raw: rustix's `getsid` takes it for a `Pid`, which must not be 0, and
/// panicked there in debug builds (every `orchard serve` of the CI's containers).
fn is_session_leader() -> bool {
    // SAFETY: getsid(0) only reads the caller's session id.
    let sid = unsafe { libc::getsid(0) };
    sid > 0 && sid == rustix::process::getpid().as_raw_nonzero().get()
}

/// The nice level of the calling process's autogroup (`/autogroup-N nice K`), if the
/// kernel has autogroups.
pub fn autogroup_nice() -> Option<i32> {
    let text = std::fs::read_to_string(AUTOGROUP).ok()?;
    text.split_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_nice_value_and_gets_the_slice_where_the_kernel_has_them() {
        std::thread::spawn(|| {
            // PRIO_PROCESS with pid 0 is the calling thread on Linux.
            rustix::process::setpriority_process(None, 3).unwrap();
            set_thread_slice(LATENCY_SLICE).unwrap();
            let nice = rustix::process::getpriority_process(None).unwrap();
            assert_eq!(nice, 3, "the slice request must not reset the nice value");
            match thread_slice().unwrap() {
                // A kernel with custom slices reports what was asked.
                Some(s) => assert_eq!(s, LATENCY_SLICE),
                None => eprintln!("this kernel has no custom slices"),
            }
            set_thread_slice(Duration::ZERO).unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn threads_spawned_after_the_request_inherit_the_slice() {
        std::thread::spawn(|| {
            set_thread_slice(Duration::from_micros(300)).unwrap();
            let Some(_) = thread_slice().unwrap() else {
                eprintln!("this kernel has no custom slices");
                return;
            };
            let child = std::thread::spawn(|| thread_slice().unwrap())
                .join()
                .unwrap();
            assert_eq!(
                child,
                Some(Duration::from_micros(300)),
                "a new thread inherits the slice"
            );
        })
        .join()
        .unwrap();
    }

    /// Runs this test binary's helper test `name` (with `wrap` before it, if any).
    fn run_helper(wrap: &[&str], name: &str) -> std::io::Result<std::process::Output> {
        let exe = std::env::current_exe()?;
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut cmd = std::process::Command::new(first);
                cmd.args(rest).arg(exe);
                cmd
            }
            None => std::process::Command::new(exe),
        };
        cmd.args(["--exact", &format!("tests::{name}"), "--nocapture"])
            .env("ORCHARD_SCHED_HELPER", "1")
            .output()
    }

    #[test]
    fn only_a_session_leader_sets_its_autogroups_nice_level() {
        // The test harness is not a session leader (it runs under cargo): nothing changes.
        if !is_session_leader() {
            let before = autogroup_nice();
            assert!(!set_autogroup_nice(5).unwrap());
            assert_eq!(
                autogroup_nice(),
                before,
                "the shell's session was left alone"
            );
        }
        if autogroup_nice().is_none() {
            eprintln!("this kernel has no autogroups");
            return;
        }
        // A leader of its own session does: this test binary again, running the helper
        // below in a new session (a lower priority needs no privilege).
        let out = run_helper(&[], "session_leader_helper").unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("autogroup nice 7"), "{text}");
    }

    /// Run by the test above only: a new session, then the nice level asked and read.
    #[test]
    fn session_leader_helper() {
        if std::env::var_os("ORCHARD_SCHED_HELPER").is_none() {
            return;
        }
        rustix::process::setsid().unwrap();
        assert!(set_autogroup_nice(7).unwrap());
        println!("autogroup nice {}", autogroup_nice().unwrap());
    }

    #[test]
    fn regression_a_process_whose_session_leader_is_outside_its_pid_namespace_is_no_leader() {
        // This test binary again, as the first process of a new PID namespace: its
        // session's leader (this process's session) is outside, so getsid answers 0.
        let wrap = ["unshare", "--pid", "--fork", "--kill-child", "--"];
        let out = match run_helper(&wrap, "outside_namespace_helper") {
            Ok(out) => out,
            Err(e) => return eprintln!("unshare cannot run here: {e}"),
        };
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("Operation not permitted") {
            return eprintln!("no new PID namespaces here: {err}");
        }
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("no leader, nothing set"), "{text}\n{err}");
    }

    /// Run by the test above only.
    #[test]
    fn outside_namespace_helper() {
        if std::env::var_os("ORCHARD_SCHED_HELPER").is_none() {
            return;
        }
        // SAFETY: getsid(0) only reads the caller's session id.
        assert_eq!(unsafe { libc::getsid(0) }, 0, "the leader is outside");
        assert!(!set_autogroup_nice(7).unwrap());
        println!("no leader, nothing set");
    }
}
