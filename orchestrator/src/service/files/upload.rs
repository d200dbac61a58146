//! The compatible file upload (`POST /sandboxes/{id}/files`): the body is read through
//! the [`UploadParser`] into a private spool file, charged as it grows and held to its
//! pace ([`super::spool`]: the sandbox's disk, the host's bound, the progress rule),
//! then the spool is streamed to the agent. Memory stays bounded whatever the file's
//! size, and so do the spools.
//!
//! The body comes as a stream of pieces from whatever reads it (the server's request
//! body); how it failed is a [`BodyFault`], the only part of the transport seen here.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use orchard_client::PoolBody;
use orchard_protocol::compat::Uploaded;

use super::parser::{Parsed, UploadParser};
use super::spool::{Spool, SpoolError, Spools};
use super::{agent_unreachable, MAX_UPLOAD_JSON};
use crate::service::{Error, Live, Service, Tenant};

/// Why a piece of an upload's body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyFault {
    /// Nothing came for the body time-out: the listener cut the body (a 408).
    Stalled,
    /// The body could not be read, for this reason (a 400).
    Broken(String),
}

impl Service {
    /// Writes the file an upload body (`{"path", "content": base64}`) carries to
    /// sandbox `id`: spooled in `spools` first (refused up front when `declared`, the
    /// body's length if the client said, cannot fit), then sent to the agent. The path
    /// is made absolute against the sandbox's working directory.
    pub async fn upload<B>(
        &self,
        tenant: &Tenant,
        id: &str,
        spools: &Arc<Spools>,
        declared: Option<u64>,
        body: &mut B,
    ) -> Result<Uploaded, Error>
    where
        B: Stream<Item = Result<Bytes, BodyFault>> + Unpin,
    {
        let live = self.ready(tenant, id).await?;
        let room = self.backend().disk_room(id).map(|d| d.room());
        let mut spool = spools.open(id, room, declared)?;
        // On any failure from here the spool goes (dropped with its charge) before the
        // answer.
        let parsed = spool_body(spools, &mut spool, body).await?;
        if parsed.path.is_empty() {
            return Err(Error::BadRequest("path must not be empty".into()));
        }
        let path = Service::resolve(&live, &parsed.path);
        send_spool(&live, &spool, &path).await?;
        Ok(Uploaded {
            success: true,
            path,
            size: parsed.size,
        })
    }
}

/// Reads `body` into `spool` through the upload parser, charging the spool as it
/// grows and holding the body to its pace; answers the parsed fields.
pub async fn spool_body<B>(
    spools: &Spools,
    spool: &mut Spool,
    body: &mut B,
) -> Result<Parsed, Error>
where
    B: Stream<Item = Result<Bytes, BodyFault>> + Unpin,
{
    let file = std::fs::File::options()
        .write(true)
        .open(spool.path())
        .map_err(|e| Error::internal("cannot spool the upload", e))?;
    let mut parser = UploadParser::new(std::io::BufWriter::new(file));
    let mut pace = spools.pace();
    let mut read = 0usize;
    loop {
        let data = match tokio::time::timeout_at(pace.deadline(), body.next()).await {
            // A window ended while waiting: it must have brought enough.
            Err(_) => {
                pace.window_ended()?;
                continue;
            }
            Ok(None) => break,
            Ok(Some(Ok(data))) => data,
            Ok(Some(Err(BodyFault::Stalled))) => {
                return Err(SpoolError::Stalled(spools.window()).into())
            }
            Ok(Some(Err(BodyFault::Broken(e)))) => {
                return Err(Error::BadRequest(format!("reading the body: {e}")))
            }
        };
        read += data.len();
        if read > MAX_UPLOAD_JSON {
            return Err(Error::TooLarge(format!(
                "the body is larger than {MAX_UPLOAD_JSON} bytes"
            )));
        }
        pace.add(data.len())?;
        parser.push(&data)?;
        spool.charge_to(parser.size())?;
    }
    let (parsed, sink) = parser.finish()?;
    spool.charge_to(parsed.size)?;
    sink.into_inner()
        .map_err(|e| Error::internal("cannot spool the upload", e.error().to_string()))?;
    Ok(parsed)
}

/// Streams the spool to the agent as the file at `path`.
async fn send_spool(live: &Live, spool: &Spool, path: &str) -> Result<(), Error> {
    let file = tokio::fs::File::open(spool.path())
        .await
        .map_err(|e| Error::internal("cannot read the spooled upload", e))?;
    let frames = tokio_util::io::ReaderStream::new(file).map(|r| r.map(hyper::body::Frame::data));
    let body = http_body_util::StreamBody::new(frames)
        .map_err(Into::into)
        .boxed_unsync();
    let failure = match put_file(live, path, body).await {
        Err(
            e @ (Error::Sandbox(_) | Error::AgentUnreachable { .. } | Error::AgentFailed { .. }),
        ) => e,
        other => return other,
    };
    // The agent refuses a write it cannot do (a read-only path, a missing parent)
    // before reading the body, and closes the connection under the stream, which reads
    // as a transport failure here. An empty write next to the target names the real
    // reason.
    let dir = std::path::Path::new(path)
        .parent()
        .map_or_else(|| "/".to_string(), |d| d.display().to_string());
    let probe = format!(
        "{}/.orchard-upload-probe-{}",
        dir.trim_end_matches('/'),
        crate::random::hex(6)?
    );
    match live.agent.write_file(&probe, Vec::new(), None).await {
        Err(e) => Err(e.into()),
        Ok(_) => {
            let _ = live.agent.remove(&probe, false).await;
            Err(failure)
        }
    }
}

/// `PUT /v1/files?path=` on the sandbox's agent with a streamed body: the file is
/// written atomically by the agent, never held whole here.
pub async fn put_file(live: &Live, path: &str, body: PoolBody) -> Result<(), Error> {
    let uri = live
        .agent
        .uri(&format!("/v1/files?path={}", orchard_client::encode(path)));
    let req = hyper::Request::builder()
        .method(hyper::Method::PUT)
        .uri(uri)
        .header("content-type", "application/octet-stream")
        .body(body)
        .map_err(|e| Error::BadRequest(format!("cannot send this file: {e}")))?;
    let resp = live.agent.forward(req).await.map_err(agent_unreachable)?;
    let status = resp.status();
    let body = http_body_util::Limited::new(resp.into_body(), 1 << 20)
        .collect()
        .await
        .map_err(|e| Error::Sandbox(format!("the sandbox's agent failed mid-answer: {e}")))?
        .to_bytes();
    if status.is_success() {
        return Ok(());
    }
    Err(match serde_json::from_slice(&body) {
        Ok(body) => orchard_client::ClientError::Api { status, body }.into(),
        Err(_) => Error::Sandbox(format!("the sandbox's agent answered {status}")),
    })
}
