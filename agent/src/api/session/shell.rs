//! The shells behind sessions: the table of sessions (this capability's state),
//! starting a shell that reads commands from a pipe, and running one command in it,
//! framed by a nonce (see the module docs of [`super`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orchard_protocol::health::Limits;
use orchard_protocol::session::{SessionInfo, SessionRunResult};
use orchard_protocol::{Command, ErrorCode, ExecRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::api::registry::Registry;
use crate::error::{ApiError, ApiResult};
use crate::proc::buffer::HeadTail;
use crate::proc::procfs::descendants;
use crate::proc::reaper::{Exit, Reaper};
use crate::proc::spawn::{kill_group, kill_one, sh_quote, spawn, SpawnSpec};

/// From SIGINT to SIGKILL of a timed-out command, and from SIGKILL to killing the shell.
const INTERRUPT_GRACE: Duration = Duration::from_millis(500);
/// How long to wait for the exit status of a shell whose output ended.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(1);

/// The shell's pipes; the mutex around them makes commands run one at a time, in
/// arrival order (tokio's mutex is fair).
pub(super) struct Io {
    pub(super) stdin: pipe::Sender,
    pub(super) stdout: pipe::Receiver,
    pub(super) stderr: pipe::Receiver,
}

/// One session: its shell, the shell's pipes, and what a listing shows of it.
pub(super) struct Session {
    pub(super) id: String,
    pub(super) pid: i32,
    pub(super) shell: String,
    pub(super) io: tokio::sync::Mutex<Io>,
    pub(super) commands: AtomicU64,
    pub(super) alive: AtomicBool,
    pub(super) exit: watch::Receiver<Option<Exit>>,
}

impl Session {
    pub(super) fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            pid: self.pid as u32,
            shell: self.shell.clone(),
            alive: self.alive.load(Ordering::Relaxed) && self.exit.borrow().is_none(),
            commands: self.commands.load(Ordering::Relaxed),
        }
    }

    /// `process_exited` once the shell has ended.
    pub(super) fn check_alive(&self) -> ApiResult<()> {
        if self.info().alive {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::ProcessExited,
            format!(
                "the shell of session {} has exited; delete the session and start another",
                self.id
            ),
        ))
    }
}

/// The table of sessions.
pub struct SessionTable(pub(super) Registry<Session>);

impl Default for SessionTable {
    fn default() -> Self {
        Self(Registry::new("s", "session"))
    }
}

/// The sessions capability's state: the reaper the shells' exits go through, the
/// limits a command's timeout and output default to, and the table of sessions.
#[derive(Clone)]
pub struct Sessions {
    /// The one owner of `waitpid`.
    pub reaper: Arc<Reaper>,
    /// Limits in force.
    pub limits: Limits,
    /// Persistent shell sessions.
    pub table: Arc<SessionTable>,
}

impl Sessions {
    /// No sessions yet; shells are reaped through `reaper`.
    pub fn new(limits: Limits, reaper: Arc<Reaper>) -> Self {
        Self {
            reaper,
            limits,
            table: Arc::default(),
        }
    }
}

/// A shell started for a session that is not in the table yet.
pub(super) struct Started {
    pub(super) pid: i32,
    pub(super) shell: String,
    pub(super) io: Io,
    pub(super) exit: watch::Receiver<Option<Exit>>,
}

impl Started {
    pub(super) fn into_session(self, id: String) -> Arc<Session> {
        Arc::new(Session {
            id,
            pid: self.pid,
            shell: self.shell,
            io: tokio::sync::Mutex::new(self.io),
            commands: AtomicU64::new(0),
            alive: AtomicBool::new(true),
            exit: self.exit,
        })
    }
}

/// Starts `shell` reading commands from a pipe, with `env` added to the agent's
/// environment, or as all of it with `clear_env`.
pub(super) fn start_shell(
    reaper: &Arc<Reaper>,
    shell: String,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    clear_env: bool,
) -> ApiResult<Started> {
    let mut spec = SpawnSpec::from_request(
        &ExecRequest {
            command: Command::Shell(String::new()),
            shell: Some(shell.clone()),
            cwd,
            env,
            ..Default::default()
        },
        true,
    )?;
    spec.clear_env = clear_env;
    spec.argv = if shell.ends_with("bash") {
        vec![shell.clone(), "--noprofile".into(), "--norc".into()]
    } else {
        vec![shell.clone()]
    };
    let mut child = spawn(reaper, &spec)?;
    let Some(stdin) = child.stdin.take() else {
        kill_group(child.pid, libc::SIGKILL);
        return Err(ApiError::new(
            ErrorCode::SpawnFailed,
            "the shell got no stdin pipe",
        ));
    };
    let (exit_tx, exit_rx) = watch::channel(None);
    let mut waiter = child.exit;
    tokio::spawn(async move {
        let exit = waiter.wait().await;
        exit_tx.send_replace(Some(exit.unwrap_or(Exit::Signal(libc::SIGKILL))));
    });
    Ok(Started {
        pid: child.pid,
        shell,
        io: Io {
            stdin,
            stdout: child.stdout,
            stderr: child.stderr,
        },
        exit: exit_rx,
    })
}

/// Kills a shell and everything it started (on drop, unless disarmed).
pub(super) struct KillShell(pub(super) Option<i32>);

impl Drop for KillShell {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            kill_shell(pid);
        }
    }
}

pub(super) fn kill_shell(pid: i32) {
    kill_group(pid, libc::SIGKILL);
    for child in descendants(pid) {
        kill_one(child, libc::SIGKILL);
    }
}

pub(super) fn nonce() -> String {
    match crate::sys::random_hex(12) {
        Ok(hex) => format!("__ORCHARD_{hex}__"),
        Err(_) => {
            // Fall back to time and a counter; uniqueness, not secrecy, is what matters.
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let c = COUNTER.fetch_add(1, Ordering::Relaxed);
            format!("__ORCHARD_{t:x}_{c}__")
        }
    }
}

/// Finds the end marker in a stream, capturing what comes before it.
pub(super) struct Scan {
    pub(super) marker: Vec<u8>,
    pub(super) pending: Vec<u8>,
    pub(super) capture: HeadTail,
    /// Bytes after the marker, once found.
    pub(super) after: Option<Vec<u8>>,
}

impl Scan {
    pub(super) fn new(marker: &str, cap: usize) -> Self {
        Self {
            marker: marker.as_bytes().to_vec(),
            pending: Vec::new(),
            capture: HeadTail::new(cap),
            after: None,
        }
    }

    pub(super) fn push(&mut self, data: &[u8]) {
        if let Some(after) = &mut self.after {
            after.extend_from_slice(data);
            return;
        }
        self.pending.extend_from_slice(data);
        if let Some(i) = find(&self.pending, &self.marker) {
            self.capture.push(&self.pending[..i]);
            self.after = Some(self.pending[i + self.marker.len()..].to_vec());
            self.pending.clear();
            return;
        }
        // Keep a tail that could be the start of a marker split across reads.
        let keep = self.marker.len().saturating_sub(1).min(self.pending.len());
        let flush = self.pending.len() - keep;
        self.capture.push(&self.pending[..flush]);
        self.pending.drain(..flush);
    }

    /// The exit code written after the stdout marker, once its line is complete.
    pub(super) fn code(&self) -> Option<Option<i32>> {
        let after = self.after.as_ref()?;
        let nl = after.iter().position(|b| *b == b'\n')?;
        Some(
            std::str::from_utf8(&after[..nl])
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        )
    }

    /// Everything read, when the stream ended without a marker.
    pub(super) fn finish(mut self) -> HeadTail {
        if self.after.is_none() {
            let pending = std::mem::take(&mut self.pending);
            self.capture.push(&pending);
        }
        self.capture
    }
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Notifies on drop: tells a run's task that its HTTP client went away.
pub(super) struct CancelOnDrop(pub(super) Arc<Notify>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

pub(super) async fn run_in_shell(
    session: Arc<Session>,
    command: String,
    timeout: Duration,
    cap: usize,
    cancel: Arc<Notify>,
) -> ApiResult<SessionRunResult> {
    let mut io = session.io.lock().await;
    session.check_alive()?;
    session.commands.fetch_add(1, Ordering::Relaxed);
    let ran = run_locked(
        session.pid,
        &session.exit,
        &mut io,
        &command,
        timeout,
        cap,
        &cancel,
    )
    .await;
    if !ran.alive {
        session.alive.store(false, Ordering::Relaxed);
    }
    Ok(ran.into_result())
}

/// What a command run in a shell left.
pub(super) struct Ran {
    /// `$?`, or the shell's exit code when the shell ended.
    pub(super) exit_code: Option<i32>,
    pub(super) timed_out: bool,
    pub(super) duration: Duration,
    pub(super) stdout: HeadTail,
    pub(super) stderr: HeadTail,
    /// False when the shell ended.
    pub(super) alive: bool,
}

impl Ran {
    pub(super) fn into_result(self) -> SessionRunResult {
        SessionRunResult {
            exit_code: self.exit_code,
            timed_out: self.timed_out,
            duration_ms: self.duration.as_secs_f64() * 1000.0,
            stdout: self.stdout.into_output(),
            stderr: self.stderr.into_output(),
            session_alive: self.alive,
        }
    }
}

/// Runs `command` in the shell `pid` through its pipes `io`, which the caller holds
/// (the session's lock, or a shell no one else sees yet); `exit` tells the shell's exit
/// status should it end.
pub(super) async fn run_locked(
    pid: i32,
    exit: &watch::Receiver<Option<Exit>>,
    io: &mut Io,
    command: &str,
    timeout: Duration,
    cap: usize,
    cancel: &Notify,
) -> Ran {
    let start = Instant::now();
    let nonce = nonce();
    // `command eval`, not `eval`: an error in a special builtin such as eval would
    // make a POSIX shell exit, taking the session with it.
    let script = format!(
        "__orchard_c={}\ncommand eval \"$__orchard_c\" </dev/null\nprintf '\\n{nonce}%d\\n' \"$?\"\nprintf '\\n{nonce}\\n' >&2\n",
        sh_quote(command)
    );
    // Background jobs of earlier commands are not this command's to interrupt.
    let earlier = descendants(pid);
    let mut out = Scan::new(&format!("\n{nonce}"), cap);
    let mut err = Scan::new(&format!("\n{nonce}\n"), cap);
    let mut shell_gone = io.stdin.write_all(script.as_bytes()).await.is_err();

    let mut stage = 0u8; // 0 running, 1 interrupted, 2 killed, 3 shell killed
    let mut next_step = start + timeout;
    let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let (mut out_eof, mut err_eof) = (false, false);
    while !shell_gone {
        let out_done = out.code().is_some() || out_eof;
        let err_done = err.after.is_some() || err_eof;
        if out_done && err_done {
            break;
        }
        let Io { stdout, stderr, .. } = &mut *io;
        tokio::select! {
            r = stdout.read(&mut out_buf), if !out_done => match r {
                Ok(n) if n > 0 => out.push(&out_buf[..n]),
                _ => out_eof = true,
            },
            r = stderr.read(&mut err_buf), if !err_done => match r {
                Ok(n) if n > 0 => err.push(&err_buf[..n]),
                _ => err_eof = true,
            },
            _ = cancel.notified(), if stage == 0 => next_step = Instant::now(),
            _ = tokio::time::sleep_until(next_step), if stage < 3 => {
                let signal = if stage == 0 { libc::SIGINT } else { libc::SIGKILL };
                if stage < 2 {
                    for pid in descendants(pid) {
                        if !earlier.contains(&pid) {
                            kill_one(pid, signal);
                        }
                    }
                } else {
                    // Nothing but the shell itself is running: a builtin loop.
                    kill_group(pid, libc::SIGKILL);
                }
                stage += 1;
                next_step = Instant::now() + INTERRUPT_GRACE;
            }
        }
        shell_gone = out_eof && out.code().is_none();
    }
    let code = out.code().flatten();
    let alive = !shell_gone;
    let exit_code = if alive {
        code
    } else {
        let mut exit = exit.clone();
        let _ = tokio::time::timeout(EXIT_STATUS_WAIT, exit.wait_for(Option::is_some)).await;
        let status = *exit.borrow();
        status.and_then(Exit::code)
    };
    Ran {
        exit_code,
        timed_out: stage > 0,
        duration: start.elapsed(),
        stdout: out.finish(),
        stderr: err.finish(),
        alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_found_across_reads_and_the_code_parsed() {
        let mut s = Scan::new("\nMARK", 100);
        for chunk in [&b"hello\n\nMA"[..], b"RK1", b"27\n"] {
            s.push(chunk);
        }
        assert_eq!(s.code(), Some(Some(127)));
        assert_eq!(s.finish().finish().0, b"hello\n");
    }

    #[test]
    fn output_without_a_trailing_newline_is_kept_exactly() {
        let mut s = Scan::new("\nMARK", 100);
        s.push(b"abc\nMARK0\n");
        assert_eq!(s.code(), Some(Some(0)));
        assert_eq!(s.finish().finish().0, b"abc");
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
