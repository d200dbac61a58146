//! Watching a started command to its end: pumping its output into a sink, enforcing its
//! time limit, and returning promptly however its descendants behave.
//!
//! Sync exec, streamed exec and background processes differ only in their [`Sink`]; the
//! rules are the same for all three:
//! - output is read as it comes, with backpressure from the sink, and counted;
//! - on timeout (or a kill request) the process group gets SIGTERM, then SIGKILL after
//!   the grace period;
//! - once the leader has exited, pipes still held open by a background grandchild are
//!   read for at most the drain period, then let go, so the call returns within
//!   timeout + grace + drain even when `sleep 1000 &` keeps stdout open.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use orchard_protocol::exec::ExitInfo;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio::time::{timeout, Instant};

use crate::reaper::Exit;
use crate::spawn::{kill_group, Spawned};

/// Largest read per pipe read.
const READ_CHUNK: usize = 64 * 1024;
/// First read per pipe read.
const FIRST_READ_CHUNK: usize = 4096;

/// Longest wait for a SIGKILLed leader to be reaped before giving up on it.
const KILL_REAP_LIMIT: Duration = Duration::from_secs(5);

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Where output goes.
pub trait Sink: Clone + Send + Sync + 'static {
    /// Takes one chunk; answers false once the consumer is gone (the pump then reads
    /// and discards the rest, so the process never blocks on a full pipe).
    fn write(&self, stream: Stream, data: Bytes) -> impl Future<Output = bool> + Send;
}

/// Time limits of one supervision.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Until SIGTERM.
    pub timeout: Duration,
    /// From SIGTERM to SIGKILL.
    pub grace: Duration,
    /// Reading after the leader exited.
    pub drain: Duration,
}

/// Bytes read per stream so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Stdout bytes.
    pub stdout: AtomicU64,
    /// Stderr bytes.
    pub stderr: AtomicU64,
}

/// Runs `child` to its end. `kill` ends it early the same way a timeout does, but is
/// not reported as `timed_out`.
pub async fn supervise<S: Sink>(
    child: Spawned,
    timing: Timing,
    sink: S,
    counters: Arc<Counters>,
    kill: Option<Arc<Notify>>,
) -> ExitInfo {
    let Spawned {
        pid,
        stdout,
        stderr,
        exit: mut waiter,
        started,
        ..
    } = child;
    let started = Instant::from_std(started);
    let deadline = started + timing.timeout;
    let out = tokio::spawn(pump(stdout, Stream::Stdout, sink.clone(), counters.clone()));
    let err = tokio::spawn(pump(stderr, Stream::Stderr, sink, counters));

    let killed = async {
        match &kill {
            Some(notify) => notify.notified().await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = false;
    let early = tokio::select! {
        exit = waiter.wait() => exit,
        _ = tokio::time::sleep_until(deadline) => { timed_out = true; None }
        _ = killed => None,
    };
    let exit = match early {
        Some(exit) => Some(exit),
        None => {
            kill_group(pid, libc::SIGTERM);
            let exit = timeout(timing.grace, waiter.wait()).await.ok().flatten();
            // Members of the group that ignore SIGTERM would keep running (and keep
            // the pipes open) after the leader is gone.
            kill_group(pid, libc::SIGKILL);
            match exit {
                Some(exit) => Some(exit),
                None => timeout(KILL_REAP_LIMIT, waiter.wait()).await.ok().flatten(),
            }
        }
    };
    let duration = started.elapsed();
    let exit = exit.unwrap_or(Exit::Signal(libc::SIGKILL));

    let drain_deadline = Instant::now() + timing.drain;
    for task in [out, err] {
        let abort = task.abort_handle();
        if timeout_at_or_abort(drain_deadline, task).await.is_none() {
            abort.abort();
        }
    }
    ExitInfo {
        exit_code: exit.code(),
        signal: exit.signal(),
        timed_out,
        duration_ms: duration.as_secs_f64() * 1000.0,
    }
}

async fn timeout_at_or_abort<T>(
    deadline: Instant,
    task: tokio::task::JoinHandle<T>,
) -> Option<T> {
    tokio::time::timeout_at(deadline, task).await.ok()?.ok()
}

async fn pump<S: Sink>(mut rx: pipe::Receiver, stream: Stream, sink: S, counters: Arc<Counters>) {
    let counter = match stream {
        Stream::Stdout => &counters.stdout,
        Stream::Stderr => &counters.stderr,
    };
    // Start small: most commands print little, and a fresh 64 KiB buffer costs page
    // faults on every exec. Grow when a read fills it.
    let mut buf = vec![0u8; FIRST_READ_CHUNK];
    let mut consumer_alive = true;
    loop {
        match rx.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if n == buf.len() && buf.len() < READ_CHUNK {
                    buf.resize(READ_CHUNK, 0);
                }
                counter.fetch_add(n as u64, Ordering::Relaxed);
                if consumer_alive {
                    consumer_alive = sink.write(stream, Bytes::copy_from_slice(&buf[..n])).await;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}
