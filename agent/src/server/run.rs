//! Running the agent: PID 1 set-up, the listeners, and a clean shutdown on SIGTERM or
//! SIGINT (the signal is forwarded to every command, which gets the grace period before
//! SIGKILL; then the listeners close and the socket file is removed).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::proc::reaper::Reaper;
use crate::proc::spawn::{group_alive, kill_group};
use crate::server::router::router;
use crate::server::state::AppState;

/// OOM score of the agent itself: far below its children (which reset theirs to 0),
/// so the kernel kills a memory hog rather than PID 1.
const AGENT_OOM_SCORE_ADJ: &str = "-998";

/// Blocking-pool threads started up front (file I/O and tar run there).
const WARM_BLOCKING_THREADS: usize = 2;

/// How long a shutdown waits for commands after forwarding the signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Neither a Unix socket nor a TCP address was given.
    #[error("nothing to listen on: give --unix PATH, --listen-fd N and/or --tcp ADDR")]
    NoListener,
    /// A listener could not be bound.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// The address.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Send buffer asked for each connection on a Unix socket (the kernel caps it at
/// `net.core.wmem_max`, 4 MiB by default). The default, 208 KiB, is less than one
/// 256 KiB chunk of a large output, so every chunk went out in two or three writes
/// with a wake-up of the reader between them; with 1 MiB binary exec streaming measured
/// 0.86x of a pipe at the median against 0.76x. The kernel allocates the memory only
/// while data waits in the socket. TCP connections are left to the kernel's
/// autotuning, which a fixed size would switch off.
const UNIX_SEND_BUFFER: usize = 1 << 20;

/// `listener` with [`UNIX_SEND_BUFFER`] asked for on every connection it accepts.
fn with_send_buffer(
    listener: UnixListener,
) -> impl axum::serve::Listener<Io = tokio::net::UnixStream, Addr = tokio::net::unix::SocketAddr> {
    axum::serve::ListenerExt::tap_io(listener, |s| {
        // Best effort: a refusal leaves the default, which works, only slower.
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&*s, UNIX_SEND_BUFFER);
    })
}

/// Serves `app` on `listener` until `stop` turns true.
fn serve_until<L>(listener: L, app: axum::Router, mut stop: watch::Receiver<bool>) -> JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
    })
}

/// The listening Unix socket inherited as `fd`. It is marked close-on-exec first: a
/// command that inherited it could accept the orchestrator's connections itself.
/// Inherited as a standard stream (0 to 2), it is moved off it first.
fn inherited_listener(fd: i32) -> std::io::Result<UnixListener> {
    use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
    // SAFETY: the number is only looked at (fstat, fcntl) while borrowed here; a number
    // that is not open makes those calls fail, which is reported.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let st = rustix::fs::fstat(borrowed)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Socket {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a socket",
        ));
    }
    let owned = if (0..=2).contains(&fd) {
        // Handed over as a standard stream (the local backend gives it as runc's stdin,
        // which runc passes through): moved to a descriptor of its own, close-on-exec,
        // and the stream made /dev/null, so that nothing reading or writing stdio talks
        // to the orchestrator's socket.
        let moved = rustix::io::fcntl_dupfd_cloexec(borrowed, 3)?;
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        // SAFETY: `fd` is open (fstat succeeded) and stays owned by the process's stdio
        // (ManuallyDrop: it is replaced, never closed, here).
        let mut stream = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd) });
        // dup2 clears close-on-exec on the new descriptor.
        rustix::io::dup2(&null, &mut stream)?;
        moved
    } else {
        rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::CLOEXEC)?;
        // SAFETY: the descriptor is open (fstat succeeded) and nothing else in this
        // process owns it: it was inherited for this purpose only.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    let std_listener = std::os::unix::net::UnixListener::from(owned);
    std_listener.set_nonblocking(true)?;
    UnixListener::from_std(std_listener)
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), RunError> {
    if config.unix.is_none() && config.tcp.is_none() && config.listen_fd.is_none() {
        return Err(RunError::NoListener);
    }
    // Beside the init, orphans go to it (PID 1, as programs expect); alone and not
    // PID 1 (outside a sandbox), the agent adopts them itself.
    if std::process::id() != 1 && !crate::pid1::init::under_init() {
        Reaper::become_subreaper();
    }
    // Lowering needs CAP_SYS_RESOURCE; without it the agent just keeps its score.
    let _ = std::fs::write("/proc/self/oom_score_adj", AGENT_OOM_SCORE_ADJ);
    warm_blocking_pool().await;

    let reaper = Arc::new(Reaper::new());
    reaper.clone().spawn_loop().map_err(RunError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;

    let state = AppState::new(config.clone(), reaper.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let servers = listen(&config, router(state.clone()), &stop_rx).await?;

    let sweep_state = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            sweep_state.sweep();
        }
    });

    let received = tokio::select! {
        _ = sigterm.recv() => libc::SIGTERM,
        _ = sigint.recv() => libc::SIGINT,
    };
    state.begin_shutdown();
    stop_commands(&reaper, received).await;
    let _ = stop_tx.send(true);
    for server in servers {
        // Streams still open would hold a graceful shutdown forever.
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    }
    if let Some(path) = &config.unix {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Starts blocking-pool threads now, while threads can be created: when the pids limit
/// is used up later, tokio queues blocking work on these instead of failing. A barrier
/// holds each task until all have started, so each got its own thread.
async fn warm_blocking_pool() {
    let all_started = Arc::new(std::sync::Barrier::new(WARM_BLOCKING_THREADS));
    let warm: Vec<_> = (0..WARM_BLOCKING_THREADS)
        .map(|_| {
            let all_started = all_started.clone();
            tokio::task::spawn_blocking(move || {
                all_started.wait();
            })
        })
        .collect();
    for thread in warm {
        let _ = thread.await;
    }
}

/// Serves `app` on every listener `config` names (Unix socket, inherited descriptor,
/// TCP) until `stop` turns true; answers the server tasks.
async fn listen(
    config: &Config,
    app: axum::Router,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, RunError> {
    let mut servers = Vec::new();
    if let Some(path) = &config.unix {
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        // A socket file left by an earlier run would make bind fail.
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|source| RunError::Bind {
            what: path.display().to_string(),
            source,
        })?;
        servers.push(serve_until(
            with_send_buffer(listener),
            app.clone(),
            stop.clone(),
        ));
    }
    if let Some(fd) = config.listen_fd {
        let listener = inherited_listener(fd).map_err(|source| RunError::Bind {
            what: format!("inherited descriptor {fd}"),
            source,
        })?;
        servers.push(serve_until(
            with_send_buffer(listener),
            app.clone(),
            stop.clone(),
        ));
    }
    if let Some(addr) = config.tcp {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::Bind {
                what: addr.to_string(),
                source,
            })?;
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        servers.push(serve_until(listener, app, stop.clone()));
    }
    Ok(servers)
}

/// Forwards `received` to every command's group, waits up to [`SHUTDOWN_GRACE`] for
/// them to end, then kills what is left.
async fn stop_commands(reaper: &Reaper, received: i32) {
    let children = reaper.live_pids();
    for pid in &children {
        kill_group(*pid, received);
    }
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    while children.iter().any(|p| group_alive(*p)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for pid in &children {
        kill_group(*pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener as _;

    use super::*;

    #[tokio::test]
    async fn connections_on_a_unix_listener_get_the_larger_send_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut listener = with_send_buffer(UnixListener::bind(&path).unwrap());
        let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (conn, _) = listener.accept().await;
        let size = rustix::net::sockopt::socket_send_buffer_size(&conn).unwrap();
        // The kernel doubles what it is asked for (bookkeeping) and caps it at
        // `net.core.wmem_max`; either way it is past the 208 KiB default.
        let cap = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(UNIX_SEND_BUFFER);
        assert!(
            size >= UNIX_SEND_BUFFER.min(cap),
            "send buffer {size} after asking for {UNIX_SEND_BUFFER}"
        );
    }
}
