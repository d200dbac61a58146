//! `POST /v1/exec`, `POST /v1/exec/stream` and `GET /v1/exec/results/{id}`: run a
//! command to its end, answering once with the captured output, or streaming NDJSON
//! frames as output arrives; and collect a result kept for a caller that left
//! ([`crate::api::kept`]).
//!
//! [`Commands`] is what starting a supervised command takes (the reaper, the exec
//! slots, the limits and kill timings); background processes share it. [`Execs`], this
//! capability's state, adds the kept results and the keepalive interval.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRef, Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use orchard_protocol::exec::{timeout_stderr_line, ExitInfo, TIMEOUT_EXIT_CODE};
use orchard_protocol::frames::{self, FrameKind};
use orchard_protocol::health::Limits;
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::process::ProcessState;
use orchard_protocol::{ErrorCode, ExecEvent, ExecKept, ExecRequest, ExecResult};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::api::extract::{ApiQuery, BodyLimit, JsonBody};
use crate::api::kept::KeptTable;
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::proc::buffer::HeadTail;
use crate::proc::reaper::Reaper;
use crate::proc::spawn::{kill_group, spawn, SpawnError, SpawnSpec, Spawned};
use crate::proc::supervise::{supervise, Counters, Sink, Stream, Timing};

/// Frames buffered between the pumps and a slow streaming client.
const STREAM_QUEUE: usize = 64;

/// A validated exec request: what to start and how to watch it.
pub struct Prepared {
    /// What to start.
    pub spec: SpawnSpec,
    /// Bytes for stdin, if any.
    pub stdin: Option<Vec<u8>>,
    /// Time limits.
    pub timing: Timing,
    /// Output cap per stream.
    pub max_output: usize,
}

/// How commands are started and bounded: the reaper their exits go through, the exec
/// slots, the limits, and the kill timings. Clones share the reaper and the slots.
#[derive(Clone)]
pub struct Commands {
    /// The one owner of `waitpid`.
    reaper: Arc<Reaper>,
    /// One permit per running command (sync, streamed or background).
    slots: Arc<Semaphore>,
    /// Limits in force.
    limits: Limits,
    /// Time between SIGTERM and SIGKILL.
    kill_grace: Duration,
    /// How long pipes held by a background grandchild are read after the leader exits.
    drain_after_exit: Duration,
}

impl Commands {
    /// Commands under `config`'s limits and timings, reaped through `reaper`.
    pub fn new(config: &Config, reaper: Arc<Reaper>) -> Self {
        let slots = config.limits.max_concurrent_execs as usize;
        Self {
            reaper,
            slots: Arc::new(Semaphore::new(slots)),
            limits: config.limits.clone(),
            kill_grace: config.kill_grace,
            drain_after_exit: config.drain_after_exit,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Commands holding an exec slot now.
    pub fn running(&self) -> u64 {
        self.limits.max_concurrent_execs - self.slots.available_permits() as u64
    }

    /// Starts `spec` (see [`spawn`]).
    pub fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned, SpawnError> {
        spawn(&self.reaper, spec)
    }

    /// Checks a request against the limits and resolves it.
    pub fn prepare(&self, req: &ExecRequest, stdin_pipe: bool) -> ApiResult<Prepared> {
        let limits = &self.limits;
        let stdin = match (&req.stdin, &req.stdin_b64) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "give either stdin or stdin_b64, not both",
                ))
            }
            (Some(text), None) => Some(text.clone().into_bytes()),
            (None, Some(b64)) => Some(
                b64_decode(b64)
                    .map_err(|e| ApiError::invalid(format!("stdin_b64 is not base64: {e}")))?,
            ),
            (None, None) => None,
        };
        let timeout_ms = req.timeout_ms.unwrap_or(limits.default_timeout_ms);
        if timeout_ms == 0 {
            return Err(ApiError::invalid("timeout_ms must be at least 1"));
        }
        let max_output = req
            .max_output_bytes
            .unwrap_or(limits.max_output_bytes)
            .min(limits.max_output_ceiling_bytes.max(limits.max_output_bytes))
            as usize;
        let spec = SpawnSpec::from_request(req, stdin_pipe || stdin.is_some())?;
        Ok(Prepared {
            spec,
            stdin,
            timing: Timing {
                timeout: Duration::from_millis(timeout_ms),
                grace: self.kill_grace,
                drain: self.drain_after_exit,
                stall: crate::proc::supervise::STALL_LIMIT,
            },
            max_output,
        })
    }

    /// Takes an exec slot or answers `too_many_execs`.
    pub fn acquire_slot(&self) -> ApiResult<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                ErrorCode::TooManyExecs,
                format!(
                    "{} commands are already running; retry when one ends",
                    self.limits.max_concurrent_execs
                ),
            )
        })
    }
}

/// The exec capability's state: how commands start, the results kept for callers that
/// left, and the keepalive interval of streamed execs.
#[derive(Clone)]
pub struct Execs {
    /// Shared with background processes.
    pub commands: Commands,
    /// Execs run with a `result_id`.
    pub kept: Arc<KeptTable>,
    /// Interval of keepalive frames on a streamed exec.
    pub keepalive: Duration,
}

impl Execs {
    /// The state for `config`, starting commands through `commands`.
    pub fn new(config: &Config, commands: Commands) -> Self {
        Self {
            commands,
            kept: Arc::default(),
            keepalive: config.keepalive,
        }
    }
}

/// Routes of the exec capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Execs: FromRef<S>,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route("/v1/exec", post(exec_sync))
        .route("/v1/exec/stream", post(exec_stream))
        .route("/v1/exec/results/{id}", get(result))
}

/// Refuses a `result_id` where it means nothing (a streamed exec, a background
/// process: both already outlive or report to their caller in their own way).
pub fn no_result_id(req: &ExecRequest, route: &str) -> ApiResult<()> {
    match req.result_id {
        Some(_) => Err(ApiError::invalid(format!(
            "result_id is for POST /v1/exec only, not {route}"
        ))),
        None => Ok(()),
    }
}

/// Writes `data` to the child's stdin, then closes it. A child that exits without
/// reading is not an error.
pub fn feed_stdin(child: &mut Spawned, data: Option<Vec<u8>>) {
    if let (Some(mut pipe), Some(data)) = (child.stdin.take(), data) {
        tokio::spawn(async move {
            let _ = pipe.write_all(&data).await;
        });
    }
}

#[derive(Clone)]
struct CaptureSink(Arc<Mutex<[HeadTail; 2]>>);

impl Sink for CaptureSink {
    async fn write(&self, stream: Stream, data: Bytes) -> bool {
        let mut bufs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        bufs[stream as usize].push(&data);
        true
    }
}

/// `POST /v1/exec`. With a `result_id` the command runs in its own task, to its end
/// whether or not the caller stays ([`crate::api::kept`]).
async fn exec_sync(
    State(execs): State<Execs>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> ApiResult<Response> {
    let commands = &execs.commands;
    let prepared = commands.prepare(&req, false)?;
    let Some(id) = &req.result_id else {
        let slot = commands.acquire_slot()?;
        let child = commands.spawn(&prepared.spec)?;
        let result = run_captured(child, prepared, req.timeout_exit_124, slot).await;
        return Ok(Json(result).into_response());
    };
    let (running, mut caller) = execs.kept.begin(id)?;
    let started = commands
        .acquire_slot()
        .and_then(|slot| Ok((slot, commands.spawn(&prepared.spec)?)));
    let (slot, child) = match started {
        Ok(s) => s,
        Err(e) => {
            execs.kept.abandon(running);
            return Err(e);
        }
    };
    let kept = execs.kept.clone();
    tokio::spawn(async move {
        let result = run_captured(child, prepared, req.timeout_exit_124, slot).await;
        kept.end(running, result);
    });
    match caller.result().await {
        Some(result) => Ok(Json(&*result).into_response()),
        None => Err(ApiError::new(
            ErrorCode::Internal,
            "the command's task ended without a result",
        )),
    }
}

/// Feeds, watches and captures a spawned command to its end; the exec slot is held
/// until then.
async fn run_captured(
    mut child: Spawned,
    prepared: Prepared,
    timeout_exit_124: bool,
    _slot: OwnedSemaphorePermit,
) -> ExecResult {
    let pid = child.pid as u32;
    feed_stdin(&mut child, prepared.stdin);
    let capture = CaptureSink(Arc::new(Mutex::new([
        HeadTail::new(prepared.max_output),
        HeadTail::new(prepared.max_output),
    ])));
    let exit = supervise(
        child,
        prepared.timing,
        capture.clone(),
        Arc::new(Counters::default()),
        None,
    )
    .await;
    let [stdout, mut stderr] = {
        let mut bufs = capture.0.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *bufs, [HeadTail::new(0), HeadTail::new(0)])
    };
    let mut exit_code = exit.exit_code;
    if exit.timed_out && timeout_exit_124 {
        stderr.push(timeout_stderr_line(prepared.timing.timeout).as_bytes());
        exit_code = Some(TIMEOUT_EXIT_CODE);
    }
    ExecResult {
        exit_code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        duration_ms: exit.duration_ms,
        pid,
        stdout: stdout.into_output(),
        stderr: stderr.into_output(),
    }
}

/// One NDJSON line.
pub fn frame(event: &ExecEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// The binary frame kind of an output stream.
fn frame_kind(stream: Stream) -> FrameKind {
    match stream {
        Stream::Stdout => FrameKind::Stdout,
        Stream::Stderr => FrameKind::Stderr,
    }
}

/// A whole binary frame, header and payload in one buffer (see
/// [`orchard_protocol::frames`]).
fn binary_frame(kind: FrameKind, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(frames::HEADER_LEN + payload.len());
    out.extend_from_slice(&frames::header(kind, payload.len()));
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// Output in the response's framing, copied into one buffer: a binary frame, or an
/// NDJSON line with base64. (In binary streams this is only the agent's own timeout
/// line: [`StreamSink`] sends a command's output after its header without a copy.)
fn encode_output(binary: bool, stream: Stream, data: &[u8]) -> Bytes {
    if binary {
        return binary_frame(frame_kind(stream), data);
    }
    let data = b64_encode(data);
    frame(&match stream {
        Stream::Stdout => ExecEvent::Stdout { data },
        Stream::Stderr => ExecEvent::Stderr { data },
    })
}

/// An event in the response's framing: an NDJSON line, or a binary frame holding the
/// event's JSON.
fn framed(event: &ExecEvent, binary: bool) -> Bytes {
    if !binary {
        return frame(event);
    }
    binary_frame(
        FrameKind::Event,
        &serde_json::to_vec(event).unwrap_or_default(),
    )
}

#[derive(Clone)]
struct StreamSink {
    tx: mpsc::Sender<Bytes>,
    kill_pgid: Option<i32>,
    /// Binary frames instead of NDJSON lines.
    binary: bool,
}

impl Sink for StreamSink {
    async fn write(&self, stream: Stream, data: Bytes) -> bool {
        let sent = if self.binary {
            // The header and the chunk as two buffers: the chunk (up to 256 KiB) is not
            // copied again.
            let header = Bytes::copy_from_slice(&frames::header(frame_kind(stream), data.len()));
            // Both places are taken at once, so nothing (a keepalive from its own task)
            // can come between a header and its payload.
            match self.tx.reserve_many(2).await {
                Ok(mut permits) => {
                    for part in [header, data] {
                        if let Some(p) = permits.next() {
                            p.send(part);
                        }
                    }
                    true
                }
                Err(_) => false,
            }
        } else {
            self.tx
                .send(encode_output(false, stream, &data))
                .await
                .is_ok()
        };
        if sent {
            return true;
        }
        if let Some(pgid) = self.kill_pgid {
            kill_group(pgid, libc::SIGKILL);
        }
        false
    }
}

/// `POST /v1/exec/stream`.
async fn exec_stream(
    State(execs): State<Execs>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecRequest>,
) -> ApiResult<Response> {
    no_result_id(&req, "POST /v1/exec/stream")?;
    let binary = wants_frames(&headers);
    let prepared = execs.commands.prepare(&req, false)?;
    let slot = execs.commands.acquire_slot()?;
    let mut child = execs.commands.spawn(&prepared.spec)?;
    let pid = child.pid;
    feed_stdin(&mut child, prepared.stdin);
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_QUEUE);
    let _ = tx.try_send(framed(&ExecEvent::Start { pid: pid as u32 }, binary));
    let keepalive = tokio::spawn(keepalive_loop(
        tx.clone(),
        execs.keepalive,
        framed(&ExecEvent::Keepalive, binary),
    ));
    let sink = StreamSink {
        tx: tx.clone(),
        kill_pgid: req.kill_on_disconnect.then_some(pid),
        binary,
    };
    // A command that prints nothing never notices a vanished client through its
    // sink; watch the channel itself.
    let disconnect_kill = req.kill_on_disconnect.then(|| {
        let tx = tx.clone();
        tokio::spawn(async move {
            tx.closed().await;
            kill_group(pid, libc::SIGKILL);
        })
    });
    let exit_124 = req.timeout_exit_124;
    tokio::spawn(async move {
        let _slot = slot;
        let counters = Arc::new(Counters::default());
        let limit = prepared.timing.timeout;
        let mut exit: ExitInfo =
            supervise(child, prepared.timing, sink, counters.clone(), None).await;
        keepalive.abort();
        if let Some(watch) = disconnect_kill {
            watch.abort();
        }
        if exit.timed_out && exit_124 {
            let line = timeout_stderr_line(limit);
            counters
                .stderr
                .fetch_add(line.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let _ = tx
                .send(encode_output(binary, Stream::Stderr, line.as_bytes()))
                .await;
            exit.exit_code = Some(TIMEOUT_EXIT_CODE);
        }
        let last = ExecEvent::Exit {
            exit,
            stdout_bytes: counters.stdout.load(std::sync::atomic::Ordering::Relaxed),
            stderr_bytes: counters.stderr.load(std::sync::atomic::Ordering::Relaxed),
        };
        let _ = tx.send(framed(&last, binary)).await;
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok::<_, Infallible>(line), rx))
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                if binary {
                    frames::EXEC_FRAMES
                } else {
                    orchard_protocol::NDJSON
                },
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

/// Whether the client asked for binary frames (`Accept` naming
/// [`frames::EXEC_FRAMES`]).
fn wants_frames(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.split(';').next().unwrap_or("").trim() == frames::EXEC_FRAMES)
}

/// Query of `GET /v1/exec/results/{id}`.
#[derive(Deserialize)]
struct ResultQuery {
    /// How long to wait for a running command; default 0.
    timeout_ms: Option<u64>,
}

/// `GET /v1/exec/results/{id}`.
async fn result(
    State(execs): State<Execs>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ResultQuery>,
) -> ApiResult<Json<ExecKept>> {
    let mut slot = execs.kept.get(&id)?;
    let limit = Duration::from_millis(q.timeout_ms.unwrap_or(0));
    let _ = tokio::time::timeout(limit, slot.wait_for(Option::is_some)).await;
    let result = slot.borrow().as_deref().cloned();
    Ok(Json(ExecKept {
        id,
        state: if result.is_some() {
            ProcessState::Exited
        } else {
            ProcessState::Running
        },
        result,
    }))
}

async fn keepalive_loop(tx: mpsc::Sender<Bytes>, every: Duration, line: Bytes) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        // A full queue means output is flowing; no keepalive needed then.
        match tx.try_send(line.clone()) {
            Err(mpsc::error::TrySendError::Closed(_)) => break,
            _ => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use orchard_protocol::Command;

    use super::*;
    use crate::proc::reaper::tests::shared;

    fn state() -> Commands {
        Commands::new(&Config::new("t"), shared())
    }

    fn req(f: impl FnOnce(&mut ExecRequest)) -> ExecRequest {
        let mut r = ExecRequest {
            command: Command::Argv(vec!["true".into()]),
            ..Default::default()
        };
        f(&mut r);
        r
    }

    fn code(r: ApiResult<Prepared>) -> ErrorCode {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.code,
        }
    }

    #[test]
    fn stdin_is_text_or_base64_not_both() {
        let s = state();
        let both = req(|r| {
            r.stdin = Some("a".into());
            r.stdin_b64 = Some("YQ==".into());
        });
        assert_eq!(code(s.prepare(&both, false)), ErrorCode::InvalidArgument);
        let bad = req(|r| r.stdin_b64 = Some("!!".into()));
        assert_eq!(code(s.prepare(&bad, false)), ErrorCode::InvalidArgument);
        let ok = s
            .prepare(&req(|r| r.stdin_b64 = Some("AP8=".into())), false)
            .unwrap();
        assert_eq!(ok.stdin, Some(vec![0, 255]));
        assert!(ok.spec.stdin_pipe, "stdin bytes need a pipe");
    }

    #[test]
    fn limits_apply_defaults_and_caps() {
        let s = state();
        assert_eq!(
            code(s.prepare(&req(|r| r.timeout_ms = Some(0)), false)),
            ErrorCode::InvalidArgument
        );
        let p = s.prepare(&req(|_| {}), false).unwrap();
        assert_eq!(
            p.timing.timeout,
            Duration::from_millis(s.limits().default_timeout_ms)
        );
        assert_eq!(p.max_output as u64, s.limits().max_output_bytes);
        let p = s
            .prepare(&req(|r| r.max_output_bytes = Some(u64::MAX)), false)
            .unwrap();
        assert_eq!(p.max_output as u64, s.limits().max_output_ceiling_bytes);
        let p = s
            .prepare(&req(|r| r.max_output_bytes = Some(10)), false)
            .unwrap();
        assert_eq!(p.max_output, 10);
    }

    #[test]
    fn the_exec_slot_limit_is_too_many_execs() {
        let mut config = Config::new("t");
        config.limits.max_concurrent_execs = 1;
        let s = Commands::new(&config, shared());
        let held = s.acquire_slot().unwrap();
        assert_eq!(s.running(), 1);
        assert_eq!(s.acquire_slot().unwrap_err().code, ErrorCode::TooManyExecs);
        drop(held);
        assert!(s.acquire_slot().is_ok());
    }
}
