//! `/v1/` stateful sandboxes: pause and resume, snapshots (take, list, inspect,
//! delete) and forks. The logic is the service's ([`crate::service::snapshots`]); here
//! only the wire forms.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orchard_protocol::sandbox::Sandbox;
use orchard_protocol::snapshot::{
    ForkRequest, ForkResult, Snapshot, SnapshotCreate, SnapshotDeleted, SnapshotList,
};

use super::extract::{ApiPath, Auth};
use super::state::AppState;
use super::v1::sandbox;
use crate::backend::BackendSnapshot;
use crate::service::{iso, Error};

/// The routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/snapshots", post(take))
        .route("/v1/snapshots", get(list))
        .route("/v1/snapshots/{snapshot_id}", get(one).delete(delete))
        .route("/v1/snapshots/{snapshot_id}/fork", post(fork))
}

/// The `/v1` view of a snapshot.
pub fn snapshot(s: &BackendSnapshot) -> Snapshot {
    Snapshot {
        snapshot_id: s.id.clone(),
        digest: s.digest.clone(),
        sandbox_id: s.sandbox_id.clone(),
        parent_snapshot_id: s.parent.clone(),
        image: s.image.clone(),
        created_at: iso(s.created_ms),
        size_bytes: s.size_bytes,
        total_bytes: s.total_bytes,
        tmp_bytes: s.tmp_bytes,
        layers: s.layers.clone(),
        sessions: s.sessions.clone(),
        processes: "none".into(),
        labels: s
            .labels
            .iter()
            .filter(|(k, _)| !k.starts_with("orchard."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        forks: s.forks.clone(),
        frozen_ms: s.frozen_ms,
    }
}

async fn pause(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Sandbox>, Error> {
    let r = state.service.pause(&tenant, &id).await?;
    Ok(Json(sandbox(&state.service, &r)))
}

async fn resume(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Sandbox>, Error> {
    let r = state.service.resume(&tenant, &id).await?;
    Ok(Json(sandbox(&state.service, &r)))
}

async fn take(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Response, Error> {
    // An empty body is the defaults.
    let req: SnapshotCreate = if body.iter().all(u8::is_ascii_whitespace) {
        SnapshotCreate::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Error::Unprocessable(format!("bad snapshot request: {e}")))?
    };
    let s = state.service.snapshot(&tenant, &id, req).await?;
    Ok((StatusCode::CREATED, Json(snapshot(&s))).into_response())
}

async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
) -> Result<Json<SnapshotList>, Error> {
    Ok(Json(SnapshotList {
        snapshots: state
            .service
            .snapshots(&tenant)
            .await?
            .iter()
            .map(snapshot)
            .collect(),
    }))
}

async fn one(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(sid): ApiPath<String>,
) -> Result<Json<Snapshot>, Error> {
    Ok(Json(snapshot(
        &state.service.snapshot_of(&tenant, &sid).await?,
    )))
}

async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(sid): ApiPath<String>,
) -> Result<Json<SnapshotDeleted>, Error> {
    let freed_bytes = state.service.delete_snapshot(&tenant, &sid).await?;
    Ok(Json(SnapshotDeleted {
        snapshot_id: sid,
        status: "deleted".into(),
        freed_bytes,
    }))
}

/// The answer to a fork call when fork `e` did not become ready: a fork deleted while
/// it started (its TTL ran out, or a delete of the caller's) is a conflict of the
/// caller's making, not a failure of the service; the rest is the sandbox failing (a
/// 502). Found by schemathesis: a fork with a short TTL answered 502 "sandbox ... not
/// found".
fn fork_failure(sid: &str, e: &Error) -> Error {
    match e {
        Error::NoSandbox(_) => Error::Conflict(format!(
            "a fork of {sid} was deleted before it was ready ({e})"
        )),
        e => Error::Sandbox(format!("a fork of {sid} did not start: {e}")),
    }
}

async fn fork(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(sid): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Response, Error> {
    let req: ForkRequest = if body.iter().all(u8::is_ascii_whitespace) {
        ForkRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Error::Unprocessable(format!("bad fork request: {e}")))?
    };
    let mut records = state.service.fork(&tenant, &sid, &req).await?;
    if req.wait {
        let waits = records.iter().map(|r| {
            let limit = r.ready_timeout() + Duration::from_secs(1);
            state.service.wait_ready(&tenant, &r.id, limit)
        });
        let results = futures_util::future::join_all(waits).await;
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            // All or nothing: a fork that could not start takes the others with it.
            let answer = fork_failure(&sid, e);
            for r in &records {
                let _ = state.service.delete(&tenant, &r.id).await;
            }
            return Err(answer);
        }
        records = results.into_iter().filter_map(Result::ok).collect();
    }
    Ok((
        StatusCode::CREATED,
        Json(ForkResult {
            snapshot_id: sid,
            sandboxes: records.iter().map(|r| sandbox(&state.service, r)).collect(),
        }),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a fork deleted while it started answered 502; it is the caller's 409,
    /// while a fork that failed to start stays a 502.
    #[test]
    fn regression_a_fork_deleted_while_it_started_is_a_conflict_not_a_502() {
        let gone = fork_failure("snap-1", &Error::no_sandbox("sb-1"));
        assert!(matches!(gone, Error::Conflict(_)), "{gone:?}");
        assert_eq!(
            gone.to_string(),
            "a fork of snap-1 was deleted before it was ready (sandbox sb-1 not found)"
        );
        let failed = fork_failure("snap-1", &Error::start_failed("sb-1", "no agent"));
        assert!(matches!(failed, Error::Sandbox(_)), "{failed:?}");
    }
}
