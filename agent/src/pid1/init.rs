//! PID 1 as programs expect it: a tiny, dumpable init beside a protected agent.
//!
//! Programs inside a container expect PID 1 to carry the image's environment
//! (`kubectl exec` and Orchard's tool check read the image's PATH from
//! `/proc/1/environ`) and to adopt and reap orphans. The agent, though, must be
//! non-dumpable: its memory holds the sandbox token and its descriptors the control
//! channel, and a dumpable process can be ptraced, have its descriptors taken
//! (`pidfd_getfd`) and its `/proc/PID/environ` read by the sandbox's root. One process
//! cannot be both, so the agent started as PID 1 splits itself in two ([`split`]):
//!
//! - the **child** keeps everything the agent was given (token, listening socket,
//!   environment) and stays non-dumpable (the flag survives `fork`): it is the agent;
//! - the **parent**, still PID 1, closes every descriptor but stdio and re-executes the
//!   same binary as `orchard-agent --pid1-init <agent pid>` with the environment minus
//!   the agent's own variables (`ORCHARD_AGENT_*`, the token among them). `execve`
//!   replaces its memory, so nothing secret is left in it, and makes it dumpable again,
//!   so `/proc/1/environ` is readable and holds exactly the image's environment.
//!
//! The init ([`run_init`]) holds nothing worth stealing: no token, no socket, stdio on
//! `/dev/null`. It reaps every orphan (they are reparented to it, so `getppid() == 1`
//! means what programs think it means), forwards SIGTERM and SIGINT to the agent, and
//! exits with the agent's status when the agent ends, which ends the sandbox as before.
//! Other signals stay ignored, as they were for the agent as PID 1.
//!
//! The signals the init waits for are blocked before the `fork` and stay blocked across
//! its `execve`, so one arriving meanwhile waits in the queue instead of being dropped.
//! If the re-execution fails, the parent runs the same loop in place: PID 1's duties are
//! kept, only `/proc/1/environ` stays unreadable (the process is still non-dumpable).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicBool, Ordering};

/// The argument that starts the init loop instead of the agent.
pub const INIT_FLAG: &str = "--pid1-init";

/// Prefix of the variables meant for the agent alone; the init's environment, which is
/// what `/proc/1/environ` shows, has none of them.
pub const AGENT_VAR_PREFIX: &str = "ORCHARD_AGENT_";

/// Name the init gives itself (`comm`, as `ps` shows it), telling it from the agent.
const INIT_NAME: &str = "orchard-init";

/// Set in the agent when it was forked by [`split`]: its parent is the sandbox's init.
static UNDER_INIT: AtomicBool = AtomicBool::new(false);

/// Whether this agent runs beside the init of [`split`] (then the init, not the agent,
/// is PID 1 and adopts orphans).
pub fn under_init() -> bool {
    UNDER_INIT.load(Ordering::Relaxed)
}

/// Whether this process, or the init beside it, carries PID 1's duties.
pub fn owns_pid1() -> bool {
    std::process::id() == 1 || under_init()
}

/// The environment of the init: this process's minus the agent's own variables.
pub fn init_env(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<CString> {
    vars.into_iter()
        .filter(|(k, _)| !k.as_bytes().starts_with(AGENT_VAR_PREFIX.as_bytes()))
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect()
}

/// The signals the init waits for; blocked in the init, and nowhere else.
fn init_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset and sigaddset only write the set they are given, which is a
    // plain value owned here.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Sets the signal mask of this (single-threaded) process; answers the old mask.
fn set_mask(how: libc::c_int, set: &libc::sigset_t) -> libc::sigset_t {
    // SAFETY: both pointers are to valid sigsets owned by this frame.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(how, set, &mut old);
        old
    }
}

/// When this process is PID 1, splits it into the init (this process, which never
/// returns from here) and the agent (the child, which returns and goes on serving).
/// Anywhere else it does nothing. Call first thing in `main`, while the process is
/// single-threaded and before the token is read.
pub fn split() {
    if std::process::id() != 1 {
        return;
    }
    // Everything the init needs is prepared before the fork.
    let env = init_env(std::env::vars_os());
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| CString::new(p.into_os_string().into_vec()).ok());
    let argv0 = std::env::args_os()
        .next()
        .and_then(|a| CString::new(a.into_vec()).ok())
        .unwrap_or_else(|| c"orchard-agent".to_owned());
    let blocked = init_signals();
    let old_mask = set_mask(libc::SIG_BLOCK, &blocked);
    // SAFETY: the process is single-threaded (called first in `main`), so the child is
    // a complete copy and may go on running Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        // No init then: the agent stays PID 1 and does its duties itself.
        set_mask(libc::SIG_SETMASK, &old_mask);
        return;
    }
    if pid == 0 {
        UNDER_INIT.store(true, Ordering::Relaxed);
        set_mask(libc::SIG_SETMASK, &old_mask);
        return;
    }
    close_from(3);
    if let Some(exe) = exe {
        let args = [
            argv0,
            CString::new(INIT_FLAG).unwrap_or_default(),
            CString::new(pid.to_string()).unwrap_or_default(),
        ];
        exec(&exe, &args, &env);
    }
    // Only when the re-execution failed.
    std::process::exit(init_loop(pid));
}

/// `execve(exe, args, env)`; returns only when it failed.
fn exec(exe: &CString, args: &[CString], env: &[CString]) {
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: every pointer is to a NUL-terminated string that outlives the call, and
    // both arrays end with a null pointer.
    unsafe {
        libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
    }
}

/// Closes every descriptor from `first` up: the init must hold nothing of the agent's.
fn close_from(first: u32) {
    // SAFETY: close_range only closes descriptors; none of those from 3 up is used by
    // this process again (it is about to execve, or runs the init loop, which opens
    // what it needs itself).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if r == 0 {
        return;
    }
    // Kernels before 5.9: one by one, up to the limit of open files.
    let max = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1024)
        .min(1 << 20);
    for fd in first as u64..max {
        // SAFETY: as above; closing a number that is not open is harmless (EBADF).
        unsafe { libc::close(fd as libc::c_int) };
    }
}

/// `orchard-agent --pid1-init PID`: the init loop, for the agent `PID`. Answers the
/// process's exit code; refuses to run anywhere but as PID 1.
pub fn run_init(args: &[OsString]) -> i32 {
    let agent = args
        .get(2)
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse::<libc::pid_t>().ok());
    let Some(agent) = agent.filter(|p| *p > 1) else {
        eprintln!("orchard-agent: usage: {INIT_FLAG} AGENT_PID");
        return 2;
    };
    if std::process::id() != 1 {
        eprintln!("orchard-agent: {INIT_FLAG} runs only as PID 1");
        return 2;
    }
    init_loop(agent)
}

/// Puts stdio on `/dev/null` (or closes it): the init writes nothing, and the agent's
/// log, which its stdio lead to, must not be writable through `/proc/1/fd`.
fn detach_stdio() {
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    for fd in 0..3 {
        // SAFETY: only the numbers 0 to 2 are replaced or closed; nothing in the init
        // uses them afterwards.
        unsafe {
            match &null {
                Ok(n) => {
                    libc::dup2(std::os::fd::AsRawFd::as_raw_fd(n), fd);
                }
                Err(_) => {
                    libc::close(fd);
                }
            }
        }
    }
}

/// Waits for signals, reaps, forwards; answers the agent's exit as an exit code.
fn init_loop(agent: libc::pid_t) -> i32 {
    detach_stdio();
    let _ = rustix::thread::set_name(&CString::new(INIT_NAME).unwrap_or_default());
    // Lowering needs CAP_SYS_RESOURCE; the init is as vital as the agent.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-998");
    let set = init_signals();
    set_mask(libc::SIG_BLOCK, &set);
    loop {
        if let Some(code) = reap(agent) {
            return code;
        }
        // SAFETY: `set` is a valid sigset; the siginfo out-pointer may be null.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if sig == libc::SIGTERM || sig == libc::SIGINT {
            // SAFETY: kill only sends a signal, to the agent this init started.
            unsafe { libc::kill(agent, sig) };
        }
    }
}

/// Reaps every child that has exited; answers the exit code once the agent is among
/// them (or when no child is left at all, which means the agent is gone).
fn reap(agent: libc::pid_t) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into the int given.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid == agent {
            return Some(if libc::WIFSIGNALED(status) {
                128 + libc::WTERMSIG(status)
            } else {
                libc::WEXITSTATUS(status)
            });
        }
        if pid == 0 {
            return None;
        }
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // ECHILD: the agent was reaped by nobody else, so it cannot exist.
            return (e.raw_os_error() == Some(libc::ECHILD)).then_some(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_environment_keeps_the_images_and_drops_the_agents_variables() {
        let vars = [
            ("PATH", "/usr/local/bin:/usr/bin"),
            ("HOME", "/root"),
            ("LANG", "C.UTF-8"),
            ("ORCHARD_AGENT_TOKEN", "secret-token-123456"),
            ("ORCHARD_AGENT_LOG", "debug"),
            ("ORCHARD_OTHER", "kept"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env: Vec<String> = init_env(vars)
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect();
        assert_eq!(
            env,
            [
                "PATH=/usr/local/bin:/usr/bin",
                "HOME=/root",
                "LANG=C.UTF-8",
                "ORCHARD_OTHER=kept"
            ]
        );
    }

    #[test]
    fn the_init_refuses_bad_arguments_and_any_pid_but_1() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(run_init(&args(&["orchard-agent", INIT_FLAG])), 2);
        assert_eq!(run_init(&args(&["orchard-agent", INIT_FLAG, "x"])), 2);
        assert_eq!(run_init(&args(&["orchard-agent", INIT_FLAG, "1"])), 2);
        // A test binary is never PID 1.
        assert_eq!(run_init(&args(&["orchard-agent", INIT_FLAG, "42"])), 2);
    }

    #[test]
    fn split_does_nothing_outside_pid_1() {
        split();
        assert!(!under_init());
    }
}
