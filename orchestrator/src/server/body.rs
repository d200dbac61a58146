//! Request bodies as the routes read them: whole within a limit ([`read_limited`]), or
//! as a stream of pieces for the compatible upload ([`UploadBody`]), whose spooling is
//! the service's ([`crate::service::files::upload`]). A body refused for its size is
//! read on and dropped before the answer ([`drain`]), so that the client, still
//! sending, gets to see it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt;
use hyper::body::Body as _;

use crate::service::files::upload::BodyFault;
use crate::service::patch::MAX_PATCH_BYTES;
use crate::service::Error;

/// Largest JSON body of most routes.
pub const MAX_JSON: usize = 16 << 20;
/// Largest body of `apply_patch`: [`MAX_PATCH_BYTES`] of patch with room for JSON's
/// escapes (issue 30: four 450 MiB patches took the server to 5 GB).
pub const MAX_PATCH_JSON: usize = 2 * MAX_PATCH_BYTES + (64 << 10);

/// How much of a body over its limit is still read (and dropped) before the 413 is
/// answered, and for how long. A server that answers while the client still sends, then
/// closes, makes the client's write fail (broken pipe, reset) before it can read the
/// answer: with the body read, the client sees the 413. Larger bodies are cut off.
pub(super) const DRAIN_MAX: usize = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// The length a request declares (`Content-Length`), if it does.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Reads a whole body of at most `limit` bytes; a larger one is 413 (and read to its end
/// first, within [`DRAIN_MAX`], so the client gets to see the answer).
pub async fn read_limited(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Vec<u8>, Error> {
    let too_large = || Error::TooLarge(format!("the body is larger than {limit} bytes"));
    let declared = declared_length(headers).map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if declared.is_some_and(|n| n > limit) {
        if declared.is_some_and(|n| n - limit <= DRAIN_MAX) {
            drain(body).await;
        }
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(MAX_JSON));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::BadRequest(format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            drain(body).await;
            return Err(too_large());
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes)
}

/// Reads and drops the rest of `body`, within [`DRAIN_MAX`] bytes and `DRAIN_TIME`.
pub(super) async fn drain(mut body: Body) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut dropped = 0;
        while let Some(Ok(frame)) = body.frame().await {
            dropped += frame.data_ref().map_or(0, |d| d.len());
            if dropped > DRAIN_MAX {
                break;
            }
        }
    })
    .await;
}

/// Whether a body's error is the listener's body time-out (`TimeoutBody`).
pub fn is_body_timeout(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The upload's body as the service reads it: its data pieces (trailers skipped), a
/// failure told as a [`BodyFault`]. It remembers whether it was read from, which
/// decides whether a refusal is answered after the rest of the body ([`Self::finish`]).
pub struct UploadBody {
    body: Body,
    declared: Option<u64>,
    read_from: bool,
}

impl UploadBody {
    /// The body of a request that declared `declared` bytes.
    pub fn new(body: Body, declared: Option<u64>) -> UploadBody {
        UploadBody {
            body,
            declared,
            read_from: false,
        }
    }

    /// After the upload failed with `e`: a refusal for size (or for the host's spools
    /// being full) is answered once the body is read on and dropped, so that the client,
    /// still sending, gets to see it. A body refused before it was read (from its
    /// declared length) is read on only when short enough to read in vain, as
    /// [`read_limited`] does.
    pub async fn finish(self, e: &Error) {
        let drain_it = if self.read_from {
            matches!(
                e,
                Error::TooLarge(_) | Error::Unavailable(_) | Error::StoreUnavailable(_)
            )
        } else {
            matches!(e, Error::TooLarge(_)) && self.declared.is_some_and(|d| d <= DRAIN_MAX as u64)
        };
        if drain_it {
            drain(self.body).await;
        }
    }
}

impl Stream for UploadBody {
    type Item = Result<Bytes, BodyFault>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.read_from = true;
        loop {
            let frame = match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(if is_body_timeout(&e) {
                        BodyFault::Stalled
                    } else {
                        BodyFault::Broken(e.to_string())
                    })))
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                return Poll::Ready(Some(Ok(data)));
            }
        }
    }
}
