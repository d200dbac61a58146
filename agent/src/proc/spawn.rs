//! Starting a command: turning a request into argv, and spawning it into its own process group
//! with pipes, a reset OOM score, and its exit registered with the [`Reaper`].
//!
//! Everything the agent runs goes through [`spawn`], so every process gets the same
//! treatment: its own process group (so a timeout can kill the whole group,
//! grandchildren included), an OOM score above the agent's (so a memory hog dies before PID 1), and
//! stdio the agent reads asynchronously. Commands run as the image's user when it has
//! one ([`crate::pid1::user`]); [`sh_quote`] quotes for the shells they run in.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use orchard_protocol::{Command, ErrorCode, ExecRequest};
use rustix::process::{Gid, Pid, Uid};
use tokio::net::unix::pipe;

use crate::error::ApiError;
use crate::pid1::user::run_as;
use crate::proc::placement::Pin;
use crate::proc::reaper::{ExitWaiter, Reaper};

/// Shell used for string commands when the request names none.
pub const DEFAULT_SHELL: &str = "/bin/sh";

/// PATH given to commands when the agent's own environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// An empty argv, or a NUL byte in an argument.
    #[error("{0}")]
    Invalid(String),
    /// A shell string was given but the shell does not exist.
    #[error("cannot run a shell command: {0} does not exist in this sandbox; pass the command as an argv array instead")]
    NoShell(String),
    /// The working directory does not exist or is not a directory.
    #[error("working directory {0} does not exist or is not a directory")]
    CwdNotFound(String),
    /// The program was not found or is not executable.
    #[error("cannot execute {program}: {reason}")]
    CommandNotFound {
        /// argv[0].
        program: String,
        /// What the OS said.
        reason: String,
    },
    /// fork or pipe creation failed (for example, the pids limit was reached).
    #[error("cannot start {program}: {reason}")]
    Failed {
        /// argv[0].
        program: String,
        /// What the OS said.
        reason: String,
    },
}

impl From<SpawnError> for ApiError {
    fn from(err: SpawnError) -> Self {
        let code = match &err {
            SpawnError::Invalid(_) => ErrorCode::InvalidArgument,
            SpawnError::NoShell(_) => ErrorCode::NoShell,
            SpawnError::CwdNotFound(_) => ErrorCode::CwdNotFound,
            SpawnError::CommandNotFound { .. } => ErrorCode::CommandNotFound,
            SpawnError::Failed { .. } => ErrorCode::SpawnFailed,
        };
        ApiError::new(code, err.to_string())
    }
}

/// A resolved command ready to start.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Variables added to the agent's environment (all of it with `clear_env`).
    pub env: BTreeMap<String, String>,
    /// Start from an empty environment instead of the agent's, so that `env` is all of
    /// it (a restored session gets back exactly the environment it had).
    pub clear_env: bool,
    /// Give the child a stdin pipe (else /dev/null).
    pub stdin_pipe: bool,
}

impl SpawnSpec {
    /// Resolves a request's command into argv, checking for the shell and the cwd.
    pub fn from_request(req: &ExecRequest, stdin_pipe: bool) -> Result<Self, SpawnError> {
        let argv = match &req.command {
            Command::Argv(argv) => {
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(SpawnError::Invalid("command must not be empty".into()));
                }
                argv.clone()
            }
            Command::Shell(script) => {
                let shell = req.shell.as_deref().unwrap_or(DEFAULT_SHELL);
                if !is_executable(Path::new(shell)) {
                    return Err(SpawnError::NoShell(shell.to_string()));
                }
                vec![shell.to_string(), "-c".to_string(), script.clone()]
            }
        };
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(SpawnError::Invalid(
                "arguments must not contain NUL bytes".into(),
            ));
        }
        if let Some(cwd) = &req.cwd {
            if !Path::new(cwd).is_dir() {
                return Err(SpawnError::CwdNotFound(cwd.clone()));
            }
        }
        Ok(Self {
            argv,
            cwd: req.cwd.clone(),
            env: req.env.clone(),
            clear_env: false,
            stdin_pipe,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A started command.
pub struct Spawned {
    /// Its pid, which is also its process-group id.
    pub pid: i32,
    /// Write end of its stdin, when piped.
    pub stdin: Option<pipe::Sender>,
    /// Read end of its stdout.
    pub stdout: pipe::Receiver,
    /// Read end of its stderr.
    pub stderr: pipe::Receiver,
    /// Resolves when the reaper collects it.
    pub exit: ExitWaiter,
    /// When it was started.
    pub started: Instant,
}

/// A `Command` for `spec` with its argv, environment and cwd; stdio is the caller's.
fn command(spec: &SpawnSpec) -> std::process::Command {
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]);
    if spec.clear_env {
        cmd.env_clear();
    } else if std::env::var_os("PATH").is_none() && !spec.env.contains_key("PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    cmd.envs(&spec.env);
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    if let Some(user) = run_as() {
        // The rustix calls are the raw system calls, which act on the calling thread
        // only: right in the child, which has just the one thread.
        let groups: Vec<Gid> = user.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        let (uid, gid) = (Uid::from_raw(user.uid), Gid::from_raw(user.gid));
        // SAFETY: runs between fork and exec and only makes the async-signal-safe
        // setgroups/setgid/setuid calls on data allocated before the fork. Done here
        // rather than with `CommandExt::uid`, which would clear the supplementary
        // groups. (Any pre_exec hook means fork instead of posix_spawn: images that run
        // as root keep the fast path.)
        unsafe {
            cmd.pre_exec(move || {
                rustix::thread::set_thread_groups(&groups)?;
                rustix::thread::set_thread_gid(gid)?;
                rustix::thread::set_thread_uid(uid)?;
                Ok(())
            });
        }
    }
    cmd
}

/// Spawns `cmd` with the spawn lock held and the children's OOM score, and registers it.
fn start(
    reaper: &Arc<Reaper>,
    spec: &SpawnSpec,
    cmd: &mut std::process::Command,
) -> Result<(std::process::Child, ExitWaiter), SpawnError> {
    let guard = reaper.spawn_guard();
    let window = OomWindow::open();
    // When no CPU is idle, the child starts on this thread's CPU and gets the full
    // mask back once it has exec'd ([`crate::proc::placement`]). Not for commands run as
    // another user: without CAP_SYS_NICE the agent could not give their mask back.
    let pin = if run_as().is_none() {
        Pin::when_busy()
    } else {
        None
    };
    let spawned = cmd.spawn();
    drop(window);
    let child = spawned.map_err(|err| spawn_error(&spec.argv[0], spec, &err))?;
    let exit = guard.register(child.id() as i32);
    drop(guard);
    if let Some(pin) = pin {
        pin.release(child.id() as i32);
    }
    Ok((child, exit))
}

/// Starts `spec` in its own process group, registered with `reaper`.
pub fn spawn(reaper: &Arc<Reaper>, spec: &SpawnSpec) -> Result<Spawned, SpawnError> {
    let program = &spec.argv[0];
    let mut cmd = command(spec);
    cmd.stdin(if spec.stdin_pipe {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // Its own process group, so a timeout kills grandchildren too. No pre_exec hook:
    // without one the standard library uses posix_spawn (vfork), which is what keeps
    // an exec of `true` close to the bare fork/exec floor.
    cmd.process_group(0);
    let (mut child, exit) = start(reaper, spec, &mut cmd)?;
    let pid = child.id() as i32;

    let started = Instant::now();
    let to_receiver = |fd: Option<OwnedFd>| -> Result<pipe::Receiver, SpawnError> {
        let fd = fd.ok_or_else(|| failed(program, "missing pipe"))?;
        pipe::Receiver::from_owned_fd(fd).map_err(|e| failed(program, &e.to_string()))
    };
    let stdout = to_receiver(child.stdout.take().map(OwnedFd::from));
    let stderr = to_receiver(child.stderr.take().map(OwnedFd::from));
    let stdin = child.stdin.take().map(|fd| {
        pipe::Sender::from_owned_fd(OwnedFd::from(fd)).map_err(|e| failed(program, &e.to_string()))
    });
    match (stdout, stderr, stdin.transpose()) {
        (Ok(stdout), Ok(stderr), Ok(stdin)) => Ok(Spawned {
            pid,
            stdin,
            stdout,
            stderr,
            exit,
            started,
        }),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            kill_group(pid, libc::SIGKILL);
            Err(e)
        }
    }
}

/// A program started on a new terminal.
pub struct SpawnedPty {
    /// Its pid, which is also its session id.
    pub pid: i32,
    /// The terminal's master side (non-blocking, close-on-exec).
    pub master: OwnedFd,
    /// Resolves when the reaper collects it.
    pub exit: ExitWaiter,
}

/// Starts `spec` as the session leader of a new terminal of `rows` x `cols`, with the
/// terminal as its controlling tty and stdio.
pub fn spawn_pty(
    reaper: &Arc<Reaper>,
    spec: &SpawnSpec,
    rows: u16,
    cols: u16,
) -> Result<SpawnedPty, SpawnError> {
    let program = &spec.argv[0];
    let (master, slave) = crate::sys::openpty(rows, cols).map_err(|err| {
        failed(
            program,
            &format!(
                "cannot open a terminal: {}",
                crate::error::describe_io(&err)
            ),
        )
    })?;
    // The agent reads the master side asynchronously.
    rustix::io::ioctl_fionbio(&master, true).map_err(|e| failed(program, &e.to_string()))?;
    let stdio = |fd: &OwnedFd| -> Result<Stdio, SpawnError> {
        fd.try_clone()
            .map(Stdio::from)
            .map_err(|e| failed(program, &e.to_string()))
    };
    let mut cmd = command(spec);
    cmd.stdin(stdio(&slave)?)
        .stdout(stdio(&slave)?)
        .stderr(stdio(&slave)?);
    if !spec.env.contains_key("TERM") {
        cmd.env("TERM", "xterm-256color");
    }
    // SAFETY: runs between fork and exec; only async-signal-safe system calls (setsid,
    // the TIOCSCTTY ioctl) on fd 0, which is open as the terminal's slave side by then.
    // (Not `std::io::stdin()`: its first use allocates, which a forked child must not.)
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
            Ok(())
        });
    }
    let (child, exit) = start(reaper, spec, &mut cmd)?;
    drop(slave);
    Ok(SpawnedPty {
        pid: child.id() as i32,
        master,
        exit,
    })
}

/// OOM scores: the agent's own (as it found it after trying to lower it to -998) and
/// the one its children get: 0 when the agent is below that, else 500 above the
/// agent's. Lowering needs CAP_SYS_RESOURCE, which containers rarely have; raising
/// needs nothing. Either way a memory hog ranks above PID 1 and dies first.
fn oom_scores() -> &'static (String, String) {
    static SCORES: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    SCORES.get_or_init(|| {
        let own = std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .unwrap_or(0);
        let child = if own < 0 { 0 } else { (own + 500).min(1000) };
        (own.to_string(), child.to_string())
    })
}

/// The OOM score children get.
pub fn child_oom_score() -> &'static str {
    &oom_scores().1
}

/// Spawns in flight; the first raises the agent's OOM score to the children's, the
/// last puts it back.
static SPAWNS_IN_FLIGHT: std::sync::Mutex<u32> = std::sync::Mutex::new(0);

/// While alive, the agent's OOM score is the children's, so posix_spawn (which has no
/// hook between fork and exec) starts every child with the right score already: a
/// score set after the spawn would race a child that forks at once. Going back down
/// is allowed without privilege because it only returns to the agent's own value.
struct OomWindow;

impl OomWindow {
    fn open() -> Self {
        let (_, child) = oom_scores();
        let mut n = SPAWNS_IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        if *n == 0 {
            let _ = std::fs::write("/proc/self/oom_score_adj", child);
        }
        *n += 1;
        OomWindow
    }
}

impl Drop for OomWindow {
    fn drop(&mut self) {
        let (own, _) = oom_scores();
        let mut n = SPAWNS_IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            let _ = std::fs::write("/proc/self/oom_score_adj", own);
        }
    }
}

fn failed(program: &str, reason: &str) -> SpawnError {
    SpawnError::Failed {
        program: program.to_string(),
        reason: reason.to_string(),
    }
}

fn spawn_error(program: &str, spec: &SpawnSpec, err: &std::io::Error) -> SpawnError {
    let reason = crate::error::describe_io(err);
    match err.raw_os_error() {
        Some(libc::ENOENT) => {
            if let Some(cwd) = &spec.cwd {
                if !Path::new(cwd).is_dir() {
                    return SpawnError::CwdNotFound(cwd.clone());
                }
            }
            SpawnError::CommandNotFound {
                program: program.to_string(),
                reason: "no such file or directory (not found on PATH)".to_string(),
            }
        }
        Some(libc::EACCES) | Some(libc::ENOEXEC) | Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
            SpawnError::CommandNotFound {
                program: program.to_string(),
                reason,
            }
        }
        Some(libc::EAGAIN) => failed(
            program,
            "resource temporarily unavailable (the sandbox's process limit may be reached)",
        ),
        _ => failed(program, &reason),
    }
}

/// Sends `signal` to the process group `pgid`. Errors (group already gone) are ignored.
pub fn kill_group(pgid: i32, signal: i32) {
    if let (Some(pgid), Some(signal)) = (Pid::from_raw(pgid.max(0)), crate::sys::signal(signal)) {
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

/// Sends `signal` to the single process `pid`. Errors (already gone) are ignored.
pub fn kill_one(pid: i32, signal: i32) {
    if let (Some(pid), Some(signal)) = (Pid::from_raw(pid.max(0)), crate::sys::signal(signal)) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Whether any process is left in group `pgid`.
pub fn group_alive(pgid: i32) -> bool {
    Pid::from_raw(pgid.max(0))
        .is_some_and(|pgid| rustix::process::test_kill_process_group(pgid).is_ok())
}

/// Quotes `text` for a POSIX shell: `'` becomes `'\''`.
pub fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(command: Command) -> ExecRequest {
        ExecRequest {
            command,
            ..Default::default()
        }
    }

    #[test]
    fn shell_strings_become_sh_dash_c() {
        let spec = SpawnSpec::from_request(&req(Command::Shell("echo hi".into())), false).unwrap();
        assert_eq!(spec.argv, vec!["/bin/sh", "-c", "echo hi"]);
    }

    #[test]
    fn a_missing_shell_is_no_shell() {
        let mut r = req(Command::Shell("echo hi".into()));
        r.shell = Some("/nonexistent/sh".into());
        let err = SpawnSpec::from_request(&r, false).unwrap_err();
        assert!(matches!(err, SpawnError::NoShell(_)));
        assert_eq!(ApiError::from(err).code, ErrorCode::NoShell);
    }

    #[test]
    fn empty_argv_and_missing_cwd_are_refused() {
        let err = SpawnSpec::from_request(&req(Command::Argv(vec![])), false).unwrap_err();
        assert!(matches!(err, SpawnError::Invalid(_)));
        let mut r = req(Command::Argv(vec!["true".into()]));
        r.cwd = Some("/definitely/not/here".into());
        let err = SpawnSpec::from_request(&r, false).unwrap_err();
        assert_eq!(ApiError::from(err).code, ErrorCode::CwdNotFound);
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}
