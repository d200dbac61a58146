//! `PUT` and `GET /v1/files/archive`: a tar or tar.gz body extracted into a directory,
//! and a path streamed out as tar.gz. The tar logic itself lives in
//! [`crate::api::files::archive`]; it is synchronous (the `tar` crate), runs on blocking threads
//! and talks to the async body through `tokio-util`'s bridges: an upload reaches the
//! extractor as a `SyncIoBridge` over a `StreamReader` of body chunks (`body_reader`), a
//! download leaves the builder through a `SyncIoBridge` over an in-memory pipe that a
//! `ReaderStream` turns into the response body (`download_archive`). Both are bounded,
//! so a slow side holds the other back instead of buffering the whole stream.

use std::io::{self, BufWriter, Read};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use orchard_protocol::files::ExtractResult;
use tokio::io::DuplexStream;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio_util::io::{ReaderStream, StreamReader, SyncIoBridge};

use super::common::{
    absolute, blocking_failed, too_large, unreadable_body, Files, PathQuery, CHUNK,
};
use super::guard;
use crate::api::extract::{content_length, ApiQuery};
use crate::api::files::archive;
use crate::error::{ApiError, ApiResult};
use crate::pid1::fsuser;

/// Chunks queued between the async body and a blocking tar reader or writer; bounded
/// so a slow side holds the other back instead of buffering the whole stream.
const QUEUE: usize = 8;

/// One message from the async body to a blocking reader.
enum Chunk {
    Data(Bytes),
    /// The body ended cleanly.
    End,
    /// The body failed (too large, unreadable); the reader must fail too.
    Fail(String),
}

/// A blocking `Read` over body chunks sent through a channel, reading through `handle`'s
/// runtime. A sender dropped without [`Chunk::End`] reads as an error, not an end: a
/// cancelled upload must never look like a complete (shorter) archive.
fn body_reader(rx: mpsc::Receiver<Chunk>, handle: Handle) -> impl Read {
    SyncIoBridge::new_with_handle(StreamReader::new(Box::pin(chunks(rx))), handle)
}

/// The body bytes of `rx`, ended by [`Chunk::End`], failed by anything else.
fn chunks(rx: mpsc::Receiver<Chunk>) -> impl Stream<Item = io::Result<Bytes>> {
    futures_util::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Chunk::Data(data)) => Some((Ok(data), Some(rx))),
            Some(Chunk::End) => None,
            Some(Chunk::Fail(message)) => Some((Err(io::Error::other(message)), None)),
            None => Some((
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the request body ended early",
                )),
                None,
            )),
        }
    })
}

/// Sends `body` into `tx`, enforcing `limit`. A receiver that stops listening is not an
/// error here: the reader's own result says why it stopped.
async fn feed_body(body: Body, tx: mpsc::Sender<Chunk>, limit: u64) -> ApiResult<()> {
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let Ok(data) = chunk else {
            let _ = tx
                .send(Chunk::Fail("the request body could not be read".into()))
                .await;
            return Err(unreadable_body());
        };
        total += data.len() as u64;
        if total > limit {
            let _ = tx
                .send(Chunk::Fail("the request body is too large".into()))
                .await;
            return Err(too_large(limit));
        }
        if data.is_empty() {
            continue;
        }
        if tx.send(Chunk::Data(data)).await.is_err() {
            return Ok(());
        }
    }
    let _ = tx.send(Chunk::End).await;
    Ok(())
}

pub(super) async fn upload_archive(
    State(files): State<Files>,
    ApiQuery(q): ApiQuery<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ExtractResult>> {
    let limit = files.max_upload_bytes;
    extract_body(q.path, &headers, body, limit).await.map(Json)
}

/// Extracts a tar or tar.gz body into `shown`, streaming it to a blocking extractor.
async fn extract_body(
    shown: String,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> ApiResult<ExtractResult> {
    let dir = absolute(&shown)?;
    if content_length(headers).is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let (tx, rx) = mpsc::channel(QUEUE);
    let reader = body_reader(rx, Handle::current());
    let job = fsuser::blocking(move || archive::extract(reader, &dir));
    let fed = feed_body(body, tx, limit).await;
    let extracted = job.await.map_err(|_| blocking_failed("extraction"))?;
    // A body error comes first: the extraction then failed only because its input was
    // cut, and it has already cleaned up.
    fed?;
    let stats = extracted?;
    Ok(ExtractResult {
        path: shown,
        entries: stats.entries,
        bytes: stats.bytes,
    })
}

/// The bytes `produce` writes on a blocking thread, as a body stream. The writer is one
/// end of a bounded pipe (bridged to blocking writes), the body streams from the other,
/// so a slow client holds the producer back; when the client goes away, the producer's
/// writes fail. A producer that fails has its error sent after the bytes it wrote: the
/// status is already out by then, and an error item aborts the body so the client sees
/// a broken transfer rather than a short one that looks complete.
fn written_body<E: std::fmt::Display>(
    produce: impl FnOnce(BufWriter<SyncIoBridge<DuplexStream>>) -> Result<(), E> + Send + 'static,
) -> impl Stream<Item = io::Result<Bytes>> {
    let (pipe_out, pipe_in) = tokio::io::duplex(QUEUE * CHUNK);
    let (done_tx, done_rx) = oneshot::channel();
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let out = BufWriter::with_capacity(CHUNK, SyncIoBridge::new_with_handle(pipe_in, handle));
        // `produce` owns the writer: the pipe has ended before the outcome is sent.
        let produced = produce(out);
        let _ = done_tx.send(produced.map_err(|err| err.to_string()));
    });
    let outcome = futures_util::stream::once(done_rx).filter_map(|done| async move {
        match done {
            Ok(Ok(())) => None,
            Ok(Err(message)) => Some(Err(io::Error::other(message))),
            Err(_) => Some(Err(io::Error::other("the archive builder stopped"))),
        }
    });
    ReaderStream::with_capacity(pipe_out, CHUNK).chain(outcome)
}

pub(super) async fn download_archive(ApiQuery(q): ApiQuery<PathQuery>) -> ApiResult<Response> {
    let path = absolute(&q.path)?;
    // Checked here so a missing or unreadable path is a 404 or 403, not an aborted 200.
    // As the image's user, as the archive itself is built (see `fsuser`), and resolved
    // by `guard`: a planted link to a root-only file or directory, or to the agent's
    // own /proc entries, is refused, not archived.
    let at = path.clone();
    fsuser::blocking(move || guard::resolve(&at, false).and_then(|_| archive::check_readable(&at)))
        .await
        .map_err(|_| blocking_failed("archive"))?
        .map_err(|err| ApiError::io("archive", &q.path, &err))?;
    let stream = written_body(move |out| fsuser::run(|| archive::build(&path, out).map(drop)));
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/gzip"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use orchard_protocol::ErrorCode;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use crate::api::files::tests::no_leftovers;

    #[test]
    fn body_reader_needs_an_explicit_end() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let read = |chunks: Vec<Chunk>| {
            let (tx, rx) = mpsc::channel(4);
            for chunk in chunks {
                tx.try_send(chunk).unwrap();
            }
            drop(tx);
            let mut out = Vec::new();
            body_reader(rx, runtime.handle().clone())
                .read_to_end(&mut out)
                .map(|_| out)
        };
        let abc = || Chunk::Data(Bytes::from_static(b"abc"));
        assert_eq!(read(vec![abc(), abc(), Chunk::End]).unwrap(), b"abcabc");
        let err = read(vec![abc()]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(read(vec![abc(), Chunk::Fail("too large".into())]).is_err());
    }

    /// A producer failing midway aborts the body after what it wrote; one that
    /// succeeds ends it cleanly, however much it wrote.
    #[tokio::test]
    async fn a_failed_producer_aborts_the_body_after_its_bytes() {
        use std::io::Write;
        let failed = written_body(|mut out| {
            out.write_all(b"partial")?;
            out.flush()?;
            Err(io::Error::other("disk on fire"))
        });
        let items: Vec<io::Result<Bytes>> = failed.collect().await;
        let (last, bytes) = items.split_last().unwrap();
        assert_eq!(last.as_ref().unwrap_err().to_string(), "disk on fire");
        let bytes: Vec<u8> = bytes
            .iter()
            .flat_map(|b| b.as_ref().unwrap().to_vec())
            .collect();
        assert_eq!(bytes, b"partial");

        let big = vec![5u8; QUEUE * CHUNK * 3 + 7];
        let copy = big.clone();
        let whole = written_body(move |mut out| out.write_all(&copy));
        let items: Vec<io::Result<Bytes>> = whole.collect().await;
        let bytes: Vec<u8> = items
            .into_iter()
            .flat_map(|b| b.unwrap().to_vec())
            .collect();
        assert_eq!(bytes, big);
    }

    fn tar_gz_of(dir: &Path) -> Vec<u8> {
        archive::build(dir, Vec::new()).unwrap()
    }

    #[tokio::test]
    async fn archives_upload_and_download_over_bodies() {
        let src = tempfile::tempdir().unwrap();
        let tree = src.path().join("tree");
        fs::create_dir_all(tree.join("sub")).unwrap();
        fs::write(tree.join("sub/f"), vec![9u8; 300_000]).unwrap();
        symlink("sub/f", tree.join("l")).unwrap();

        let response = download_archive(ApiQuery(PathQuery {
            path: tree.to_string_lossy().into_owned(),
        }))
        .await
        .unwrap();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/gzip");
        let gz = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(gz[..], tar_gz_of(&tree)[..]);

        let dest = tempfile::tempdir().unwrap();
        let shown = dest.path().join("out").to_string_lossy().into_owned();
        // Small chunks: the extractor must stitch them, not expect one buffer.
        let pieces: Vec<Result<Bytes, io::Error>> = gz
            .chunks(1000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures_util::stream::iter(pieces));
        let result = extract_body(shown.clone(), &HeaderMap::new(), body, 10 << 20)
            .await
            .unwrap();
        assert_eq!((result.entries, result.bytes), (4, 300_000));
        assert_eq!(
            fs::read(dest.path().join("out/tree/sub/f")).unwrap().len(),
            300_000
        );

        let err = extract_body(
            shown.clone(),
            &HeaderMap::new(),
            Body::from(gz.clone()),
            100,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        let err = extract_body("rel".into(), &HeaderMap::new(), Body::from(gz.clone()), 100)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);

        let fresh = dest.path().join("fresh");
        let cut = gz.slice(..gz.len() / 2);
        let err = extract_body(
            fresh.to_string_lossy().into_owned(),
            &HeaderMap::new(),
            Body::from(cut),
            10 << 20,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArchive);
        assert!(!fresh.exists());
        assert!(no_leftovers(&dest.path().join("out")));

        let err = download_archive(ApiQuery(PathQuery {
            path: "/definitely/not/here".into(),
        }))
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    #[tokio::test]
    async fn an_oversized_archive_stream_changes_nothing() {
        let src = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("a"), b"a").unwrap();
        let gz = tar_gz_of(&tree);
        let dest = tempfile::tempdir().unwrap();
        // The archive fits; the padding after it pushes the body over the limit.
        let mut body = gz.clone();
        body.extend(vec![0u8; 4096]);
        let limit = gz.len() as u64 + 100;
        let pieces: Vec<Result<Bytes, io::Error>> = body
            .chunks(512)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let err = extract_body(
            dest.path().to_string_lossy().into_owned(),
            &HeaderMap::new(),
            Body::from_stream(futures_util::stream::iter(pieces)),
            limit,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        assert_eq!(fs::read_dir(dest.path()).unwrap().count(), 0);
    }
}
