//! `GET /v1/files`: a file, or a byte range of it, streamed in chunks.

use std::io;

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use orchard_protocol::ErrorCode;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::common::{absolute, blocking_failed, CHUNK};
use super::guard;
use crate::api::extract::ApiQuery;
use crate::error::{ApiError, ApiResult};
use crate::pid1::fsuser;

#[derive(Deserialize)]
pub(super) struct ReadQuery {
    path: String,
    offset: Option<u64>,
    length: Option<u64>,
}

pub(super) async fn read_file(ApiQuery(q): ApiQuery<ReadQuery>) -> ApiResult<Response> {
    let path = absolute(&q.path)?;
    let io_err = |err: io::Error| ApiError::io("read", &q.path, &err);
    // Resolved and opened as the image's user (see `fsuser`), never through a /proc
    // magic link nor into the agent's own /proc entries (see `guard`): a link the
    // sandbox planted to a root-only file or to the agent's first environment (which
    // held its token) is refused as it would be for the user's own `cat`. Once open,
    // the descriptor is read on the async runtime like any other.
    let opened = fsuser::blocking(move || guard::open_regular(&path))
        .await
        .map_err(|_| blocking_failed("read"))?
        .map_err(io_err)?;
    let (file, meta) = match opened {
        Ok(opened) => opened,
        Err(meta) if meta.is_dir() => {
            return Err(ApiError::new(
                ErrorCode::IsADirectory,
                format!("read {}: is a directory", q.path),
            ))
        }
        Err(_) => {
            return Err(ApiError::invalid(format!(
                "read {}: not a regular file",
                q.path
            )))
        }
    };
    let mut file = tokio::fs::File::from_std(file);
    let offset = q.offset.unwrap_or(0);
    let size = meta.len();
    // Files of /proc and /sys report size 0 yet have content: those are streamed to
    // their end without a Content-Length.
    let (limit, declared) = if size == 0 {
        (q.length.unwrap_or(u64::MAX), None)
    } else {
        let available = size.saturating_sub(offset);
        let n = q.length.map_or(available, |length| length.min(available));
        (n, Some(n))
    };
    if offset > 0 {
        file.seek(io::SeekFrom::Start(offset))
            .await
            .map_err(io_err)?;
    }
    let reader = file.take(limit);
    let stream = futures_util::stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        let mut buf = BytesMut::with_capacity(CHUNK);
        match reader.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(buf.freeze()), Some(reader))),
            Err(err) => Some((Err(err), None)),
        }
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(n) = declared {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::fs;

    #[tokio::test]
    async fn reads_stream_whole_files_and_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &data).unwrap();
        let shown = path.to_string_lossy().into_owned();
        let read = |offset, length| ReadQuery {
            path: shown.clone(),
            offset,
            length,
        };

        let response = read_file(ApiQuery(read(None, None))).await.unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "200000");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[..], data[..]);

        let response = read_file(ApiQuery(read(Some(1000), Some(10))))
            .await
            .unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "10");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[..], data[1000..1010]);

        let response = read_file(ApiQuery(read(Some(199_990), Some(100))))
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[..], data[199_990..]);

        let response = read_file(ApiQuery(read(Some(500_000), None)))
            .await
            .unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "0");

        let dir_read = ReadQuery {
            path: dir.path().to_string_lossy().into_owned(),
            offset: None,
            length: None,
        };
        let err = read_file(ApiQuery(dir_read)).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::IsADirectory);
        let missing = ReadQuery {
            path: "/definitely/not/here".into(),
            offset: None,
            length: None,
        };
        assert_eq!(
            read_file(ApiQuery(missing)).await.unwrap_err().code,
            ErrorCode::NotFound
        );
        let relative = ReadQuery {
            path: "x".into(),
            offset: None,
            length: None,
        };
        assert_eq!(
            read_file(ApiQuery(relative)).await.unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }
}
