//! `PUT /v1/files`: an upload streamed into a temporary file next to the target and
//! renamed over it, so a reader never sees a half-written file and a failed upload
//! leaves the old content in place.

use std::fs::{self, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use futures_util::StreamExt;
use orchard_protocol::files::WriteResult;
use orchard_protocol::ErrorCode;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::common::{
    absolute, blocking_failed, parse_mode, too_large, unreadable_body, Files, TEMP_PREFIX,
};
use crate::api::extract::{content_length, ApiQuery};
use crate::error::{ApiError, ApiResult};
use crate::pid1::fsuser;
use crate::sys::unique_suffix;

#[derive(Deserialize)]
pub(super) struct WriteQuery {
    path: String,
    mode: Option<String>,
    parents: Option<bool>,
}

/// A temporary file removed when dropped, unless it was renamed into place. Dropping
/// also covers a handler future cancelled by a client that went away mid-upload.
struct TempFile {
    path: Option<PathBuf>,
}

impl TempFile {
    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    fn keep(mut self) {
        self.path = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Creates a fresh temporary file in `dir`; errors are reported against `target`.
async fn create_temp(dir: &Path, target: &str) -> ApiResult<(tokio::fs::File, TempFile)> {
    let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
    for _ in 0..16 {
        let path = dir.join(format!("{TEMP_PREFIX}{}", unique_suffix()));
        let at = path.clone();
        let opened = fsuser::blocking(move || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&at)
        })
        .await
        .map_err(|_| blocking_failed("write"))?;
        match opened {
            Ok(file) => {
                return Ok((
                    tokio::fs::File::from_std(file),
                    TempFile { path: Some(path) },
                ))
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => last = err,
            Err(err) => return Err(ApiError::io("write", target, &err)),
        }
    }
    Err(ApiError::io("write", target, &last))
}

pub(super) async fn write_file(
    State(files): State<Files>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<WriteResult>> {
    let limit = files.max_upload_bytes;
    write_body(&q, &headers, body, limit).await.map(Json)
}

/// Writes `body` to `q.path` through a temporary file and a rename.
async fn write_body(
    q: &WriteQuery,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> ApiResult<WriteResult> {
    let path = absolute(&q.path)?;
    let mode = parse_mode(q.mode.as_deref())?;
    if content_length(headers).is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let is_dir_error = || {
        ApiError::new(
            ErrorCode::IsADirectory,
            format!("write {}: is a directory", q.path),
        )
    };
    let Some(parent) = path.parent() else {
        return Err(is_dir_error());
    };
    // Refused before the upload rather than after it, when the rename would fail.
    if tokio::fs::symlink_metadata(&path)
        .await
        .is_ok_and(|meta| meta.is_dir())
    {
        return Err(is_dir_error());
    }
    if q.parents.unwrap_or(true) {
        let dir = parent.to_path_buf();
        fsuser::blocking(move || fs::create_dir_all(dir))
            .await
            .map_err(|_| blocking_failed("write"))?
            .map_err(|err| ApiError::io("create", &parent.to_string_lossy(), &err))?;
    }
    let (mut file, temp) = create_temp(parent, &q.path).await?;
    let io_err = |err: io::Error| ApiError::io("write", &q.path, &err);
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| unreadable_body())?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(too_large(limit));
        }
        file.write_all(&chunk).await.map_err(io_err)?;
    }
    // tokio's File finishes writes in the background; flush waits for them, so the
    // rename below publishes complete content.
    file.flush().await.map_err(io_err)?;
    drop(file);
    // A rename replaces a symbolic link at the target rather than writing through it.
    let (from, to) = (temp.path().to_path_buf(), path.clone());
    fsuser::blocking(move || {
        fs::set_permissions(&from, Permissions::from_mode(mode))?;
        fs::rename(&from, &to)
    })
    .await
    .map_err(|_| blocking_failed("write"))?
    .map_err(io_err)?;
    temp.keep();
    Ok(WriteResult {
        path: q.path.clone(),
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderValue};
    use bytes::Bytes;
    use std::os::unix::fs::MetadataExt;

    use crate::api::files::tests::no_leftovers;

    fn write_query(path: &Path, mode: Option<&str>, parents: Option<bool>) -> WriteQuery {
        WriteQuery {
            path: path.to_string_lossy().into_owned(),
            mode: mode.map(str::to_string),
            parents,
        }
    }

    fn chunked(parts: Vec<&'static [u8]>) -> Body {
        let stream = futures_util::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok::<_, io::Error>(Bytes::from_static(p))),
        );
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn write_creates_parents_sets_mode_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/file.sh");
        let q = write_query(&target, Some("755"), None);
        let done = write_body(
            &q,
            &HeaderMap::new(),
            chunked(vec![b"#!/bin/sh\n", b"echo hi\n"]),
            1024,
        )
        .await
        .unwrap();
        assert_eq!(done.size, 18);
        assert_eq!(fs::read(&target).unwrap(), b"#!/bin/sh\necho hi\n");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o755);

        let q = write_query(&target, None, Some(false));
        write_body(&q, &HeaderMap::new(), Body::from("new"), 1024)
            .await
            .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o644);
        assert!(no_leftovers(&dir.path().join("a/b")));

        let q = write_query(&dir.path().join("missing/x"), None, Some(false));
        let err = write_body(&q, &HeaderMap::new(), Body::from("x"), 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);

        let q = write_query(dir.path(), None, None);
        let err = write_body(&q, &HeaderMap::new(), Body::from("x"), 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::IsADirectory);
    }

    #[tokio::test]
    async fn oversized_writes_are_refused_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        fs::write(&target, b"old").unwrap();
        let q = write_query(&target, None, None);
        let err = write_body(&q, &HeaderMap::new(), chunked(vec![b"12345", b"67890"]), 8)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(100u64));
        let err = write_body(&q, &headers, Body::from("x"), 8)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert!(no_leftovers(dir.path()));
    }

    #[tokio::test]
    async fn a_failing_body_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        let stream = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"part")),
            Err(io::Error::other("connection reset")),
        ]);
        let q = write_query(&target, None, None);
        let err = write_body(&q, &HeaderMap::new(), Body::from_stream(stream), 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(!target.exists());
        assert!(no_leftovers(dir.path()));
    }
}
