//! Background processes: `/v1/processes`.
//!
//! A background process is supervised exactly like an exec (own session, timeout, kill
//! by group) but its output goes into per-stream ring buffers that clients read by
//! offset, its stdin stays open for writes, and its record outlives it for the
//! configured retention so a late reader still gets the exit status.
//!
//! Its state, [`Processes`], is the [`Commands`] it shares with exec (the same exec
//! slots) and the table of background processes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{FromRef, Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use orchard_protocol::exec::ExitInfo;
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::process::{
    OutputChunk, ProcessInfo, ProcessList, ProcessOutput, ProcessState, SignalRequest, StdinWrite,
};
use orchard_protocol::{ErrorCode, ExecRequest};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{watch, Notify};

use crate::api::exec::{no_result_id, Commands};
use crate::api::extract::{ApiQuery, BodyLimit, JsonBody};
use crate::api::registry::Registry;
use crate::config::{Config, MAX_TRACKED_PROCESSES};
use crate::error::{ApiError, ApiResult};
use crate::proc::buffer::Ring;
use crate::proc::spawn::{kill_group, kill_one};
use crate::proc::supervise::{supervise, Counters, Sink, Stream};

/// Timeout of a background process that sets none: effectively never.
const NO_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Default and largest read per stream in one output call.
const DEFAULT_READ_BYTES: usize = 1 << 20;
/// Default wait of `GET /v1/processes/{id}/wait`.
const DEFAULT_WAIT_MS: u64 = 30_000;
/// Longest a stdin write may block on a process that does not read.
const STDIN_WRITE_LIMIT: Duration = Duration::from_secs(30);

/// One background process.
struct Proc {
    id: String,
    pid: i32,
    argv: Vec<String>,
    started_at_ms: u64,
    /// Output rings; locked briefly by the pumps and by readers.
    rings: Mutex<[Ring; 2]>,
    counters: Arc<Counters>,
    /// Stdin write end; a tokio mutex because writes await and must not interleave.
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    /// `None` while running.
    exit: watch::Sender<Option<ExitInfo>>,
    /// When it exited, for retention.
    finished: Mutex<Option<Instant>>,
    /// Wakes the supervisor to kill the group.
    kill: Arc<Notify>,
}

impl Proc {
    fn info(&self, stdin_open: bool) -> ProcessInfo {
        let exit = *self.exit.borrow();
        ProcessInfo {
            id: self.id.clone(),
            pid: self.pid as u32,
            argv: self.argv.clone(),
            state: if exit.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit,
            started_at_ms: self.started_at_ms,
            stdout_bytes: self.counters.stdout.load(Ordering::Relaxed),
            stderr_bytes: self.counters.stderr.load(Ordering::Relaxed),
            stdin_open,
        }
    }

    async fn snapshot(&self) -> ProcessInfo {
        let open = self.stdin.lock().await.is_some();
        self.info(open)
    }

    fn is_running(&self) -> bool {
        self.exit.borrow().is_none()
    }
}

#[derive(Clone)]
struct RingSink(Arc<Proc>);

impl Sink for RingSink {
    async fn write(&self, stream: Stream, data: Bytes) -> bool {
        let mut rings = self.0.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings[stream as usize].push(&data);
        true
    }
}

/// The table of background processes.
pub struct ProcessTable {
    procs: Registry<Proc>,
    buffer_bytes: usize,
    retention: Duration,
}

impl ProcessTable {
    /// An empty table using `config`'s buffer size and retention.
    pub fn new(config: &Config) -> Self {
        Self {
            procs: Registry::new("p", "background process"),
            buffer_bytes: config.limits.process_buffer_bytes as usize,
            retention: Duration::from_millis(config.limits.process_retention_ms),
        }
    }

    /// Forgets exited processes older than the retention.
    pub fn prune(&self) {
        let retention = self.retention;
        self.procs.retain(|p| {
            let finished = *p.finished.lock().unwrap_or_else(|e| e.into_inner());
            finished.is_none_or(|at| at.elapsed() < retention)
        });
    }

    /// Processes tracked now.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether no process is tracked.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

/// The processes capability's state: how commands start (shared with exec, so both
/// draw on the same exec slots) and the table of background processes.
#[derive(Clone)]
pub struct Processes {
    /// How commands start.
    pub commands: Commands,
    /// Background processes.
    pub table: Arc<ProcessTable>,
}

impl Processes {
    /// The state for `config`, starting commands through `commands`.
    pub fn new(config: &Config, commands: Commands) -> Self {
        Self {
            commands,
            table: Arc::new(ProcessTable::new(config)),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Routes of the processes capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Processes: FromRef<S>,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route("/v1/processes", post(start).get(list))
        .route("/v1/processes/{id}", get(one).delete(remove))
        .route("/v1/processes/{id}/output", get(output))
        .route("/v1/processes/{id}/stdin", post(write_stdin))
        .route("/v1/processes/{id}/signal", post(signal))
        .route("/v1/processes/{id}/wait", get(wait))
}

async fn start(
    State(processes): State<Processes>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> ApiResult<Json<ProcessInfo>> {
    no_result_id(&req, "POST /v1/processes")?;
    let commands = &processes.commands;
    let mut prepared = commands.prepare(&req, true)?;
    if req.timeout_ms.is_none() {
        prepared.timing.timeout = NO_TIMEOUT;
    }
    let table = &processes.table;
    table.prune();
    if table.len() >= MAX_TRACKED_PROCESSES {
        return Err(ApiError::new(
            ErrorCode::TooManyProcesses,
            format!(
                "{MAX_TRACKED_PROCESSES} background processes are tracked; delete finished ones"
            ),
        ));
    }
    let slot = commands.acquire_slot()?;
    let mut child = commands.spawn(&prepared.spec)?;
    let mut stdin = child.stdin.take();
    if let (Some(pipe), Some(data)) = (stdin.as_mut(), prepared.stdin.as_ref()) {
        // A process that exits before reading its initial stdin is not an error.
        let _ = tokio::time::timeout(STDIN_WRITE_LIMIT, pipe.write_all(data)).await;
    }
    let id = table.procs.next_id();
    let cap = table.buffer_bytes;
    let proc = Arc::new(Proc {
        id: id.clone(),
        pid: child.pid,
        argv: prepared.spec.argv.clone(),
        started_at_ms: now_ms(),
        rings: Mutex::new([Ring::new(cap), Ring::new(cap)]),
        counters: Arc::new(Counters::default()),
        stdin: tokio::sync::Mutex::new(stdin),
        exit: watch::channel(None).0,
        finished: Mutex::new(None),
        kill: Arc::new(Notify::new()),
    });
    table.procs.insert(id, proc.clone());
    let info = proc.info(proc.stdin.try_lock().map(|s| s.is_some()).unwrap_or(true));
    let timing = prepared.timing;
    tokio::spawn(async move {
        let _slot = slot;
        let exit = supervise(
            child,
            timing,
            RingSink(proc.clone()),
            proc.counters.clone(),
            Some(proc.kill.clone()),
        )
        .await;
        *proc.finished.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        proc.stdin.lock().await.take();
        proc.exit.send_replace(Some(exit));
    });
    Ok(Json(info))
}

async fn list(State(processes): State<Processes>) -> Json<ProcessList> {
    processes.table.prune();
    let procs = processes.table.procs.values();
    let mut processes = Vec::with_capacity(procs.len());
    for p in procs {
        processes.push(p.snapshot().await);
    }
    processes.sort_by_key(|p| p.id[1..].parse::<u64>().unwrap_or(u64::MAX));
    Json(ProcessList { processes })
}

async fn one(
    State(processes): State<Processes>,
    Path(id): Path<String>,
) -> ApiResult<Json<ProcessInfo>> {
    Ok(Json(processes.table.procs.get(&id)?.snapshot().await))
}

async fn remove(
    State(processes): State<Processes>,
    Path(id): Path<String>,
) -> ApiResult<Json<ProcessInfo>> {
    let proc = processes.table.procs.get(&id)?;
    if proc.is_running() {
        // SIGTERM, then SIGKILL after the grace period, like a timeout.
        proc.kill.notify_one();
    }
    processes.table.procs.remove(&id);
    Ok(Json(proc.snapshot().await))
}

#[derive(Deserialize)]
struct OutputQuery {
    #[serde(default)]
    stdout_offset: u64,
    #[serde(default)]
    stderr_offset: u64,
    max_bytes: Option<usize>,
}

fn chunk(ring: &Ring, from: u64, max: usize) -> OutputChunk {
    let read = ring.read(from, max);
    OutputChunk {
        offset: read.offset,
        next_offset: read.offset + read.data.len() as u64,
        data: b64_encode(&read.data),
        lost_bytes: read.lost,
    }
}

async fn output(
    State(processes): State<Processes>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Json<ProcessOutput>> {
    let proc = processes.table.procs.get(&id)?;
    let max = q
        .max_bytes
        .unwrap_or(DEFAULT_READ_BYTES)
        .min(DEFAULT_READ_BYTES);
    // Read the state first: output read after seeing `exited` is then complete.
    let process = proc.snapshot().await;
    let (stdout, stderr) = {
        let rings = proc.rings.lock().unwrap_or_else(|p| p.into_inner());
        (
            chunk(&rings[0], q.stdout_offset, max),
            chunk(&rings[1], q.stderr_offset, max),
        )
    };
    Ok(Json(ProcessOutput {
        process,
        stdout,
        stderr,
    }))
}

async fn write_stdin(
    State(processes): State<Processes>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<StdinWrite>,
) -> ApiResult<Json<ProcessInfo>> {
    let proc = processes.table.procs.get(&id)?;
    let data = match (req.data, req.data_b64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("give either data or data_b64, not both"))
        }
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => b64_decode(&b64)
            .map_err(|e| ApiError::invalid(format!("data_b64 is not base64: {e}")))?,
        (None, None) => Vec::new(),
    };
    let mut stdin = proc.stdin.lock().await;
    let Some(pipe) = stdin.as_mut() else {
        let code = if proc.is_running() {
            ErrorCode::StdinClosed
        } else {
            ErrorCode::ProcessExited
        };
        return Err(ApiError::new(
            code,
            format!("stdin of process {id} is closed"),
        ));
    };
    if !data.is_empty() {
        match tokio::time::timeout(STDIN_WRITE_LIMIT, pipe.write_all(&data)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                stdin.take();
                return Err(ApiError::new(
                    ErrorCode::StdinClosed,
                    format!("process {id} closed its stdin"),
                ));
            }
            Err(_) => {
                return Err(ApiError::new(
                    ErrorCode::StdinClosed,
                    format!("process {id} did not read its stdin within {STDIN_WRITE_LIMIT:?}"),
                ))
            }
        }
    }
    if req.eof {
        stdin.take();
    }
    let open = stdin.is_some();
    drop(stdin);
    Ok(Json(proc.info(open)))
}

async fn signal(
    State(processes): State<Processes>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SignalRequest>,
) -> ApiResult<Json<ProcessInfo>> {
    let proc = processes.table.procs.get(&id)?;
    let number = req
        .signal
        .number()
        .ok_or_else(|| ApiError::invalid(format!("unknown signal {:?}", req.signal)))?;
    if !proc.is_running() {
        return Err(ApiError::new(
            ErrorCode::ProcessExited,
            format!("process {id} has already exited"),
        ));
    }
    if req.group {
        kill_group(proc.pid, number);
    } else {
        kill_one(proc.pid, number);
    }
    Ok(Json(proc.snapshot().await))
}

#[derive(Deserialize)]
struct WaitQuery {
    timeout_ms: Option<u64>,
}

async fn wait(
    State(processes): State<Processes>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> ApiResult<Json<ProcessInfo>> {
    let proc = processes.table.procs.get(&id)?;
    let limit = Duration::from_millis(q.timeout_ms.unwrap_or(DEFAULT_WAIT_MS));
    let mut rx = proc.exit.subscribe();
    let _ = tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await;
    Ok(Json(proc.snapshot().await))
}
