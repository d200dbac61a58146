//! One keep-alive connection pool for every agent a process talks to: `hyper-util`'s
//! pooling client over a connector that dials an agent's Unix socket or TCP address.
//!
//! The pool is keyed by a request's authority, so each [`Endpoint`] is written into the
//! URI as one ([`authority`]): a TCP address as itself, a socket path hex-encoded behind
//! a `u` (a valid host name whatever the path holds). The [`Connector`] reads it back,
//! which keeps it stateless: nothing to register before a request, nothing to forget
//! after a sandbox is gone.
//!
//! [`crate::AgentClient`]s made with [`crate::AgentClient::with_pool`] and the
//! orchestrator's proxy share one [`Pool`]; a client made with [`crate::AgentClient::new`]
//! has a pool of its own.

use std::future::Future;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::either::Either;

use crate::Endpoint;

/// An error of a body sent through the pool.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request sent through the pool: whole bytes (the typed client) or a
/// stream (the proxy's uploads) behind one type, so one pool carries both.
pub type PoolBody = UnsyncBoxBody<Bytes, BoxError>;

/// How long an unused connection is kept.
const IDLE: Duration = Duration::from_secs(60);

/// A connection to an agent.
pub struct AgentStream(Either<UnixStream, TcpStream>);

/// Connects to `endpoint` (also used for WebSockets, which do not go through the pool).
pub async fn dial(endpoint: &Endpoint) -> io::Result<AgentStream> {
    Ok(AgentStream(match endpoint {
        Endpoint::Unix(path) => Either::Left(UnixStream::connect(path).await?),
        Endpoint::Tcp(addr) => {
            let tcp = TcpStream::connect(addr).await?;
            // Small request/answer pairs and keystrokes: no Nagle delay.
            tcp.set_nodelay(true)?;
            Either::Right(tcp)
        }
    }))
}

impl AsyncRead for AgentStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for AgentStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for AgentStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// The URI authority that stands for `endpoint` in the pool (see the module header).
pub fn authority(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Tcp(addr) => addr.to_string(),
        Endpoint::Unix(path) => format!("u{}", hex::encode(path.as_os_str().as_bytes())),
    }
}

/// The endpoint an authority of [`authority`] stands for.
fn endpoint_of(uri: &Uri) -> Option<Endpoint> {
    let authority = uri.authority()?.as_str();
    if let Ok(addr) = authority.parse() {
        return Some(Endpoint::Tcp(addr));
    }
    let path = hex::decode(authority.strip_prefix('u')?).ok()?;
    Some(Endpoint::Unix(PathBuf::from(std::ffi::OsString::from_vec(
        path,
    ))))
}

/// Dials the endpoint a request's authority names.
#[derive(Clone, Copy, Debug, Default)]
pub struct Connector;

type ConnectFuture = Pin<Box<dyn Future<Output = io::Result<TokioIo<AgentStream>>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<AgentStream>;
    type Error = io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let endpoint = endpoint_of(&uri);
        Box::pin(async move {
            let endpoint = endpoint.ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "not an agent endpoint")
            })?;
            dial(&endpoint).await.map(TokioIo::new)
        })
    }
}

/// Pooled keep-alive HTTP/1.1 connections to agents. Cheap to clone: clones share the
/// connections. Its connections run as tasks of the tokio runtime that opened them, so
/// a pool belongs to one runtime.
#[derive(Clone)]
pub struct Pool {
    client: Client<Connector, PoolBody>,
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

impl Pool {
    /// An empty pool.
    pub fn new() -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            // Reaps idle connections of sandboxes that are gone, not only on the next
            // checkout of the same agent (which never comes).
            .pool_timer(TokioTimer::new())
            .build(Connector);
        Pool { client }
    }

    /// Sends `req`, whose URI is absolute with an [`authority`], on a pooled
    /// connection; the connection goes back to the pool once the answer's body is read.
    pub async fn request(
        &self,
        req: Request<PoolBody>,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        self.client.request(req).await
    }
}

/// `e` and its sources, `: `-separated (the pool's own error says only "Connect").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_through_the_authority() {
        for endpoint in [
            Endpoint::Unix("/run/orchard/sb-1/agent.sock".into()),
            Endpoint::Unix("/tmp/with space/ü:@x".into()),
            Endpoint::Tcp("10.0.0.7:49983".parse().unwrap()),
            Endpoint::Tcp("[::1]:8080".parse().unwrap()),
        ] {
            let uri: Uri = format!("http://{}/v1/health", authority(&endpoint))
                .parse()
                .unwrap();
            assert_eq!(endpoint_of(&uri), Some(endpoint));
        }
        let other: Uri = "http://example.com/".parse().unwrap();
        assert_eq!(endpoint_of(&other), None);
    }
}
