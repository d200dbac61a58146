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

use crate::chunks::ChunkPool;
use crate::reaper::Exit;
use crate::spawn::{kill_group, Spawned};

/// Read size once a read fills the first buffer (a command printing steadily).
const READ_CHUNK: usize = 64 * 1024;
/// Read size, and pipe capacity, once a read fills [`READ_CHUNK`]: a command printing
/// a lot. With the default 64 KiB pipe the command and the agent take turns every
/// 64 KiB, and those switches, not copying, bound a large output's throughput.
const BIG_READ_CHUNK: usize = 256 * 1024;
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

async fn timeout_at_or_abort<T>(deadline: Instant, task: tokio::task::JoinHandle<T>) -> Option<T> {
    tokio::time::timeout_at(deadline, task).await.ok()?.ok()
}

async fn pump<S: Sink>(mut rx: pipe::Receiver, stream: Stream, sink: S, counters: Arc<Counters>) {
    let counter = match stream {
        Stream::Stdout => &counters.stdout,
        Stream::Stderr => &counters.stderr,
    };
    // Start small: most commands print little, and a fresh 64 KiB buffer costs page
    // faults on every exec. Grow when a read fills it. Large reads become chunks
    // without a copy and their buffers come back here ([`ChunkPool`]).
    let pool = ChunkPool::new();
    let mut buf = pool.take(FIRST_READ_CHUNK);
    let mut consumer_alive = true;
    loop {
        // The read fills the buffer's spare capacity, without zeroing it first.
        match rx.read_buf(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                counter.fetch_add(n as u64, Ordering::Relaxed);
                // A read that filled the buffer asks for a bigger one next.
                let mut next = buf.capacity();
                if n >= next && next < BIG_READ_CHUNK {
                    next = if next >= READ_CHUNK {
                        // Best effort: past the per-user pipe budget the kernel
                        // refuses, and the pipe keeps its size.
                        let _ = rustix::pipe::fcntl_setpipe_size(&rx, BIG_READ_CHUNK);
                        BIG_READ_CHUNK
                    } else {
                        READ_CHUNK
                    };
                }
                if consumer_alive {
                    consumer_alive = sink.write(stream, pool.chunk(&mut buf, next).await).await;
                } else {
                    buf.clear();
                }
                if buf.capacity() < next {
                    buf = pool.take(next);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use orchard_protocol::{Command, ExecRequest};

    use super::*;
    use crate::reaper::tests::shared;
    use crate::spawn::{spawn, SpawnSpec};

    /// Members of process group `pgid` that are not zombies. (Orphans of a test process
    /// are reaped by the host's init, late; a zombie has released everything but its
    /// pid, so it does not count.)
    fn running_in_group(pgid: i32) -> usize {
        crate::procfs::all()
            .iter()
            .filter(|p| p.pgrp == pgid && p.state != 'Z')
            .count()
    }

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<u8>>>);

    impl Sink for Collect {
        async fn write(&self, stream: Stream, data: Bytes) -> bool {
            if stream == Stream::Stdout {
                self.0.lock().unwrap().extend_from_slice(&data);
            }
            true
        }
    }

    async fn run(script: &str, timeout_ms: u64) -> (ExitInfo, Vec<u8>, i32, Duration) {
        let req = ExecRequest {
            command: Command::Shell(script.into()),
            ..Default::default()
        };
        let spec = SpawnSpec::from_request(&req, false).unwrap();
        let child = spawn(&shared(), &spec).unwrap();
        let pid = child.pid;
        let timing = Timing {
            timeout: Duration::from_millis(timeout_ms),
            grace: Duration::from_millis(200),
            drain: Duration::from_millis(100),
        };
        let sink = Collect::default();
        let start = std::time::Instant::now();
        let exit = supervise(child, timing, sink.clone(), Arc::default(), None).await;
        let out = sink.0.lock().unwrap().clone();
        (exit, out, pid, start.elapsed())
    }

    #[tokio::test]
    async fn output_arrives_whole_and_in_order() {
        let (exit, out, _, _) = run("seq 1 20000", 10_000).await;
        assert_eq!(exit.exit_code, Some(0));
        let expect: String = (1..=20000).map(|i| format!("{i}\n")).collect();
        assert_eq!(String::from_utf8(out).unwrap(), expect);
    }

    #[tokio::test]
    async fn a_timeout_kills_a_group_that_ignores_sigterm() {
        let (exit, _, pid, took) = run("trap '' TERM; sleep 30 & sleep 30; wait", 200).await;
        assert!(exit.timed_out);
        assert_eq!(exit.signal, Some(libc::SIGKILL));
        assert!(took < Duration::from_secs(2), "took {took:?}");
        // SIGKILL is delivered asynchronously: give the kernel a moment to finish the
        // members off, but no member may keep running.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while running_in_group(pid) > 0 && std::time::Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert_eq!(running_in_group(pid), 0, "members of the group still run");
    }

    #[tokio::test]
    async fn a_grandchild_holding_stdout_does_not_hold_the_call() {
        let (exit, out, pid, took) = run("sleep 30 & echo started", 10_000).await;
        kill_group(pid, libc::SIGKILL);
        assert_eq!(exit.exit_code, Some(0));
        assert!(!exit.timed_out);
        assert_eq!(out, b"started\n");
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }

    #[tokio::test]
    async fn a_kill_request_ends_the_process_without_timed_out() {
        let req = ExecRequest {
            command: Command::Argv(vec!["sleep".into(), "30".into()]),
            ..Default::default()
        };
        let spec = SpawnSpec::from_request(&req, false).unwrap();
        let child = spawn(&shared(), &spec).unwrap();
        let kill = Arc::new(Notify::new());
        kill.notify_one();
        let timing = Timing {
            timeout: Duration::from_secs(30),
            grace: Duration::from_millis(200),
            drain: Duration::from_millis(100),
        };
        let exit = supervise(
            child,
            timing,
            Collect::default(),
            Arc::default(),
            Some(kill),
        )
        .await;
        assert!(!exit.timed_out);
        assert_eq!(exit.signal, Some(libc::SIGTERM));
    }
}
