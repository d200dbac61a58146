//! Terminals: `/v1/pty` (ours: create, attach and re-attach by id, several viewers,
//! scrollback) and `/v1/pty/compat` (the Orchard-compatible WebSocket protocol).
//!
//! One reader task per terminal moves the master side's output into a bounded
//! scrollback and a broadcast channel under one lock, so a viewer that attaches gets
//! the scrollback and then exactly the output that followed it: no gap, no duplicate.
//! Viewers come and go; the terminal lives until its program exits, someone closes it,
//! or nobody has watched it for its idle timeout.
//!
//! Its state, [`Terminals`], is the reaper and the table of terminals.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRef, Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use orchard_protocol::login;
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::pty::{
    close_code, CompatClientFrame, CompatServerFrame, PtyClientFrame, PtyCreate, PtyInfo, PtyList,
    PtyResize, PtyServerFrame,
};
use orchard_protocol::signal::Signal;
use orchard_protocol::{Command, ErrorCode, ExecRequest};
use tokio::io::unix::AsyncFd;
use tokio::sync::{broadcast, watch};

use crate::api::extract::{BodyLimit, JsonBody};
use crate::api::registry::Registry;
use crate::error::{ApiError, ApiResult};
use crate::proc::buffer::Ring;
use crate::proc::procfs;
use crate::proc::reaper::{Exit, Reaper};
use crate::proc::spawn::{kill_one, spawn_pty, SpawnSpec};

/// Scrollback kept per terminal for re-attaching viewers.
pub const SCROLLBACK_BYTES: usize = 256 * 1024;
/// Default idle timeout: a terminal nobody watches is closed after this.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// An exited terminal stays listed this long.
const EXITED_RETENTION: Duration = Duration::from_secs(600);
/// Most terminals at once.
pub const MAX_PTYS: usize = 128;
/// Output events a slow viewer may lag behind before it loses some.
const BROADCAST_CAPACITY: usize = 1024;
/// Time for the compatible protocol's `init` frame.
const INIT_TIMEOUT: Duration = Duration::from_secs(30);
/// From SIGHUP to SIGKILL when a terminal is closed.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
enum Event {
    Output(Bytes),
    Exit(Exit),
}

struct Pty {
    id: String,
    pid: i32,
    argv: Vec<String>,
    master: AsyncFd<OwnedFd>,
    size: Mutex<(u16, u16)>,
    /// Scrollback; the reader pushes to it and broadcasts under this lock, and
    /// attaching viewers subscribe under it.
    scrollback: Mutex<Ring>,
    events: broadcast::Sender<Event>,
    exit: watch::Sender<Option<Exit>>,
    viewers: AtomicU32,
    /// When the last viewer left (or the terminal was created), for the idle timeout.
    unwatched_since: Mutex<Instant>,
    exited_at: Mutex<Option<Instant>>,
    idle_timeout: Duration,
    /// Serialises writes so keystrokes from several viewers never interleave mid-write.
    write_lock: tokio::sync::Mutex<()>,
}

impl Pty {
    fn info(&self) -> PtyInfo {
        let exit = *self.exit.borrow();
        let (rows, cols) = *self.size.lock().unwrap_or_else(|p| p.into_inner());
        PtyInfo {
            id: self.id.clone(),
            pid: self.pid as u32,
            argv: self.argv.clone(),
            rows,
            cols,
            alive: exit.is_none(),
            exit_code: exit.and_then(Exit::code),
            signal: exit.and_then(Exit::signal),
            viewers: self.viewers.load(Ordering::Relaxed),
        }
    }

    async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        let _one_writer = self.write_lock.lock().await;
        let mut rest = data;
        while !rest.is_empty() {
            let mut guard = self.master.writable().await?;
            match guard.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), rest)?)) {
                Ok(Ok(n)) => rest = &rest[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    fn resize(&self, rows: u16, cols: u16) -> ApiResult<()> {
        if rows == 0 || cols == 0 {
            return Err(ApiError::invalid("rows and cols must be at least 1"));
        }
        let size = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // The kernel then sends SIGWINCH to the terminal's foreground process group.
        if rustix::termios::tcsetwinsize(self.master.get_ref(), size).is_err() {
            return Err(ApiError::new(
                ErrorCode::ProcessExited,
                "the terminal is closed",
            ));
        }
        *self.size.lock().unwrap_or_else(|p| p.into_inner()) = (rows, cols);
        Ok(())
    }

    /// Sends `signal` to the terminal's foreground process group (what Ctrl-C would
    /// reach), or to the leader when the group cannot be read.
    fn signal(&self, signal: &Signal) -> ApiResult<()> {
        let number = signal
            .number()
            .ok_or_else(|| ApiError::invalid(format!("unknown signal {signal:?}")))?;
        match rustix::termios::tcgetpgrp(self.master.get_ref()) {
            Ok(fg) => crate::proc::spawn::kill_group(fg.as_raw_pid(), number),
            Err(_) => kill_one(self.pid, number),
        }
        Ok(())
    }

    /// Hangs up every process of the terminal's session, then kills what is left.
    fn close(self: &Arc<Self>) {
        kill_session(self.pid, libc::SIGHUP);
        kill_session(self.pid, libc::SIGCONT);
        let pty = self.clone();
        tokio::spawn(async move {
            let mut exit = pty.exit.subscribe();
            if tokio::time::timeout(CLOSE_GRACE, exit.wait_for(Option::is_some))
                .await
                .is_err()
            {
                kill_session(pty.pid, libc::SIGKILL);
            }
        });
    }
}

/// Sends `signal` to every process whose session id is `sid`.
fn kill_session(sid: i32, signal: i32) {
    for p in procfs::all() {
        if p.session == sid {
            kill_one(p.pid, signal);
        }
    }
}

/// The table of terminals.
pub struct PtyTable(Registry<Pty>);

impl Default for PtyTable {
    fn default() -> Self {
        Self(Registry::new("t", "terminal"))
    }
}

impl PtyTable {
    /// Closes terminals nobody watched for their idle timeout and forgets exited ones
    /// after the retention. Called periodically.
    pub fn sweep(&self) {
        let ptys = self.0.values();
        for pty in ptys {
            let exited_at = *pty.exited_at.lock().unwrap_or_else(|p| p.into_inner());
            let idle = pty.viewers.load(Ordering::Relaxed) == 0
                && pty
                    .unwatched_since
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed()
                    >= pty.idle_timeout;
            match exited_at {
                Some(at) if at.elapsed() >= EXITED_RETENTION => {
                    self.0.remove(&pty.id);
                }
                None if idle => pty.close(),
                _ => {}
            }
        }
    }
}

/// The terminal capability's state: the reaper the programs' exits go through and the
/// table of terminals.
#[derive(Clone)]
pub struct Terminals {
    /// The one owner of `waitpid`.
    pub reaper: Arc<Reaper>,
    /// Terminals.
    pub table: Arc<PtyTable>,
}

impl Terminals {
    /// No terminals yet; their programs are reaped through `reaper`.
    pub fn new(reaper: Arc<Reaper>) -> Self {
        Self {
            reaper,
            table: Arc::default(),
        }
    }
}

/// Routes of the terminal capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Terminals: FromRef<S>,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route("/v1/pty", post(create).get(list))
        .route("/v1/pty/compat", get(compat))
        .route("/v1/pty/{id}", get(one).delete(remove))
        .route("/v1/pty/{id}/resize", post(resize))
        .route("/v1/pty/{id}/attach", get(attach))
}

fn default_shell() -> String {
    if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash".into()
    } else {
        "/bin/sh".into()
    }
}

/// Starts a terminal and its reader and exit tasks.
fn open(terminals: &Terminals, req: &PtyCreate) -> ApiResult<Arc<Pty>> {
    let table = &terminals.table;
    table.sweep();
    if table.0.len() >= MAX_PTYS {
        return Err(ApiError::new(
            ErrorCode::TooManyProcesses,
            format!("{MAX_PTYS} terminals are open; close one first"),
        ));
    }
    let rows = req.rows.unwrap_or(24);
    let cols = req.cols.unwrap_or(80);
    if rows == 0 || cols == 0 {
        return Err(ApiError::invalid("rows and cols must be at least 1"));
    }
    let shell = default_shell();
    // A login shell as Orchard runs it: bash --login -i, ~/.bashrc sourced before a
    // command (see orchard_protocol::login).
    let command = match (&req.command, req.login_shell) {
        (None, false) => Command::Argv(vec![shell.clone(), "-i".into()]),
        (None, true) => Command::Argv(login::login_shell_interactive_argv(&shell)),
        (Some(Command::Shell(s)), true) => Command::Argv(login::login_shell_argv(&shell, s)),
        (Some(c), _) => c.clone(),
    };
    let spec = SpawnSpec::from_request(
        &ExecRequest {
            command,
            cwd: req.cwd.clone(),
            env: req.env.clone(),
            ..Default::default()
        },
        false,
    )?;
    let child = spawn_pty(&terminals.reaper, &spec, rows, cols)?;
    // SAFETY: the master fd is owned by the AsyncFd from here on and stays open.
    let master = unsafe {
        AsyncFd::register_with_interest(
            child.master,
            tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
        )
    }
    .map_err(|_| ApiError::new(ErrorCode::SpawnFailed, "cannot watch the terminal"))?;
    let id = table.0.next_id();
    let pty = Arc::new(Pty {
        id: id.clone(),
        pid: child.pid,
        argv: spec.argv.clone(),
        master,
        size: Mutex::new((rows, cols)),
        scrollback: Mutex::new(Ring::new(SCROLLBACK_BYTES)),
        events: broadcast::channel(BROADCAST_CAPACITY).0,
        exit: watch::channel(None).0,
        viewers: AtomicU32::new(0),
        unwatched_since: Mutex::new(Instant::now()),
        exited_at: Mutex::new(None),
        idle_timeout: req
            .idle_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_IDLE_TIMEOUT),
        write_lock: tokio::sync::Mutex::new(()),
    });
    let reader = tokio::spawn(read_loop(pty.clone()));
    let mut waiter = child.exit;
    let watcher = pty.clone();
    tokio::spawn(async move {
        let exit = waiter.wait().await.unwrap_or(Exit::Signal(libc::SIGKILL));
        // Output written just before exit is still in the terminal; a background job
        // holding the terminal open must not delay the exit frame for long.
        let _ = tokio::time::timeout(Duration::from_millis(200), reader).await;
        *watcher.exited_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let _scrollback = watcher.scrollback.lock().unwrap_or_else(|p| p.into_inner());
        watcher.exit.send_replace(Some(exit));
        let _ = watcher.events.send(Event::Exit(exit));
    });
    table.0.insert(id, pty.clone());
    Ok(pty)
}

async fn read_loop(pty: Arc<Pty>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(mut guard) = pty.master.readable().await else {
            return;
        };
        let read = guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut buf[..])?));
        match read {
            Ok(Ok(0)) => return,
            Ok(Ok(n)) => {
                let data = Bytes::copy_from_slice(&buf[..n]);
                let mut scrollback = pty.scrollback.lock().unwrap_or_else(|p| p.into_inner());
                scrollback.push(&data);
                let _ = pty.events.send(Event::Output(data));
            }
            // EIO: every slave side is closed, the program and its children are gone.
            Ok(Err(_)) => return,
            Err(_would_block) => continue,
        }
    }
}

async fn create(
    State(terminals): State<Terminals>,
    JsonBody(req): JsonBody<PtyCreate>,
) -> ApiResult<Json<PtyInfo>> {
    Ok(Json(open(&terminals, &req)?.info()))
}

async fn list(State(terminals): State<Terminals>) -> Json<PtyList> {
    let ptys = terminals
        .table
        .0
        .values()
        .iter()
        .map(|p| p.info())
        .collect();
    Json(PtyList { ptys })
}

async fn one(
    State(terminals): State<Terminals>,
    Path(id): Path<String>,
) -> ApiResult<Json<PtyInfo>> {
    Ok(Json(terminals.table.0.get(&id)?.info()))
}

async fn remove(
    State(terminals): State<Terminals>,
    Path(id): Path<String>,
) -> ApiResult<Json<PtyInfo>> {
    let pty = terminals.table.0.get(&id)?;
    if pty.exit.borrow().is_none() {
        pty.close();
    }
    terminals.table.0.remove(&id);
    Ok(Json(pty.info()))
}

async fn resize(
    State(terminals): State<Terminals>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PtyResize>,
) -> ApiResult<Json<PtyInfo>> {
    let pty = terminals.table.0.get(&id)?;
    pty.resize(req.rows, req.cols)?;
    Ok(Json(pty.info()))
}

/// The upgrade, or a clear error for a plain HTTP request.
fn upgrade(ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>) -> ApiResult<WebSocketUpgrade> {
    ws.map_err(|e| ApiError::invalid(format!("this route is a WebSocket: {e}")))
}

async fn attach(
    State(terminals): State<Terminals>,
    Path(id): Path<String>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let pty = terminals.table.0.get(&id)?;
    Ok(upgrade(ws)?.on_upgrade(move |socket| viewer(socket, pty)))
}

fn text<T: serde::Serialize>(frame: &T) -> Message {
    Message::Text(serde_json::to_string(frame).unwrap_or_default().into())
}

/// Counts a viewer for as long as it lives.
struct ViewerGuard(Arc<Pty>);

impl ViewerGuard {
    fn new(pty: Arc<Pty>) -> Self {
        pty.viewers.fetch_add(1, Ordering::Relaxed);
        Self(pty)
    }
}

impl Drop for ViewerGuard {
    fn drop(&mut self) {
        self.0.viewers.fetch_sub(1, Ordering::Relaxed);
        *self
            .0
            .unwatched_since
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

/// Scrollback and a receiver of everything after it, taken atomically.
fn subscribe(pty: &Pty) -> (Vec<u8>, broadcast::Receiver<Event>, Option<Exit>) {
    let scrollback = pty.scrollback.lock().unwrap_or_else(|p| p.into_inner());
    let replay = scrollback.read(0, SCROLLBACK_BYTES).data;
    (replay, pty.events.subscribe(), *pty.exit.borrow())
}

async fn viewer(mut socket: WebSocket, pty: Arc<Pty>) {
    let _guard = ViewerGuard::new(pty.clone());
    let (replay, mut events, exited) = subscribe(&pty);
    let hello = PtyServerFrame::Attached { pty: pty.info() };
    if socket.send(text(&hello)).await.is_err() {
        return;
    }
    if !replay.is_empty() {
        let frame = PtyServerFrame::Output {
            data: b64_encode(&replay),
            replay: true,
        };
        if socket.send(text(&frame)).await.is_err() {
            return;
        }
    }
    if let Some(exit) = exited {
        let frame = PtyServerFrame::Exit {
            code: exit.code(),
            signal: exit.signal(),
        };
        let _ = socket.send(text(&frame)).await;
        close_gracefully(&mut socket, 1000, "").await;
        return;
    }
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(Event::Output(data)) => {
                    let frame = PtyServerFrame::Output { data: b64_encode(&data), replay: false };
                    if socket.send(text(&frame)).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Exit(exit)) => {
                    let frame = PtyServerFrame::Exit { code: exit.code(), signal: exit.signal() };
                    let _ = socket.send(text(&frame)).await;
                    close_gracefully(&mut socket, 1000, "").await;
                    return;
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let frame = PtyServerFrame::Error {
                        message: format!("this viewer fell behind; {n} output chunks were skipped"),
                    };
                    if socket.send(text(&frame)).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            msg = socket.recv() => {
                let Some(Ok(msg)) = msg else { return };
                let frame = match msg {
                    Message::Text(t) => serde_json::from_str::<PtyClientFrame>(&t),
                    Message::Binary(b) => {
                        // Raw keystrokes, for clients that prefer binary frames.
                        let _ = pty.write(&b).await;
                        continue;
                    }
                    Message::Close(_) => return,
                    _ => continue,
                };
                let reply = match frame {
                    Err(e) => Some(format!("bad frame: {e}")),
                    Ok(PtyClientFrame::Stdin { data }) => match b64_decode(&data) {
                        Ok(bytes) => pty.write(&bytes).await.err().map(|e| format!("write failed: {e}")),
                        Err(e) => Some(format!("stdin data is not base64: {e}")),
                    },
                    Ok(PtyClientFrame::Resize { rows, cols }) => pty.resize(rows, cols).err().map(|e| e.message),
                    Ok(PtyClientFrame::Signal { sig }) => pty.signal(&sig).err().map(|e| e.message),
                    Ok(PtyClientFrame::Detach) => {
                        // The client asked to leave: it expects the close, and this
                        // viewer must stop counting at once.
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                    Ok(PtyClientFrame::Close) => {
                        pty.close();
                        None
                    }
                };
                if let Some(message) = reply {
                    if socket.send(text(&PtyServerFrame::Error { message })).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

async fn compat(
    State(terminals): State<Terminals>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    Ok(upgrade(ws)?.on_upgrade(move |socket| compat_session(socket, terminals)))
}

async fn close_with(mut socket: WebSocket, code: u16, reason: &str) {
    close_gracefully(&mut socket, code, reason).await;
}

/// How long the client gets to answer our close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Sends a close frame, then reads until the client answers with its own (or goes
/// away). Dropping the socket right after our close makes the kernel reset the
/// connection if the client still sends (a keystroke, its close), and a reset client
/// may discard frames it has not read yet: the last output and the exit frame.
async fn close_gracefully(socket: &mut WebSocket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: reason.to_string().into(),
    };
    if socket.send(Message::Close(Some(frame))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(msg)) = socket.recv().await {
            if matches!(msg, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// The Orchard-compatible terminal protocol: `init` first, then the same terminal
/// machinery as ours.
async fn compat_session(mut socket: WebSocket, terminals: Terminals) {
    let Some(req) = compat_init(&mut socket).await else {
        return close_with(
            socket,
            close_code::BAD_FIRST_FRAME,
            "the first frame must be init",
        )
        .await;
    };
    let pty = match open(&terminals, &req) {
        Ok(pty) => pty,
        Err(e) => {
            let _ = socket
                .send(text(&CompatServerFrame::Error { message: e.message }))
                .await;
            return close_with(socket, close_code::SPAWN_FAILED, "spawn failed").await;
        }
    };
    let _guard = ViewerGuard::new(pty.clone());
    let (early, mut events, _) = subscribe(&pty);
    if socket
        .send(text(&CompatServerFrame::Ready {
            pid: pty.pid as u32,
        }))
        .await
        .is_err()
    {
        return;
    }
    // What the program printed before the subscription is in the scrollback.
    if !early.is_empty() {
        let frame = CompatServerFrame::Stdout {
            data: b64_encode(&early),
        };
        if socket.send(text(&frame)).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(Event::Output(data)) => {
                    if socket.send(text(&CompatServerFrame::Stdout { data: b64_encode(&data) })).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Exit(exit)) => {
                    let code = exit.code().unwrap_or_else(|| 128 + exit.signal().unwrap_or(0));
                    let _ = socket.send(text(&CompatServerFrame::Exit { code })).await;
                    close_gracefully(&mut socket, 1000, "").await;
                    return;
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            msg = socket.recv() => {
                let Some(Ok(msg)) = msg else { return };
                let frame = match msg {
                    Message::Text(t) => serde_json::from_str::<CompatClientFrame>(&t),
                    Message::Close(_) => return,
                    _ => continue,
                };
                if let Some(message) = compat_input(&pty, frame).await {
                    if socket.send(text(&CompatServerFrame::Error { message })).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The terminal the compatible protocol's first frame asks for; `None` when that frame
/// is not an `init` or does not come within [`INIT_TIMEOUT`].
async fn compat_init(socket: &mut WebSocket) -> Option<PtyCreate> {
    let first = tokio::time::timeout(INIT_TIMEOUT, socket.recv()).await;
    let init = match first {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<CompatClientFrame>(&t).ok(),
        _ => None,
    };
    let Some(CompatClientFrame::Init {
        cmd,
        env,
        cwd,
        rows,
        cols,
        login_shell,
    }) = init
    else {
        return None;
    };
    let command = match (cmd, login_shell) {
        (Some(argv), true) if !argv.is_empty() => Some(Command::Shell(shell_join(&argv))),
        (Some(argv), false) if !argv.is_empty() => Some(Command::Argv(argv)),
        _ => None,
    };
    Some(PtyCreate {
        command,
        login_shell,
        cwd,
        env,
        rows,
        cols,
        idle_timeout_ms: None,
    })
}

/// Does what a client frame of the compatible protocol after `init` asks; answers the
/// problem to report in an `error` frame, if any.
async fn compat_input(
    pty: &Arc<Pty>,
    frame: Result<CompatClientFrame, serde_json::Error>,
) -> Option<String> {
    match frame {
        Ok(CompatClientFrame::Stdin { data }) => match b64_decode(&data) {
            Ok(bytes) => pty
                .write(&bytes)
                .await
                .err()
                .map(|e| format!("write failed: {e}")),
            Err(e) => Some(format!("stdin data is not base64: {e}")),
        },
        Ok(CompatClientFrame::Resize { rows, cols }) => {
            pty.resize(rows, cols).err().map(|e| e.message)
        }
        Ok(CompatClientFrame::Signal { sig }) => pty.signal(&sig).err().map(|e| e.message),
        Ok(CompatClientFrame::Close) => {
            pty.close();
            None
        }
        Ok(CompatClientFrame::Init { .. }) => Some("init was already received".to_string()),
        Err(e) => Some(format!("bad frame: {e}")),
    }
}

/// Joins argv into one shell string, quoting each element.
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+%".contains(&b))
            {
                a.clone()
            } else {
                crate::proc::spawn::sh_quote(a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_joined_with_quoting_where_needed() {
        let argv = vec![
            "echo".to_string(),
            "a b".into(),
            "it's".into(),
            "x=1".into(),
        ];
        assert_eq!(shell_join(&argv), r"echo 'a b' 'it'\''s' x=1");
    }
}
