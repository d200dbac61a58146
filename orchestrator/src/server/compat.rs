//! The Orchard-compatible routes, exactly as Orchard answers them (docs/api.md): field
//! names, status codes and semantics are what users' existing code relies on.

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orchard_protocol::compat::{
    ApplyPatch, CreateSandbox, CreatedSandbox, ExecJob, FileListing, PatchResult, QueuedJob,
    SandboxAck, SandboxPhase, SandboxStatus, Uploaded,
};
use orchard_protocol::pty::close_code;
use serde::Deserialize;

use super::body::{declared_length, UploadBody, MAX_PATCH_JSON};
use super::extract::{ws_key, ApiJson, ApiPath, ApiQuery, Auth, WaitQuery, MAX_WS_MESSAGE};
use super::state::AppState;
use crate::service::{CreateRequest, Error, JobOptions, Phase, SandboxRecord, Service};

/// The compatible routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(banner))
        .route("/health", get(health))
        .route("/resources", get(resources))
        .route("/sandboxes", post(create))
        .route("/sandboxes/{id}", get(status).delete(delete))
        .route("/sandboxes/{id}/wait", get(wait))
        .route("/sandboxes/{id}/heartbeat", post(heartbeat))
        .route("/sandboxes/{id}/exec", post(exec))
        .route("/sandboxes/{id}/exec/pty", get(pty))
        .route("/sandboxes/{id}/apply_patch", post(apply_patch))
        .route("/sandboxes/{id}/files", post(upload).get(download))
        .route("/sandboxes/{id}/files/list", get(list_files))
        .route("/jobs/{id}", get(job))
        .route("/jobs/{id}/wait", get(job_wait))
}

async fn banner() -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "service": "Orchard Env sandbox orchestrator",
        "version": env!("CARGO_PKG_VERSION"),
        "status": "running",
    }))
}

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let counts = state.service.counts().await;
    Json(serde_json::json!({
        "status": "healthy",
        "version": env!("CARGO_PKG_VERSION"),
        "backend": state.service.backend().name(),
        "uptime_s": state.service.uptime().as_secs(),
        "sandboxes": counts.values().sum::<u64>(),
    }))
}

fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `{"cpu": cores, "memory_bytes": bytes}`.
fn amount(cpu: f64, memory: u64) -> serde_json::Value {
    serde_json::json!({"cpu": cpu, "memory_bytes": memory})
}

/// `amount` of a backend's [`Amount`](crate::backend::Amount).
fn amount_of(a: crate::backend::Amount) -> serde_json::Value {
    amount(a.cores(), a.memory_bytes)
}

/// Orchard's capacity summary. `sandbox_pods` lists only the caller's sandboxes.
///
/// On a cluster backend ([`crate::backend::Backend::nodes`]) every node is reported with
/// its capacity, allocatable and requested figures (requested: the backend's own pods'
/// requests), the totals are their sums, and `available` is each node's allocatable
/// less its requested (at least zero: an overcommitted node gives no room to another),
/// summed. When the nodes cannot be read, `message` says so and the nodes are those the
/// pods run on, with their requests only.
///
/// Otherwise the local backend's one host is the one node; its capacity is what this
/// host has, and what sandboxes asked for is their limits (Orchard's requests equal its
/// limits), every tenant's (the node is shared).
async fn resources(State(state): State<AppState>, Auth(tenant): Auth) -> Json<serde_json::Value> {
    let (mut cpu, mut mem) = (0.0, 0u64);
    let mut pods = Vec::new();
    for r in state.service.all().await.unwrap_or_default() {
        let phase = &r.phase;
        let (c, m) = (
            crate::units::parse_cpu(&r.cpu).unwrap_or(0.0),
            crate::units::parse_memory(&r.memory).unwrap_or(0),
        );
        if !matches!(phase, Phase::Failed { .. }) {
            cpu += c;
            mem += m;
        }
        if r.tenant == tenant.0 {
            pods.push(serde_json::json!({
                "name": r.id,
                "namespace": state.service.backend().name(),
                "phase": match phase {
                    Phase::Pending => "Pending",
                    Phase::Ready => "Running",
                    Phase::Failed { .. } => "Failed",
                },
                "cpu_request": c,
                "memory_request_bytes": m,
            }));
        }
    }
    if let Some(cluster) = state.service.backend().nodes() {
        return Json(cluster_resources(&cluster, pods));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let memory = mem_total();
    let node = amount(cpus, memory);
    Json(serde_json::json!({
        "status": "ok",
        "nodes": [{"name": host_name(), "capacity": node, "allocatable": node}],
        "total_capacity": node,
        "total_allocatable": node,
        "total_requested": amount(cpu, mem),
        "available": amount((cpus - cpu).max(0.0), memory.saturating_sub(mem)),
        "sandbox_pods": pods,
    }))
}

/// The capacity summary of a cluster's nodes (see [`resources`]).
fn cluster_resources(
    cluster: &crate::backend::ClusterNodes,
    sandbox_pods: Vec<serde_json::Value>,
) -> serde_json::Value {
    use crate::backend::Amount;
    let (mut capacity, mut allocatable, mut requested, mut available) = (
        Amount::default(),
        Amount::default(),
        Amount::default(),
        Amount::default(),
    );
    let mut nodes = Vec::with_capacity(cluster.nodes.len());
    for n in &cluster.nodes {
        capacity += n.capacity;
        allocatable += n.allocatable;
        requested += n.requested;
        available += n.allocatable.less(n.requested);
        nodes.push(serde_json::json!({
            "name": n.name,
            "capacity": amount_of(n.capacity),
            "allocatable": amount_of(n.allocatable),
            "requested": amount_of(n.requested),
        }));
    }
    let mut answer = serde_json::json!({
        "status": "ok",
        "nodes": nodes,
        "total_capacity": amount_of(capacity),
        "total_allocatable": amount_of(allocatable),
        "total_requested": amount_of(requested),
        "available": amount_of(available),
        "sandbox_pods": sandbox_pods,
    });
    if let Some(why) = &cluster.incomplete {
        answer["message"] = why.as_str().into();
    }
    answer
}

/// The compatible status of a record, and its message (always a string): why it
/// failed, why no node can take it yet, or what its create has to say (limits lowered
/// to the host's size).
pub fn compat_phase(r: &SandboxRecord) -> (SandboxPhase, String) {
    let notice = r.notice.as_deref();
    match (&r.phase, &r.unschedulable) {
        // Waiting for a node: not terminal, the create goes on within its limit.
        (Phase::Pending, Some(why)) => (SandboxPhase::Unschedulable, why.clone()),
        (Phase::Pending, None) => (
            SandboxPhase::Pending,
            match notice {
                Some(n) => format!("the sandbox is starting; {n}"),
                None => "the sandbox is starting".into(),
            },
        ),
        (Phase::Ready, _) => (SandboxPhase::Ready, notice.unwrap_or_default().to_string()),
        (Phase::Failed { message }, _) => (SandboxPhase::Failed, message.clone()),
    }
}

/// The compatible view of a record.
pub fn sandbox_status(service: &Service, r: &SandboxRecord) -> SandboxStatus {
    let (status, status_message) = compat_phase(r);
    SandboxStatus {
        sandbox_id: r.id.clone(),
        namespace: service.backend().name().to_string(),
        image: r.image.clone(),
        pod_name: r.id.clone(),
        block_network: r.block_network,
        cpu: r.cpu.clone(),
        memory: r.memory.clone(),
        created_at: r.created_ms as f64 / 1000.0,
        ready: r.phase == Phase::Ready,
        status,
        status_message,
        working_dir: match &r.agent {
            Some(a) => a.workdir.clone(),
            None => r.working_dir.clone(),
        },
    }
}

async fn create(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> Result<Json<CreatedSandbox>, Error> {
    let record = state
        .service
        .create(
            &tenant,
            CreateRequest {
                image: req.image.clone(),
                id: req.sandbox_id,
                cpu: req.cpu.clone(),
                memory: req.memory.clone(),
                block_network: req.block_network,
                ready_timeout_s: req.timeout,
                ..Default::default()
            },
        )
        .await?;
    Ok(Json(CreatedSandbox {
        sandbox_id: record.id.clone(),
        namespace: state.service.backend().name().to_string(),
        image: req.image,
        block_network: req.block_network,
        cpu: record.cpu.clone(),
        memory: record.memory.clone(),
        timeout: record.ready_timeout().as_secs(),
        status: "pending".into(),
        status_message: record.notice.clone().unwrap_or_default(),
        working_dir: record.working_dir.clone(),
    }))
}

async fn status(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxStatus>, Error> {
    let r = state.service.get(&tenant, &id).await?;
    Ok(Json(sandbox_status(&state.service, &r)))
}

async fn wait(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<SandboxStatus>, Error> {
    let timeout = q.duration(Duration::from_secs(300))?;
    let r = state.service.wait_ready(&tenant, &id, timeout).await?;
    Ok(Json(sandbox_status(&state.service, &r)))
}

async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxAck>, Error> {
    state.service.delete(&tenant, &id).await?;
    Ok(Json(SandboxAck {
        status: "deleted".into(),
        sandbox_id: id,
    }))
}

async fn heartbeat(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxAck>, Error> {
    state.service.heartbeat(&tenant, &id).await?;
    Ok(Json(SandboxAck {
        status: "ok".into(),
        sandbox_id: id,
    }))
}

async fn exec(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ExecJob>,
) -> Result<Response, Error> {
    let timeout = match req.timeout_seconds {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 => Some(Duration::from_secs_f64(t.min(86_400.0))),
        Some(t) => {
            return Err(Error::BadRequest(format!(
                "timeout_seconds {t}: must be more than zero"
            )))
        }
    };
    let job = state
        .service
        .submit(
            &tenant,
            &id,
            req.command,
            JobOptions {
                timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
                cwd: req.cwd,
                env: req.env.unwrap_or_default(),
                login_shell: req.login_shell,
            },
        )
        .await?;
    if req.wait {
        let done = state
            .service
            .wait_job_view(&tenant, &job.job_id, None)
            .await?;
        Ok(super::job_body::view_response(&state.reads, done))
    } else {
        Ok(Json(QueuedJob {
            job_id: job.job_id,
            status: "queued".into(),
        })
        .into_response())
    }
}

async fn job(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, Error> {
    Ok(super::job_body::view_response(
        &state.reads,
        state.service.job_view(&tenant, &id).await?,
    ))
}

async fn job_wait(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Response, Error> {
    let timeout = q.duration(Duration::from_secs(30))?;
    let job = state
        .service
        .wait_job_view(&tenant, &id, Some(timeout))
        .await?;
    Ok(super::job_body::view_response(&state.reads, job))
}

async fn apply_patch(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ApplyPatch, MAX_PATCH_JSON>,
) -> Result<Json<PatchResult>, Error> {
    let result = state
        .service
        .apply_patch(&tenant, &id, req.patch, req.timeout_seconds)
        .await?;
    Ok(Json(result))
}

/// The body streams into the service's upload ([`crate::service::files::upload`]):
/// bounded memory and bounded spools whatever the file's size.
async fn upload(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Uploaded>, Error> {
    let declared = declared_length(&headers);
    let mut body = UploadBody::new(body, declared);
    let uploaded = state
        .service
        .upload(&tenant, &id, &state.spools, declared, &mut body)
        .await;
    match uploaded {
        Ok(u) => Ok(Json(u)),
        Err(e) => {
            body.finish(&e).await;
            Err(e)
        }
    }
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

/// `?path=` of the list route: optional, the default working directory when absent.
#[derive(Deserialize)]
struct ListQuery {
    path: Option<String>,
}

/// `{"path", "content", "size"}` streamed as the file comes from the agent
/// ([`crate::service::files::download`]).
async fn download(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, Error> {
    let pieces = state.service.download(&tenant, &id, &q.path).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(pieces),
    )
        .into_response())
}

async fn list_files(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<FileListing>, Error> {
    let listing = state
        .service
        .list_files(&tenant, &id, q.path.as_deref())
        .await?;
    Ok(Json(listing))
}

async fn pty(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // A plain HTTP request gets a JSON error like every other route, not axum's text.
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            return Error::BadRequest(format!("this route is a WebSocket: {}", e.body_text()))
                .into_response()
        }
    };
    let (key, protocol) = ws_key(&headers, uri.query());
    let ws = ws
        .max_message_size(MAX_WS_MESSAGE)
        .max_frame_size(MAX_WS_MESSAGE);
    let ws = match protocol {
        Some(p) => ws.protocols([p]),
        None => ws,
    };
    let verdict = match state.keys.authenticate(key.as_deref()) {
        None => Err((
            close_code::UNAUTHORIZED,
            "invalid or missing API key".to_string(),
        )),
        Some(tenant) => match state.service.get(&tenant, &id).await {
            Err(_) => Err((close_code::NOT_FOUND, format!("sandbox {id} not found"))),
            Ok(r) => state
                .service
                .live_of(&r)
                .map_err(|_| (close_code::NOT_READY, format!("sandbox {id} is not ready"))),
        },
    };
    ws.on_upgrade(move |socket| async move {
        match verdict {
            Err((code, reason)) => super::proxy::close_gracefully(socket, code, reason).await,
            Ok(live) => super::proxy::bridge(socket, &live, "/v1/pty/compat").await,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Amount, ClusterNodes, NodeCapacity};

    fn node(name: &str, alloc: (u64, u64), requested: (u64, u64)) -> NodeCapacity {
        NodeCapacity {
            name: name.into(),
            capacity: Amount {
                millicpus: 8000,
                memory_bytes: 16 << 30,
            },
            allocatable: Amount {
                millicpus: alloc.0,
                memory_bytes: alloc.1,
            },
            requested: Amount {
                millicpus: requested.0,
                memory_bytes: requested.1,
            },
        }
    }

    /// Totals are the nodes' sums; `available` is each node's room summed, so a node
    /// asked more than it has gives no room to the others.
    #[test]
    fn a_clusters_answer_sums_its_nodes_and_floors_each_nodes_room() {
        let cluster = ClusterNodes {
            nodes: vec![
                node("a", (7800, 15 << 30), (100, 1 << 30)),
                node("b", (2000, 4 << 30), (3000, 1 << 30)),
            ],
            incomplete: None,
        };
        let pod = serde_json::json!({"name": "sb-1"});
        let v = cluster_resources(&cluster, vec![pod.clone()]);
        assert_eq!(v["status"], "ok");
        assert_eq!(v["nodes"][0]["name"], "a");
        assert_eq!(v["nodes"][0]["allocatable"]["cpu"], 7.8);
        assert_eq!(v["nodes"][1]["requested"]["cpu"], 3.0);
        assert_eq!(v["total_capacity"], amount(16.0, 32 << 30));
        assert_eq!(v["total_allocatable"], amount(9.8, 19 << 30));
        assert_eq!(v["total_requested"], amount(3.1, 2 << 30));
        assert_eq!(v["available"], amount(7.7, (14 << 30) + (3 << 30)));
        assert_eq!(v["sandbox_pods"], serde_json::json!([pod]));
        assert!(v.get("message").is_none(), "{v}");
    }

    #[test]
    fn an_incomplete_answer_says_why() {
        let cluster = ClusterNodes {
            nodes: vec![node("a", (0, 0), (500, 1 << 30))],
            incomplete: Some("node capacity unknown: forbidden".into()),
        };
        let v = cluster_resources(&cluster, vec![]);
        assert_eq!(v["message"], "node capacity unknown: forbidden");
        assert_eq!(v["available"], amount(0.0, 0));
        assert_eq!(v["total_requested"], amount(0.5, 1 << 30));
    }
}
