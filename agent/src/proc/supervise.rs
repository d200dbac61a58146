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
//!   timeout + grace + drain even when `sleep 1000 &` keeps stdout open;
//! - but whatever was written before the leader's exit is all delivered, however long
//!   a slow consumer takes: the drain period bounds waiting for *more* output, never
//!   the delivery of output already in the pipe or in hand (cutting it lost the tail
//!   of a large output whenever the consumer was slower than the drain period); only a
//!   consumer that takes nothing for the stall limit ([`STALL_LIMIT`]) after the drain period is taken
//!   for gone, so the call still ends (and its kill-on-disconnect is disarmed) in
//!   bounded time when a client stops reading but keeps its connection.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use orchard_protocol::exec::ExitInfo;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{watch, Notify};
use tokio::time::{timeout, Instant};

use crate::proc::chunks::ChunkPool;
use crate::proc::reaper::Exit;
use crate::proc::spawn::{kill_group, Spawned};

/// Read size once a read fills the first buffer (a command printing steadily).
const READ_CHUNK: usize = 64 * 1024;
/// Read size, and pipe capacity, once a read fills [`READ_CHUNK`]: a command printing
/// a lot. With the default 64 KiB pipe the command and the agent take turns every
/// 64 KiB, and those switches, not copying, bound a large output's throughput.
const BIG_READ_CHUNK: usize = 256 * 1024;
/// First read per pipe read.
const FIRST_READ_CHUNK: usize = 4096;

/// How long the pumps may read nothing, once the drain period is over, before their
/// consumer is taken for gone and they are stopped ([`Timing::stall`]'s default).
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

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
    /// After the drain period, how long a consumer may take nothing before it is taken
    /// for gone ([`STALL_LIMIT`]).
    pub stall: Duration,
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
    // Set to the drain deadline once the leader is gone (see [`pump`]).
    let (ended, ended_rx) = watch::channel(None);
    let out = tokio::spawn(pump(
        stdout,
        Stream::Stdout,
        sink.clone(),
        counters.clone(),
        ended_rx.clone(),
    ));
    let err = tokio::spawn(pump(
        stderr,
        Stream::Stderr,
        sink,
        counters.clone(),
        ended_rx,
    ));

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

    // The pumps end by themselves: at end of file, or once what was in the pipes is
    // delivered and the drain period has passed; or they are stopped when their
    // consumer has taken nothing for the stall limit.
    let drained = Instant::now() + timing.drain;
    let _ = ended.send(Some(drained));
    let read = || counters.stdout.load(Ordering::Relaxed) + counters.stderr.load(Ordering::Relaxed);
    let (mut seen, mut until) = (read(), drained + timing.stall);
    for mut task in [out, err] {
        while tokio::time::timeout_at(until, &mut task).await.is_err() {
            if read() == seen {
                task.abort();
                break;
            }
            (seen, until) = (read(), Instant::now() + timing.stall);
        }
    }
    ExitInfo {
        exit_code: exit.code(),
        signal: exit.signal(),
        timed_out,
        duration_ms: duration.as_secs_f64() * 1000.0,
    }
}

/// When a pump may stop: once it has read `owed` bytes in all (what the pipe held when
/// the leader exited, on top of what was read before) and a read would wait past
/// `deadline`.
#[derive(Debug, Clone, Copy)]
struct Drain {
    owed: u64,
    deadline: Instant,
}

/// Reads one stream into `sink` to its end, or, once `ended` holds the drain deadline
/// (the leader exited), until what the pipe held then is delivered and no more comes
/// before the deadline.
async fn pump<S: Sink>(
    mut rx: pipe::Receiver,
    stream: Stream,
    sink: S,
    counters: Arc<Counters>,
    mut ended: watch::Receiver<Option<Instant>>,
) {
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
    // Only this pump adds to its stream's counter: it is what this pump has read.
    let read = || counter.load(Ordering::Relaxed);
    let mut drain: Option<Drain> = None;
    let mut watching = true;
    loop {
        // The read fills the buffer's spare capacity, without zeroing it first (and is
        // cancel-safe: a read given up on took nothing).
        let got = match drain {
            None if watching => tokio::select! {
                r = rx.read_buf(&mut buf) => r,
                changed = ended.changed() => {
                    let deadline = *ended.borrow();
                    match (changed, deadline) {
                        (Ok(()), Some(deadline)) => {
                            let pending = rustix::io::ioctl_fionread(&rx).unwrap_or(0);
                            drain = Some(Drain { owed: read() + pending, deadline });
                        }
                        // The supervision itself was dropped (a sync exec's caller went
                        // away): read to the end, as a command left running expects.
                        _ => watching = false,
                    }
                    continue;
                }
            },
            None => rx.read_buf(&mut buf).await,
            // Output written before the exit: read it whatever the time.
            Some(d) if read() < d.owed => rx.read_buf(&mut buf).await,
            // More, from a background grandchild: only until the deadline, even while it
            // keeps writing (a read that is ready would win over an elapsed timeout).
            Some(d) if Instant::now() >= d.deadline => break,
            Some(d) => match tokio::time::timeout_at(d.deadline, rx.read_buf(&mut buf)).await {
                Ok(r) => r,
                Err(_) => break,
            },
        };
        match got {
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
    use crate::proc::reaper::tests::shared;
    use crate::proc::spawn::{spawn, SpawnSpec};

    /// Members of process group `pgid` that are not zombies. (Orphans of a test process
    /// are reaped by the host's init, late; a zombie has released everything but its
    /// pid, so it does not count.)
    fn running_in_group(pgid: i32) -> usize {
        crate::proc::procfs::all()
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

    /// A consumer that takes its `.0` per chunk: slower than the drain period.
    #[derive(Clone, Default)]
    struct Slow(Duration, Collect);

    impl Sink for Slow {
        async fn write(&self, stream: Stream, data: Bytes) -> bool {
            tokio::time::sleep(self.0).await;
            self.1.write(stream, data).await
        }
    }

    async fn run(script: &str, timeout_ms: u64) -> (ExitInfo, Vec<u8>, i32, Duration) {
        let sink = Collect::default();
        let (exit, pid, took) = run_into(script, timeout_ms, sink.clone()).await;
        let out = sink.0.lock().unwrap().clone();
        (exit, out, pid, took)
    }

    async fn run_into<S: Sink>(
        script: &str,
        timeout_ms: u64,
        sink: S,
    ) -> (ExitInfo, i32, Duration) {
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
            stall: Duration::from_millis(500),
        };
        let start = std::time::Instant::now();
        let exit = supervise(child, timing, sink, Arc::default(), None).await;
        (exit, pid, start.elapsed())
    }

    /// Regression: once the leader exited, the pumps were cut after the drain period
    /// even while they still delivered what it had written, so a consumer slower than
    /// that period lost the end of the output (128 KiB of a 16 MiB stream in the frames
    /// test, now and then).
    #[tokio::test]
    async fn regression_a_slow_consumer_gets_all_output_written_before_the_exit() {
        let sink = Slow(Duration::from_millis(150), Collect::default());
        let n = 512 * 1024;
        let (exit, _, _) = run_into(&format!("head -c {n} /dev/zero"), 10_000, sink.clone()).await;
        assert_eq!(exit.exit_code, Some(0));
        assert_eq!(sink.1 .0.lock().unwrap().len(), n);
    }

    /// Counts what it is given, keeping nothing.
    #[derive(Clone, Default)]
    struct Count(Arc<AtomicU64>);

    impl Sink for Count {
        async fn write(&self, _: Stream, data: Bytes) -> bool {
            self.0.fetch_add(data.len() as u64, Ordering::Relaxed);
            true
        }
    }

    #[tokio::test]
    async fn a_grandchild_that_keeps_writing_does_not_hold_the_call() {
        let sink = Count::default();
        let ran = run_into("yes & echo started", 10_000, sink.clone());
        let (exit, pid, took) = tokio::time::timeout(Duration::from_secs(10), ran)
            .await
            .expect("the call returned");
        kill_group(pid, libc::SIGKILL);
        assert_eq!(exit.exit_code, Some(0));
        assert!(sink.0.load(Ordering::Relaxed) > 0);
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    /// A consumer that stops taking output but stays connected.
    #[derive(Clone, Default)]
    struct Stuck;

    impl Sink for Stuck {
        async fn write(&self, _: Stream, _: Bytes) -> bool {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_consumer_that_stops_reading_does_not_hold_the_call_forever() {
        let ran = run_into("echo one; echo two >&2", 10_000, Stuck);
        let (exit, _, took) = tokio::time::timeout(Duration::from_secs(10), ran)
            .await
            .expect("the call returned");
        assert_eq!(exit.exit_code, Some(0));
        // The drain period and the stall limit (500 ms in these tests), not sooner.
        assert!(took >= Duration::from_millis(600), "took {took:?}");
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
            stall: Duration::from_millis(500),
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
