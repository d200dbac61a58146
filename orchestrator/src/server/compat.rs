//! The Orchard-compatible routes, exactly as Orchard answers them (docs/api.md): field
//! names, status codes and semantics are what users' existing code relies on.

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orchard_protocol::compat::{
    ApplyPatch, CreateSandbox, CreatedSandbox, ExecJob, FileListing, ListedFile, PatchResult,
    QueuedJob, SandboxAck, SandboxPhase, SandboxStatus, Uploaded,
};
use orchard_protocol::files::FileKind;
use orchard_protocol::git::GitApplyRequest;
use orchard_protocol::output::b64_encode;
use orchard_protocol::pty::close_code;
use serde::Deserialize;

use super::{
    ApiJson, ApiPath, AppState, Auth, MAX_PATCH_BYTES, MAX_PATCH_JSON, MAX_UPLOAD_JSON,
    MAX_WS_MESSAGE,
};
use crate::service::{iso, CreateRequest, Error, JobOptions, Phase, SandboxRecord, Service};

/// Longest server-side wait a request may ask for.
const MAX_WAIT: Duration = Duration::from_secs(3600);

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

/// `?timeout=S` (seconds, fractional allowed), clamped to [`MAX_WAIT`].
#[derive(Deserialize)]
pub struct WaitQuery {
    timeout: Option<String>,
}

impl WaitQuery {
    /// The wait, or `default`.
    pub fn duration(&self, default: Duration) -> Result<Duration, Error> {
        match &self.timeout {
            None => Ok(default),
            Some(t) => {
                let s: f64 = t.trim().parse().map_err(|_| {
                    Error::BadRequest(format!("timeout {t:?}: expected seconds, like 30 or 0.5"))
                })?;
                if !s.is_finite() || s < 0.0 {
                    return Err(Error::BadRequest(format!(
                        "timeout {t:?}: must be zero or more seconds"
                    )));
                }
                // Cut before converting: a Duration cannot hold 1e20 seconds.
                Ok(Duration::from_secs_f64(s.min(MAX_WAIT.as_secs_f64())))
            }
        }
    }
}

/// A query parsed with the API's errors.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for ApiQuery<T>
{
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Error> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|q| ApiQuery(q.0))
            .map_err(|e| Error::BadRequest(format!("invalid query: {}", e.body_text())))
    }
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

/// Orchard's capacity summary. The local backend's one host is the one node; its
/// capacity is what this host has, and what sandboxes asked for is their limits
/// (Orchard's requests equal its limits). Totals count every tenant's sandboxes (the
/// node is shared); `sandbox_pods` lists only the caller's.
async fn resources(State(state): State<AppState>, Auth(tenant): Auth) -> Json<serde_json::Value> {
    let (mut cpu, mut mem) = (0.0, 0u64);
    let mut pods = Vec::new();
    for r in state.service.all().await.unwrap_or_default() {
        let phase = &r.phase;
        let (c, m) = (
            crate::service::units::parse_cpu(&r.cpu).unwrap_or(0.0),
            crate::service::units::parse_memory(&r.memory).unwrap_or(0),
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

/// The compatible status of a record, and its message (always a string): why it
/// failed, or what its create has to say (limits lowered to the host's size).
pub fn compat_phase(r: &SandboxRecord) -> (SandboxPhase, String) {
    let notice = r.notice.as_deref();
    match &r.phase {
        Phase::Pending => (
            SandboxPhase::Pending,
            match notice {
                Some(n) => format!("the sandbox is starting; {n}"),
                None => "the sandbox is starting".into(),
            },
        ),
        Phase::Ready => (SandboxPhase::Ready, notice.unwrap_or_default().to_string()),
        Phase::Failed { message } => (SandboxPhase::Failed, message.clone()),
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
    if let orchard_protocol::compat::CompatCommand::Shell(s) = &req.command {
        if s.trim().is_empty() {
            return Err(Error::BadRequest("command must not be empty".into()));
        }
    }
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
    if req.patch.len() > MAX_PATCH_BYTES {
        return Err(Error::TooLarge(format!(
            "the patch is {} bytes; at most {MAX_PATCH_BYTES}",
            req.patch.len()
        )));
    }
    let live = state.service.ready(&tenant, &id).await?;
    let apply = GitApplyRequest {
        repo: Service::default_dir(&live).to_string(),
        patch: req.patch,
        check_only: false,
        fuzzy: false,
    };
    let limit = Duration::from_secs(req.timeout_seconds.clamp(1, 3600));
    let failed = |error: String| PatchResult {
        success: false,
        stdout: String::new(),
        stderr: error.clone(),
        exit_code: 1,
        error: Some(error),
    };
    let result = match tokio::time::timeout(limit, live.agent.git_apply(&apply)).await {
        Err(_) => failed(format!(
            "applying the patch took longer than {} s",
            limit.as_secs()
        )),
        // libgit2 needs a repository and a `diff --git` patch; `git apply` (or `patch`)
        // in the sandbox takes plain unified diffs anywhere, as users' patches often are.
        Ok(Err(orchard_client::ClientError::Api { .. })) => {
            match patch_with_tools(&live, &apply.repo, &apply.patch, limit).await {
                Ok(r) => r,
                Err(e) => failed(e),
            }
        }
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(r)) if r.applied => PatchResult {
            success: true,
            stdout: r
                .files
                .iter()
                .map(|f| format!("Applied patch to '{f}' cleanly.\n"))
                .collect(),
            stderr: String::new(),
            exit_code: 0,
            error: None,
        },
        Ok(Ok(r)) => PatchResult {
            success: false,
            stdout: String::new(),
            stderr: r
                .conflicts
                .iter()
                .map(|c| match &c.header {
                    Some(h) => format!("error: patch failed: {} {h}: {}\n", c.path, c.reason),
                    None => format!("error: {}: {}\n", c.path, c.reason),
                })
                .collect(),
            exit_code: 1,
            error: None,
        },
    };
    Ok(Json(result))
}

/// Applies `patch` in `dir` with the image's own `git apply` (or `patch -p1` when there
/// is no git), through a temporary file.
async fn patch_with_tools(
    live: &crate::service::Live,
    dir: &str,
    patch: &str,
    limit: Duration,
) -> Result<PatchResult, String> {
    let tag = crate::random::hex(6).map_err(|e| e.to_string())?;
    let file = format!("/tmp/.orchard-patch-{tag}");
    live.agent
        .write_file(&file, patch.as_bytes().to_vec(), None)
        .await
        .map_err(|e| format!("cannot stage the patch: {e}"))?;
    let script =
        "cd \"$1\" || exit 1; if command -v git >/dev/null 2>&1; then git apply -v \"$2\"; \
                  else patch -p1 -i \"$2\"; fi; rc=$?; rm -f \"$2\"; exit $rc";
    let req = orchard_protocol::ExecRequest {
        command: orchard_protocol::Command::Argv(vec![
            live.shell.clone(),
            "-c".into(),
            script.into(),
            "apply_patch".into(),
            dir.into(),
            file.clone(),
        ]),
        timeout_ms: Some(limit.as_millis() as u64),
        ..Default::default()
    };
    let r = live
        .agent
        .exec(&req)
        .await
        .map_err(|e| format!("cannot run git apply: {e}"))?;
    let code = r.exit_code.or(r.signal.map(|s| 128 + s)).unwrap_or(1);
    Ok(PatchResult {
        success: code == 0 && !r.timed_out,
        stdout: r.stdout.text_lossy(),
        stderr: r.stderr.text_lossy(),
        exit_code: code,
        error: r
            .timed_out
            .then(|| format!("applying the patch took longer than {} s", limit.as_secs())),
    })
}

/// Streams the body through [`super::upload::UploadParser`] into a private spool file,
/// then the spool to the agent: bounded memory whatever the file's size, and bounded
/// spools ([`super::spool`]: the sandbox's disk, the host's bound, the pace).
async fn upload(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Uploaded>, Error> {
    let live = state.service.ready(&tenant, &id).await?;
    let room = state.service.backend().disk_room(&id).map(|d| d.room());
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = body;
    // Refused up front, from the declared length: the body is read on (not kept) only
    // when it is short enough to read in vain, as `read_limited` does.
    let (spooled, drain) = match state.spools.open(&id, room, declared) {
        Ok(mut spool) => (
            spool_body(&state.spools, &mut spool, &mut body)
                .await
                .map(|parsed| (spool, parsed)),
            true,
        ),
        Err(e) => (
            Err(e.into()),
            declared.is_some_and(|d| d <= super::DRAIN_MAX as u64),
        ),
    };
    let (spool, parsed) = match spooled {
        Ok(s) => s,
        Err(e) => {
            // The spool is gone already (dropped with its charge). A refusal for size is
            // answered once the body is read on (and dropped), so that the client, still
            // sending, gets to see it.
            if drain && matches!(e, Error::TooLarge(_) | Error::Unavailable(_)) {
                super::drain(body).await;
            }
            return Err(e);
        }
    };
    if parsed.path.is_empty() {
        return Err(Error::BadRequest("path must not be empty".into()));
    }
    let path = Service::resolve(&live, &parsed.path);
    let file = tokio::fs::File::open(spool.path())
        .await
        .map_err(|e| Error::internal("cannot read the spooled upload", e))?;
    let stream = tokio_util::io::ReaderStream::new(file);
    let sent = super::proxy::put_file(&live, &path, axum::body::Body::from_stream(stream)).await;
    if let Err(Error::Sandbox(reason)) = sent {
        // The agent refuses a write it cannot do (a read-only path, a missing parent)
        // before reading the body, and closes the connection under the stream, which
        // reads as a transport failure here. An empty write next to the target names
        // the real reason.
        let dir = std::path::Path::new(&path)
            .parent()
            .map_or_else(|| "/".to_string(), |d| d.display().to_string());
        let probe = format!(
            "{}/.orchard-upload-probe-{}",
            dir.trim_end_matches('/'),
            crate::random::hex(6)?
        );
        match live.agent.write_file(&probe, Vec::new(), None).await {
            Err(e) => return Err(e.into()),
            Ok(_) => {
                let _ = live.agent.remove(&probe, false).await;
                return Err(Error::Sandbox(reason));
            }
        }
    }
    sent?;
    Ok(Json(Uploaded {
        success: true,
        path,
        size: parsed.size,
    }))
}

/// Reads `body` into `spool` through the upload parser, charging the spool as it
/// grows and holding the body to its pace; answers the parsed fields.
async fn spool_body(
    spools: &super::spool::Spools,
    spool: &mut super::spool::Spool,
    body: &mut axum::body::Body,
) -> Result<super::upload::Parsed, Error> {
    use super::spool::SpoolError;
    use http_body_util::BodyExt;
    let file = std::fs::File::options()
        .write(true)
        .open(spool.path())
        .map_err(|e| Error::internal("cannot spool the upload", e))?;
    let mut parser = super::upload::UploadParser::new(std::io::BufWriter::new(file));
    let mut pace = spools.pace();
    let mut read = 0usize;
    loop {
        let frame = match tokio::time::timeout_at(pace.deadline(), body.frame()).await {
            // A window ended while waiting: it must have brought enough.
            Err(_) => {
                pace.window_ended()?;
                continue;
            }
            Ok(None) => break,
            Ok(Some(frame)) => frame,
        };
        let frame = frame.map_err(|e| {
            if super::spool::is_body_timeout(&e) {
                SpoolError::Stalled(spools.window()).into()
            } else {
                Error::BadRequest(format!("reading the body: {e}"))
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
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

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

/// `?path=` of the list route: optional, the default working directory when absent.
#[derive(Deserialize)]
struct ListQuery {
    path: Option<String>,
}

/// `{"path", "content", "size"}` (`compat::FileContent`) written as the file streams from
/// the agent, base64 encoded on the way: memory stays bounded whatever the file's size
/// (a whole-file answer once took the server to 3.6 GB for a 1 GiB sparse file). An
/// agent failing mid-file ends the body early, which the client sees as an error.
async fn download(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, Error> {
    let live = state.service.ready(&tenant, &id).await?;
    let path = Service::resolve(&live, &q.path);
    let body = live.agent.read_stream(&path).await?;
    let prefix = format!(
        "{{\"path\":{},\"content\":\"",
        serde_json::to_string(&path).unwrap_or_else(|_| "\"\"".into())
    );
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(base64_json_stream(prefix, body)),
    )
        .into_response())
}

/// The chunks of `prefix`, the base64 of `body`, then `","size":N}`.
fn base64_json_stream(
    prefix: String,
    body: hyper::body::Incoming,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    use http_body_util::BodyExt;
    struct St {
        body: hyper::body::Incoming,
        prefix: Option<String>,
        carry: Vec<u8>,
        size: u64,
        done: bool,
    }
    let st = St {
        body,
        prefix: Some(prefix),
        carry: Vec::new(),
        size: 0,
        done: false,
    };
    futures_util::stream::unfold(st, |mut st| async move {
        if let Some(p) = st.prefix.take() {
            return Some((Ok(bytes::Bytes::from(p)), st));
        }
        if st.done {
            return None;
        }
        loop {
            match st.body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    st.size += data.len() as u64;
                    st.carry.extend_from_slice(&data);
                    // Whole 3-byte groups now; the rest waits for the next frame.
                    let whole = st.carry.len() / 3 * 3;
                    if whole == 0 {
                        continue;
                    }
                    let out = b64_encode(&st.carry[..whole]);
                    st.carry.drain(..whole);
                    return Some((Ok(bytes::Bytes::from(out)), st));
                }
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(std::io::Error::other(e.to_string())), st));
                }
                None => {
                    st.done = true;
                    let tail = format!("{}\",\"size\":{}}}", b64_encode(&st.carry), st.size);
                    return Some((Ok(bytes::Bytes::from(tail)), st));
                }
            }
        }
    })
}

async fn list_files(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<FileListing>, Error> {
    let live = state.service.ready(&tenant, &id).await?;
    let path = match &q.path {
        Some(p) if !p.is_empty() => Service::resolve(&live, p),
        _ => Service::default_dir(&live).to_string(),
    };
    let list = live.agent.list_dir(&path, 1).await?;
    let truncated = list.truncated;
    let mut files: Vec<ListedFile> = list
        .entries
        .into_iter()
        .map(|e| ListedFile {
            name: e.name,
            kind: if e.kind == FileKind::Directory {
                "directory"
            } else {
                "file"
            }
            .into(),
            size: e.size,
            modified: iso(e.modified_ms.max(0) as u64),
        })
        .collect();
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(FileListing {
        path,
        files,
        truncated,
    }))
}

/// The API key of a WebSocket upgrade: header, `?api_key=`, or subprotocol
/// `api_key.<key>` (answered back as the chosen subprotocol).
pub fn ws_key(headers: &HeaderMap, query: Option<&str>) -> (Option<String>, Option<String>) {
    if let Some(k) = super::presented_key(headers) {
        return (Some(k.to_string()), None);
    }
    if let Some(q) = query {
        for (k, v) in url_pairs(q) {
            if k == "api_key" {
                return (Some(v), None);
            }
        }
    }
    let protocols = headers
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    for p in protocols.split(',').map(str::trim) {
        if let Some(k) = p.strip_prefix("api_key.") {
            return (Some(k.to_string()), Some(p.to_string()));
        }
    }
    (None, None)
}

/// `a=b&c=d` decoded.
pub fn url_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
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
