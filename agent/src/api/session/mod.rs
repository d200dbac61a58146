//! Persistent shell sessions: `/v1/sessions`.
//!
//! Each session is one long-lived shell (bash when the image has it, else sh) fed
//! through a stdin pipe, so `cd`, `export` and functions persist. A command is sent as
//!
//! ```sh
//! __orchard_c='<command, single-quoted>'
//! command eval "$__orchard_c" </dev/null
//! printf '\n<nonce>%d\n' "$?"; printf '\n<nonce>\n' >&2
//! ```
//!
//! and is complete when the random per-command nonce shows up on both streams: no
//! sleeps, no prompt scraping. Quoting makes a syntax error in the command an error of
//! `eval` (reported through `$?`) rather than a shell left waiting for more input, and
//! `</dev/null` keeps a command that reads stdin from eating the commands after it.
//!
//! A timeout sends SIGINT to the shell's descendants (not the shell: without job
//! control they share its process group), then SIGKILL; only a command that is a shell
//! builtin loop makes the agent kill the shell, and the result then says the session
//! ended.
//!
//! Capturing and restoring a session's state is [`state`]'s.

mod state;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, Path, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use orchard_protocol::health::Limits;
use orchard_protocol::session::{
    SessionCreate, SessionInfo, SessionList, SessionRun, SessionRunResult,
};
use orchard_protocol::{Command, ErrorCode, ExecRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::api::extract::{BodyLimit, JsonBody};
use crate::api::registry::Registry;
use crate::error::{ApiError, ApiResult};
use crate::proc::buffer::HeadTail;
use crate::proc::procfs;
use crate::proc::reaper::{Exit, Reaper};
use crate::proc::spawn::{kill_group, kill_one, spawn, SpawnSpec};

/// Most sessions alive at once.
pub const MAX_SESSIONS: usize = 64;
/// From SIGINT to SIGKILL of a timed-out command, and from SIGKILL to killing the shell.
const INTERRUPT_GRACE: Duration = Duration::from_millis(500);
/// How long to wait for the exit status of a shell whose output ended.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(1);
/// The shell's pipes; the mutex around them makes commands run one at a time, in
/// arrival order (tokio's mutex is fair).
struct Io {
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

struct Session {
    id: String,
    pid: i32,
    shell: String,
    io: tokio::sync::Mutex<Io>,
    commands: AtomicU64,
    alive: AtomicBool,
    exit: watch::Receiver<Option<Exit>>,
}

impl Session {
    fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            pid: self.pid as u32,
            shell: self.shell.clone(),
            alive: self.alive.load(Ordering::Relaxed) && self.exit.borrow().is_none(),
            commands: self.commands.load(Ordering::Relaxed),
        }
    }

    /// `process_exited` once the shell has ended.
    fn check_alive(&self) -> ApiResult<()> {
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
pub struct SessionTable(Registry<Session>);

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

/// Routes of the sessions capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Sessions: FromRef<S>,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", delete(remove).get(one))
        .route("/v1/sessions/{id}/run", post(run))
        .route("/v1/sessions/{id}/state", get(state::capture))
}

fn default_shell() -> &'static str {
    if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

async fn create(
    State(sessions): State<Sessions>,
    JsonBody(req): JsonBody<SessionCreate>,
) -> ApiResult<Json<SessionInfo>> {
    if sessions.table.0.len() >= MAX_SESSIONS {
        return Err(ApiError::new(
            ErrorCode::TooManyProcesses,
            format!("{MAX_SESSIONS} sessions are open; delete one first"),
        ));
    }
    if let Some(restored) = req.restore {
        if req.shell.is_some() || req.cwd.is_some() || !req.env.is_empty() {
            return Err(ApiError::invalid(
                "restore brings back the session's own shell, cwd and env: give none of them with it",
            ));
        }
        return state::restore(&sessions, restored).await.map(Json);
    }
    let shell = req.shell.unwrap_or_else(|| default_shell().to_string());
    let started = start_shell(&sessions.reaper, shell, req.cwd, req.env, false)?;
    let session = sessions
        .table
        .0
        .insert_with(None, |id| started.into_session(id))?;
    Ok(Json(session.info()))
}

/// A shell started for a session that is not in the table yet.
struct Started {
    pid: i32,
    shell: String,
    io: Io,
    exit: watch::Receiver<Option<Exit>>,
}

impl Started {
    fn into_session(self, id: String) -> Arc<Session> {
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
fn start_shell(
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
struct KillShell(Option<i32>);

impl Drop for KillShell {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            kill_shell(pid);
        }
    }
}

fn kill_shell(pid: i32) {
    kill_group(pid, libc::SIGKILL);
    for child in descendants(pid) {
        kill_one(child, libc::SIGKILL);
    }
}

async fn list(State(sessions): State<Sessions>) -> Json<SessionList> {
    let sessions = sessions.table.0.values().iter().map(|s| s.info()).collect();
    Json(SessionList { sessions })
}

async fn one(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    Ok(Json(sessions.table.0.get(&id)?.info()))
}

async fn remove(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    let session = sessions.table.0.get(&id)?;
    kill_shell(session.pid);
    session.alive.store(false, Ordering::Relaxed);
    sessions.table.0.remove(&id);
    Ok(Json(session.info()))
}

/// Quotes `text` for a POSIX shell: `'` becomes `'\''`.
pub fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn nonce() -> String {
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
struct Scan {
    marker: Vec<u8>,
    pending: Vec<u8>,
    capture: HeadTail,
    /// Bytes after the marker, once found.
    after: Option<Vec<u8>>,
}

impl Scan {
    fn new(marker: &str, cap: usize) -> Self {
        Self {
            marker: marker.as_bytes().to_vec(),
            pending: Vec::new(),
            capture: HeadTail::new(cap),
            after: None,
        }
    }

    fn push(&mut self, data: &[u8]) {
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
    fn code(&self) -> Option<Option<i32>> {
        let after = self.after.as_ref()?;
        let nl = after.iter().position(|b| *b == b'\n')?;
        Some(
            std::str::from_utf8(&after[..nl])
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        )
    }

    /// Everything read, when the stream ended without a marker.
    fn finish(mut self) -> HeadTail {
        if self.after.is_none() {
            let pending = std::mem::take(&mut self.pending);
            self.capture.push(&pending);
        }
        self.capture
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Direct children of `pid`, from `/proc/PID/task/*/children` (one small read per
/// thread), or `None` where the kernel does not offer that file.
fn children(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut any = false;
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            any = true;
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    any.then_some(out)
}

/// Pids of every descendant of `root`. Cheap (it runs before every session command)
/// where the kernel lists children; a scan of all of /proc otherwise.
pub fn descendants(root: i32) -> Vec<i32> {
    if children(root).is_some() {
        let mut found = Vec::new();
        let mut queue = vec![root];
        while let Some(pid) = queue.pop() {
            for child in children(pid).unwrap_or_default() {
                if !found.contains(&child) {
                    found.push(child);
                    queue.push(child);
                }
            }
        }
        return found;
    }
    let parent_of: Vec<(i32, i32)> = procfs::all().iter().map(|p| (p.pid, p.ppid)).collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for (pid, ppid) in &parent_of {
            if *ppid == parent && !found.contains(pid) {
                found.push(*pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// Notifies on drop: tells a run's task that its HTTP client went away.
struct CancelOnDrop(Arc<Notify>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

async fn run(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SessionRun>,
) -> ApiResult<Json<SessionRunResult>> {
    let session = sessions.table.0.get(&id)?;
    let timeout_ms = req.timeout_ms.unwrap_or(sessions.limits.default_timeout_ms);
    if timeout_ms == 0 {
        return Err(ApiError::invalid("timeout_ms must be at least 1"));
    }
    let cap = sessions.limits.max_output_bytes as usize;
    // The command runs in its own task: a client that gives up must not leave it
    // half-read in the shell, where its output and marker would leak into the next
    // run. Dropping the request interrupts the command instead, and the task reads up
    // to its marker before the session is free again.
    let cancel = Arc::new(Notify::new());
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    let task = tokio::spawn(run_in_shell(
        session,
        req.command,
        Duration::from_millis(timeout_ms),
        cap,
        cancel,
    ));
    match task.await {
        Ok(result) => result.map(Json),
        Err(_) => Err(ApiError::new(
            ErrorCode::Internal,
            "the session command failed",
        )),
    }
}

async fn run_in_shell(
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
struct Ran {
    /// `$?`, or the shell's exit code when the shell ended.
    exit_code: Option<i32>,
    timed_out: bool,
    duration: Duration,
    stdout: HeadTail,
    stderr: HeadTail,
    /// False when the shell ended.
    alive: bool,
}

impl Ran {
    fn into_result(self) -> SessionRunResult {
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
async fn run_locked(
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
    fn quoting_survives_single_quotes() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

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
    fn descendants_include_grandchildren() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut found = descendants(pid);
        while found.len() < 2 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            found = descendants(pid);
        }
        for p in &found {
            kill_one(*p, libc::SIGKILL);
        }
        kill_one(pid, libc::SIGKILL);
        let _ = child.wait();
        assert_eq!(found.len(), 2, "{found:?}");
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
