//! `/v1/` sandbox lifecycle: create (waiting for readiness by default), list, get, wait,
//! delete, heartbeat. A ready sandbox's answer carries its agent's endpoint and token,
//! for clients that talk to the agent directly.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orchard_protocol::sandbox::{Sandbox, SandboxCreate, SandboxDone, SandboxList};

use super::extract::{ApiJson, ApiPath, ApiQuery, Auth, WaitQuery};
use super::state::AppState;
use crate::service::{iso, CreateRequest, Error, Phase, SandboxRecord, Service};

/// The lifecycle routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(one).delete(delete))
        .route("/v1/sandboxes/{id}/wait", get(wait))
        .route("/v1/sandboxes/{id}/heartbeat", post(heartbeat))
}

/// `/v1`'s status of a pending sandbox no node can take yet.
const UNSCHEDULABLE: &str = "unschedulable";

/// The `/v1` view of a record.
pub fn sandbox(service: &Service, r: &SandboxRecord) -> Sandbox {
    let phase = &r.phase;
    let (ready_at, agent) = match (&r.agent, phase) {
        (Some(a), Phase::Ready) => (Some(iso(a.ready_ms)), Some(a.endpoint.wire(&a.token))),
        _ => (None, None),
    };
    Sandbox {
        id: r.id.clone(),
        image: r.image.clone(),
        status: match (phase, &r.unschedulable) {
            _ if r.paused => "paused".to_string(),
            // Waiting for a node, as on the compatible API; the create goes on.
            (Phase::Pending, Some(_)) => UNSCHEDULABLE.to_string(),
            _ => phase.name().to_string(),
        },
        ready: *phase == Phase::Ready,
        status_message: match (phase, &r.unschedulable) {
            (Phase::Failed { message }, _) => Some(message.clone()),
            (Phase::Pending, Some(why)) => Some(why.clone()),
            _ => r.notice.clone(),
        },
        created_at: iso(r.created_ms),
        ready_at,
        expires_at: service.expires_ms(r).map(iso),
        block_network: r.block_network,
        cpu: Some(r.cpu.clone()),
        memory: Some(r.memory.clone()),
        labels: r.labels.clone(),
        agent,
        paused: r.paused,
    }
}

async fn create(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiJson(req): ApiJson<SandboxCreate>,
) -> Result<Response, Error> {
    let mut record = state
        .service
        .create(
            &tenant,
            CreateRequest {
                image: req.image,
                id: req.id,
                cpu: req.cpu,
                memory: req.memory,
                block_network: req.block_network,
                ready_timeout_s: req.ready_timeout_s,
                ttl_s: req.ttl_s,
                env: req.env,
                labels: req.labels,
                ..Default::default()
            },
        )
        .await?;
    if req.wait {
        // The create's own deadline ends this wait; the extra second covers the
        // hand-over from the create task.
        let limit = record.ready_timeout() + Duration::from_secs(1);
        match state.service.wait_ready(&tenant, &record.id, limit).await {
            Ok(ready) => record = ready,
            Err(e) => {
                // A sandbox that could not start is not left behind for the caller.
                if let Error::Sandbox(_)
                | Error::AgentUnreachable { .. }
                | Error::AgentFailed { .. }
                | Error::Timeout(_)
                | Error::StartFailed { .. }
                | Error::ReadyTimeout { .. } = e
                {
                    let _ = state.service.delete(&tenant, &record.id).await;
                }
                return Err(e);
            }
        }
    }
    Ok((StatusCode::CREATED, Json(sandbox(&state.service, &record))).into_response())
}

async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
) -> Result<Json<SandboxList>, Error> {
    Ok(Json(SandboxList {
        sandboxes: state
            .service
            .list(&tenant)
            .await?
            .iter()
            .map(|r| sandbox(&state.service, r))
            .collect(),
    }))
}

async fn one(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Sandbox>, Error> {
    let r = state.service.get(&tenant, &id).await?;
    Ok(Json(sandbox(&state.service, &r)))
}

async fn wait(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<Sandbox>, Error> {
    let timeout = q.duration(Duration::from_secs(300))?;
    let r = state.service.wait_ready(&tenant, &id, timeout).await?;
    Ok(Json(sandbox(&state.service, &r)))
}

async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxDone>, Error> {
    state.service.delete(&tenant, &id).await?;
    Ok(Json(SandboxDone {
        id,
        status: "deleted".into(),
        expires_at: None,
    }))
}

async fn heartbeat(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxDone>, Error> {
    let r = state.service.heartbeat(&tenant, &id).await?;
    Ok(Json(SandboxDone {
        id,
        status: "ok".into(),
        expires_at: state.service.expires_ms(&r).map(iso),
    }))
}
