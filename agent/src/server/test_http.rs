//! Tests only: the full router served over TCP, and raw HTTP/1.1 against it, for tests
//! that go through auth and body draining or need the connection itself. Like
//! [`crate::server::run`], it starts the server from [`crate::server::router`].

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::config::Config;
use crate::server::router::router;
use crate::server::state::AppState;

/// Serves the router with token `tok` on a fresh port.
pub async fn serve() -> SocketAddr {
    serve_with(Config::new("tok")).await
}

/// Serves the router with `config` on a fresh port.
pub async fn serve_with(config: Config) -> SocketAddr {
    let state = AppState::new(config, Arc::new(crate::proc::reaper::Reaper::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    addr
}

/// Sends the whole request, body included, then reads the answer: a server that
/// answers and closes before it read the body makes this fail (broken pipe or
/// reset) instead of answering.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, serde_json::Value)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nx-orchard-token: tok\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no answer"))?;
    let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap_or(0);
    let body = serde_json::from_slice(&raw[split + 4..]).unwrap_or_default();
    Ok((status, body))
}
