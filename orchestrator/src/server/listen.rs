//! The HTTP listener: every connection is bounded before a key is checked (issue 30:
//! 20,000 idle connections with no key exhausted the server's descriptors, and 2,000
//! half-sent 372 KiB headers grew it by 1 GB).
//!
//! - **Caps**: at most [`ConnLimits::max_connections`] connections at once, and at
//!   most [`ConnLimits::max_connections_per_client`] from one client address. A
//!   connection over a cap is answered at once with a canned `503` (`Retry-After`,
//!   which the SDKs honour) and closed, instead of waiting in the kernel's backlog in
//!   front of everyone else's.
//! - **A reserve of descriptors**: unless the operator sets the cap, it is the
//!   open-file limit less a quarter of it (at least [`MIN_RESERVED_FILES`]): sandboxes,
//!   agent connections, journals and images always find a descriptor.
//! - **Time-outs**: the request head must arrive within `header_read_timeout` of the
//!   connection opening or of the previous response (hyper's header timer, which also
//!   bounds idle keep-alive connections), and a request body must make progress every
//!   `body_timeout` (tower-http's `TimeoutBody`, reset on every frame).
//! - **Header bytes**: at most `max_header_bytes` (`431` past it).
//!
//! An accept that fails for want of descriptors (`EMFILE`) leaves the connection in the
//! backlog and retries shortly; nothing else stops the loop.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// Descriptors always kept back from client connections, at the least.
pub const MIN_RESERVED_FILES: u64 = 256;
/// The default cap on connections at once (before the descriptor reserve).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;
/// The default cap on connections from one client address.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 2_048;
/// The default bound on a request's head (start line and headers).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 << 10;
/// The default time a request head may take, and a keep-alive connection may idle.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(20);
/// The default time a request body may go without sending anything.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often failed accepts are logged at most.
const WARN_EVERY: Duration = Duration::from_secs(1);
/// How long an accept waits after running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// The listener's bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnLimits {
    /// Connections at once; `None`: [`DEFAULT_MAX_CONNECTIONS`] within the descriptor
    /// reserve.
    pub max_connections: Option<usize>,
    /// Connections at once from one client address.
    pub max_connections_per_client: usize,
    /// Bytes of a request head.
    pub max_header_bytes: usize,
    /// Time for a request head, from the connection's start or the previous response.
    pub header_read_timeout: Duration,
    /// Time a request body may go without a frame.
    pub body_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: None,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

impl ConnLimits {
    /// The cap on connections at once given an open-file limit of `open_files`: the
    /// operator's, or the default kept under the limit less its reserve.
    pub fn effective_max_connections(&self, open_files: u64) -> usize {
        if let Some(n) = self.max_connections {
            return n.max(1);
        }
        let reserve = (open_files / 4).max(MIN_RESERVED_FILES);
        let room = open_files.saturating_sub(reserve).max(1);
        DEFAULT_MAX_CONNECTIONS.min(usize::try_from(room).unwrap_or(usize::MAX))
    }
}

/// The soft open-file limit of this process.
pub fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Connections counted per client address; a [`ClientSlot`] gives its slot back.
#[derive(Default)]
struct PerClient {
    /// Open connections by address. Held only to count up or down.
    counts: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in the caps, released when the connection ends (also when
/// it was upgraded to a WebSocket and lives on in its handler).
struct ClientSlot {
    per_client: Arc<PerClient>,
    ip: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self
            .per_client
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// The caps at run time.
struct Gate {
    total: Arc<Semaphore>,
    per_client: Arc<PerClient>,
    per_client_max: usize,
}

impl Gate {
    /// A slot for a connection from `ip`, or `None` when a cap is reached.
    fn admit(&self, ip: IpAddr) -> Option<ClientSlot> {
        let permit = self.total.clone().try_acquire_owned().ok()?;
        let mut counts = self
            .per_client
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.per_client_max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            per_client: self.per_client.clone(),
            ip,
            _permit: permit,
        })
    }
}

/// What a connection over a cap is told before it is closed.
const OVER_CAP: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 62\r\n\r\n{\"detail\":\"too many connections to the server, retry shortly\"}";

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then
/// lets requests in flight finish for a few seconds.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let max = limits.effective_max_connections(open_file_limit());
    tracing::info!(
        max_connections = max,
        max_connections_per_client = limits.max_connections_per_client,
        "connection limits"
    );
    let gate = Gate {
        total: Arc::new(Semaphore::new(max)),
        per_client: Arc::default(),
        per_client_max: limits.max_connections_per_client.max(1),
    };
    // Every connection task holds a receiver: `closed()` says when all have ended.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let limits = Arc::new(limits);
    tokio::pin!(shutdown);
    // Failed accepts are logged once a second at most, with their count.
    let (mut failed_accepts, mut last_warning) = (0u64, None);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE/ENFILE leave the connection queued; anything else is the
                    // peer's (reset before accept). Either way: on with the loop.
                    failed_accepts += 1;
                    if last_warning.is_none_or(|t: std::time::Instant| t.elapsed() >= WARN_EVERY) {
                        tracing::warn!(error = %e, failed_accepts, "accept failed");
                        last_warning = Some(std::time::Instant::now());
                        failed_accepts = 0;
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = gate.admit(peer.ip()) else {
            refuse(stream, peer);
            continue;
        };
        tokio::spawn(connection(
            stream,
            router.clone(),
            limits.clone(),
            slot,
            stopping.clone(),
        ));
    }
    drop(listener);
    drop(stopping);
    let _ = stop.send(true);
    if tokio::time::timeout(SHUTDOWN_GRACE, stop.closed())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight at shutdown were cut");
    }
}

/// Answers a connection over a cap with [`OVER_CAP`] (if its buffer takes it at once)
/// and closes it.
fn refuse(stream: TcpStream, peer: SocketAddr) {
    tracing::debug!(%peer, "connection refused: over the connection cap");
    let _ = stream.try_write(OVER_CAP);
    // SO_LINGER 0 would reset it; a plain close lets the answer reach the client.
    drop(stream);
}

/// Serves one connection (HTTP/1 with upgrades, for WebSockets) within the bounds,
/// until it closes or shutdown asks it to finish its request in flight.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: Arc<ConnLimits>,
    slot: ClientSlot,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let body_timeout = limits.body_timeout;
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let req: Request =
            req.map(|b| Body::new(tower_http::timeout::TimeoutBody::new(body_timeout, b)));
        router.clone().oneshot(req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    let conn = builder
        .serve_connection(
            TokioIo::new(SlotStream {
                stream,
                _slot: slot,
            }),
            service,
        )
        .with_upgrades();
    tokio::pin!(conn);
    // Errors are the client's (a reset, a time-out): there is nobody to answer.
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stopping.wait_for(|s| *s) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// The connection's socket holding its place in the caps: dropped when the
/// connection closes, or when an upgraded stream's handler lets it go.
struct SlotStream {
    stream: TcpStream,
    _slot: ClientSlot,
}

impl tokio::io::AsyncRead for SlotStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SlotStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_keeps_a_reserve_of_descriptors() {
        let l = ConnLimits::default();
        assert_eq!(l.effective_max_connections(1024), 768);
        assert_eq!(l.effective_max_connections(20_000), 15_000);
        assert_eq!(
            l.effective_max_connections(1 << 20),
            DEFAULT_MAX_CONNECTIONS
        );
        assert_eq!(l.effective_max_connections(100), 1);
        let set = ConnLimits {
            max_connections: Some(50_000),
            ..ConnLimits::default()
        };
        assert_eq!(
            set.effective_max_connections(1024),
            50_000,
            "the operator's"
        );
    }

    #[test]
    fn the_per_client_cap_counts_each_address_and_gives_slots_back() {
        let gate = Gate {
            total: Arc::new(Semaphore::new(3)),
            per_client: Arc::default(),
            per_client_max: 2,
        };
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = gate.admit(a).unwrap();
        let _a2 = gate.admit(a).unwrap();
        assert!(gate.admit(a).is_none(), "per client");
        let _b1 = gate.admit(b).unwrap();
        assert!(gate.admit(b).is_none(), "in total");
        drop(a1);
        assert!(gate.admit(a).is_some(), "a slot given back");
    }
}
