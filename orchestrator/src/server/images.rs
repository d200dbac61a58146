//! `/v1/images`: list, pull (progress streamed as NDJSON), import an uploaded archive
//! (streamed to a temporary file, never held in memory), remove. Images are shared by
//! every key: any key may list them and pull from the registries the operator allows,
//! but only an operator key may import (which can overwrite a tag) or delete, so one
//! tenant cannot change what another tenant's sandboxes run.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use orchard_protocol::sandbox::{ImageInfo, ImageList, ImageRemoved, PullEvent, PullRequest};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::extract::{ApiJson, ApiQuery, Auth};
use super::state::AppState;
use crate::image::{Image, ImageError, Progress};
use crate::service::Error;

/// Largest uploaded image archive.
pub const MAX_IMPORT: u64 = 64 << 30;

/// The image routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/images", get(list).delete(remove))
        .route("/v1/images/pull", post(pull))
        .route("/v1/images/import", post(import))
}

fn du(path: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

/// The API's view of an image (sizes read from the unpacked layers).
pub fn info(image: &Image) -> ImageInfo {
    ImageInfo {
        reference: image.reference.clone(),
        digest: image.digest.clone(),
        layers: image.layers.len(),
        size_bytes: image.layers.iter().map(|l| du(l)).sum(),
    }
}

/// A failed look-up or removal in the image store, by kind: an image the store does
/// not hold is a 404; anything else (a bad reference, a record it cannot read)
/// answers 400 as it always did. The message is the store's own.
fn image_error(e: ImageError) -> Error {
    match e {
        ImageError::UnknownImage { .. } => Error::NotFound(e.to_string()),
        e => Error::BadRequest(e.to_string()),
    }
}

async fn list(State(state): State<AppState>, Auth(_): Auth) -> Result<Json<ImageList>, Error> {
    let store = state.service.images().clone();
    let images = tokio::task::spawn_blocking(move || store.list())
        .await
        .map_err(|e| Error::internal("listing images failed", e))?
        .map_err(|e| Error::internal("listing images failed", e))?;
    let infos = tokio::task::spawn_blocking(move || images.iter().map(info).collect())
        .await
        .map_err(|e| Error::internal("listing images failed", e))?;
    Ok(Json(ImageList { images: infos }))
}

async fn pull(
    State(state): State<AppState>,
    Auth(_): Auth,
    ApiJson(req): ApiJson<PullRequest>,
) -> Result<Response, Error> {
    if req.reference.trim().is_empty() {
        return Err(Error::BadRequest("reference must not be empty".into()));
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PullEvent>();
    let store = state.service.images().clone();
    tokio::spawn(async move {
        let progress_tx = tx.clone();
        let result = store
            .pull(&req.reference, move |p: Progress| {
                let _ = progress_tx.send(PullEvent::Progress {
                    reference: p.reference,
                    layer: p.layer,
                    layer_bytes_done: p.layer_bytes_done,
                    layer_bytes_total: p.layer_bytes_total,
                    layers_done: p.layers_done,
                    layers_total: p.layers_total,
                });
            })
            .await;
        let last = match result {
            Ok(image) => {
                let i = tokio::task::spawn_blocking(move || info(&image)).await;
                match i {
                    Ok(image) => PullEvent::Done { image },
                    Err(e) => PullEvent::Error {
                        detail: format!("internal error: {e}"),
                    },
                }
            }
            Err(e) => PullEvent::Error {
                detail: e.to_string(),
            },
        };
        let _ = tx.send(last);
    });
    let lines = tokio_stream_from(rx).map(|ev| {
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(line))
    });
    Ok((
        [(header::CONTENT_TYPE, orchard_protocol::NDJSON)],
        Body::from_stream(lines),
    )
        .into_response())
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[derive(Deserialize)]
struct ImportQuery {
    name: Option<String>,
}

/// Refuses a key that may not change the shared images.
fn operator(state: &AppState, tenant: &crate::service::Tenant, what: &str) -> Result<(), Error> {
    if state.keys.is_operator(tenant) {
        return Ok(());
    }
    Err(Error::Forbidden(format!(
        "{what} changes images every key's sandboxes use: it needs an operator key \
         (orchard serve --operator-key)"
    )))
}

async fn import(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiQuery(q): ApiQuery<ImportQuery>,
    req: Request,
) -> Result<Json<ImageList>, Error> {
    operator(&state, &tenant, "importing an image")?;
    let store = state.service.images().clone();
    let tmp_dir = store.root().join("tmp");
    tokio::fs::create_dir_all(&tmp_dir)
        .await
        .map_err(|e| Error::internal("cannot store the upload", e))?;
    let path = tmp_dir.join(format!("upload-{}", crate::random::hex(8)?));
    let guard = TempFile(path.clone());
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| Error::internal("cannot store the upload", e))?;
    let mut body = req.into_body().into_data_stream();
    let mut size = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::BadRequest(format!("reading the upload: {e}")))?;
        size += chunk.len() as u64;
        if size > MAX_IMPORT {
            return Err(Error::TooLarge(format!(
                "image archives are limited to {MAX_IMPORT} bytes"
            )));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| Error::internal("cannot store the upload", e))?;
    }
    file.flush()
        .await
        .map_err(|e| Error::internal("cannot store the upload", e))?;
    drop(file);
    if size == 0 {
        return Err(Error::BadRequest(
            "expected an image archive (docker save tar or OCI layout tar) as the body".into(),
        ));
    }
    let images = tokio::task::spawn_blocking(move || {
        let r = store.import(&path, q.name.as_deref());
        drop(guard);
        r.map(|imgs| imgs.iter().map(info).collect::<Vec<_>>())
    })
    .await
    .map_err(|e| Error::internal("import failed", e))?
    .map_err(|e| Error::BadRequest(format!("cannot import this archive: {e}")))?;
    Ok(Json(ImageList { images }))
}

struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[derive(Deserialize)]
struct RefQuery {
    reference: String,
}

async fn remove(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiQuery(q): ApiQuery<RefQuery>,
) -> Result<Json<ImageRemoved>, Error> {
    operator(&state, &tenant, "deleting an image")?;
    let store = state.service.images().clone();
    let reference = q.reference.clone();
    let found = tokio::task::spawn_blocking(move || store.get(&reference))
        .await
        .map_err(|e| Error::internal("removing the image failed", e))?
        .map_err(image_error)?;
    let Some(image) = found else {
        return Err(Error::NotFound(format!("image {} not found", q.reference)));
    };
    let store = state.service.images().clone();
    let reference = q.reference.clone();
    tokio::task::spawn_blocking(move || store.remove(&reference))
        .await
        .map_err(|e| Error::internal("removing the image failed", e))?
        .map_err(image_error)?;
    Ok(Json(ImageRemoved {
        reference: image.reference,
        status: "deleted".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::error::status;

    /// The kind decides, never the words: an unknown image is a 404 (it was a 400 when
    /// the remove of an image gone meanwhile said "unknown image"), a registry's "not
    /// found" in another kind is not.
    #[test]
    fn image_errors_map_by_kind() {
        let unknown = ImageError::UnknownImage {
            reference: "docker.io/library/nope:1".into(),
            tried: Vec::new(),
        };
        let e = image_error(unknown);
        assert_eq!(status(&e), 404);
        assert_eq!(e.public_message(), "unknown image docker.io/library/nope:1");
        let bad = ImageError::InvalidReference {
            reference: "no image".into(),
            reason: "not found".into(),
        };
        assert_eq!(status(&image_error(bad)), 400);
    }
}
