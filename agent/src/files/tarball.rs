//! `PUT` and `GET /v1/files/archive`: a tar or tar.gz body extracted into a directory,
//! and a path streamed out as tar.gz. The tar logic itself lives in
//! [`crate::archive`]; it is synchronous (the `tar` crate), runs on blocking threads
//! and talks to the async body through bounded channels, see `BodyReader` and
//! `ChannelWriter`.

use std::io::{self, Read, Write};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::StreamExt;
use orchard_protocol::files::ExtractResult;
use tokio::sync::mpsc;

use super::{absolute, blocking_failed, too_large, unreadable_body, PathQuery, CHUNK};
use crate::archive;
use crate::error::{ApiError, ApiResult};
use crate::extract::{content_length, ApiQuery};
use crate::fsuser;
use crate::state::AppState;

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

/// A blocking `Read` over body chunks sent through a channel. A sender dropped without
/// [`Chunk::End`] reads as an error, not an end: a cancelled upload must never look
/// like a complete (shorter) archive.
struct BodyReader {
    rx: mpsc::Receiver<Chunk>,
    current: Bytes,
    done: bool,
}

impl BodyReader {
    fn new(rx: mpsc::Receiver<Chunk>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
            done: false,
        }
    }
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(data)) => self.current = data,
                Some(Chunk::End) => self.done = true,
                Some(Chunk::Fail(message)) => return Err(io::Error::other(message)),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the request body ended early",
                    ))
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
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
    State(state): State<Arc<AppState>>,
    ApiQuery(q): ApiQuery<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ExtractResult>> {
    let limit = state.config.limits.max_upload_bytes;
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
    let job = fsuser::blocking(move || archive::extract(BodyReader::new(rx), &dir));
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

/// A blocking `Write` that sends what it is given, in chunks, through a channel. When
/// the receiver is gone (the client disconnected) writes fail, which stops the writer.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Self {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

pub(super) async fn download_archive(ApiQuery(q): ApiQuery<PathQuery>) -> ApiResult<Response> {
    let path = absolute(&q.path)?;
    // Checked here so a missing path is a 404, not an aborted 200.
    tokio::fs::symlink_metadata(&path)
        .await
        .map_err(|err| ApiError::io("archive", &q.path, &err))?;
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(QUEUE);
    tokio::task::spawn_blocking(move || {
        if let Err(err) = archive::build(&path, ChannelWriter::new(tx.clone())) {
            // The status is already sent; an error item aborts the body so the client
            // sees a broken transfer rather than a short archive that looks complete.
            let _ = tx.blocking_send(Err(io::Error::other(err.to_string())));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
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

    use crate::files::tests::no_leftovers;

    #[test]
    fn body_reader_needs_an_explicit_end() {
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Chunk::Data(Bytes::from_static(b"abc")))
            .unwrap();
        tx.try_send(Chunk::End).unwrap();
        let mut out = Vec::new();
        BodyReader::new(rx).read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abc");

        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Chunk::Data(Bytes::from_static(b"abc")))
            .unwrap();
        drop(tx);
        let err = BodyReader::new(rx)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);

        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Chunk::Fail("too large".into())).unwrap();
        assert!(BodyReader::new(rx).read_to_end(&mut Vec::new()).is_err());
    }

    #[test]
    fn channel_writer_stops_when_the_receiver_is_gone() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut writer = ChannelWriter::new(tx);
        writer.write_all(b"hello").unwrap();
        writer.flush().unwrap();
        assert_eq!(
            rx.try_recv().unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        drop(rx);
        writer.write_all(&[0u8; CHUNK]).unwrap_err();
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
