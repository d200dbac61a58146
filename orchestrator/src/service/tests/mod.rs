//! The service and the router, in process and without root: the fake backend
//! ([`crate::backend::fake`]) serves the real agent library on loopback TCP or a Unix
//! socket, the state is the in-memory store, and HTTP requests go through the real
//! router with `tower::ServiceExt::oneshot`. The runc suites (`tests/`) cover the same
//! routes end to end on real sandboxes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use orchard_protocol::compat::{CompatCommand, JobStatus};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

use super::*;
use crate::backend::fake::FakeBackend;
use crate::image::{ImageStore, StoreConfig};
use crate::server::{router, AppState};

const KEY: &str = "key-1";
const IMAGE: &str = "tiny:latest";

/// A one-layer OCI image layout written in `dir`: enough for the store to import and
/// the fake backend to be handed.
fn tiny_layout(dir: &Path) {
    let blob = |bytes: &[u8]| -> (String, usize) {
        let hex = hex::encode(Sha256::digest(bytes));
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    tar.append_data(&mut header, "etc/", std::io::empty())
        .unwrap();
    let layer = tar.into_inner().unwrap();
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&layer)));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &layer).unwrap();
    let (layer_digest, layer_size) = blob(&gz.finish().unwrap());
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let (config_digest, config_size) = blob(config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = blob(manifest.to_string().as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": manifest_size}],
    });
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// A service over a fake backend, with its router (the other test modules of the
/// service build theirs with it too).
pub(super) struct Harness {
    pub(super) service: Service,
    backend: Arc<FakeBackend>,
    app: axum::Router,
    images: ImageStore,
    pub(super) dir: tempfile::TempDir,
}

fn config(dir: &Path) -> ServiceConfig {
    let mut config = ServiceConfig::new(dir.join("data"));
    config.policy.interval = Duration::from_secs(3600);
    config.policy.reconcile_interval = Duration::from_secs(3600);
    config.policy.ready_timeout = Duration::from_secs(30);
    let workdir = dir.join("workspace");
    config.defaults.working_dir = workdir.display().to_string();
    config
}

impl Harness {
    pub(super) async fn new(backend: FakeBackend) -> Harness {
        Self::with(backend, |_| {}).await
    }

    async fn with(backend: FakeBackend, change: impl FnOnce(&mut ServiceConfig)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let images = ImageStore::open(dir.path().join("images"), StoreConfig::default()).unwrap();
        let layout = dir.path().join("layout");
        tiny_layout(&layout);
        images.import(&layout, Some(IMAGE)).unwrap();
        let mut cfg = config(dir.path());
        change(&mut cfg);
        let backend = Arc::new(backend);
        let service = Service::open(
            backend.clone(),
            images.clone(),
            cfg,
            Arc::new(crate::metrics::Metrics::default()),
        )
        .await
        .unwrap();
        let app = app(&service);
        Harness {
            service,
            backend,
            app,
            images,
            dir,
        }
    }

    /// A second service (a restarted server) over the same backend and images, with a
    /// store of its own.
    async fn restart(&self) -> Service {
        let cfg = config(&self.dir.path().join("second"));
        Service::open(
            self.backend.clone(),
            self.images.clone(),
            cfg,
            Arc::new(crate::metrics::Metrics::default()),
        )
        .await
        .unwrap()
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (StatusCode, serde_json::Value) {
        call(&self.app, method, path, Some(KEY), body).await
    }

    pub(super) async fn ready_sandbox(&self) -> String {
        let rec = self.service.create(&tenant(), create_req()).await.unwrap();
        self.service
            .wait_ready(&tenant(), &rec.id, Duration::from_secs(30))
            .await
            .unwrap();
        rec.id
    }
}

fn app(service: &Service) -> axum::Router {
    router(AppState::new(service.clone(), Keys::new([KEY])))
}

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<serde_json::Value>,
) -> (StatusCode, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

pub(super) fn tenant() -> Tenant {
    Tenant(KEY_TENANT.with(|t| t.clone()))
}

thread_local! {
    /// The tenant name `Keys` gives [`KEY`] (its hash prefix), learnt once.
    static KEY_TENANT: String = Keys::new([KEY])
        .authenticate(Some(KEY))
        .expect("the key is accepted")
        .0;
}

fn create_req() -> CreateRequest {
    CreateRequest {
        image: IMAGE.into(),
        cpu: Some("1".into()),
        memory: Some("1Gi".into()),
        ..Default::default()
    }
}

fn shell(s: &str) -> CompatCommand {
    CompatCommand::Shell(s.into())
}

#[tokio::test]
async fn a_sandbox_over_tcp_becomes_ready_and_its_jobs_run_in_submission_order() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let (status, created) = h
        .call(
            "POST",
            "/sandboxes",
            Some(serde_json::json!({"image": IMAGE, "cpu": "1", "memory": "1Gi"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let (status, waited) = h.call("GET", &format!("/sandboxes/{id}/wait"), None).await;
    assert_eq!(
        (status, waited["status"].as_str()),
        (StatusCode::OK, Some("ready")),
        "{waited}"
    );
    let rec = h.service.get(&tenant(), &id).await.unwrap();
    assert!(matches!(
        rec.agent.as_ref().map(|a| &a.endpoint),
        Some(crate::backend::AgentEndpoint::Http(_))
    ));
    // Each job appends to one file; the order of the lines is the order they ran in.
    let log = h.dir.path().join("order.log");
    let mut ids = Vec::new();
    for i in 0..5 {
        let script = format!("sleep 0.0{}; echo {i} >> {}", 5 - i, log.display());
        let job = h
            .service
            .submit(&tenant(), &id, shell(&script), JobOptions::default())
            .await
            .unwrap();
        assert_eq!(job.status, JobStatus::Queued);
        ids.push(job.job_id);
    }
    for job_id in &ids {
        let (status, job) = h
            .call("GET", &format!("/jobs/{job_id}/wait?timeout=30"), None)
            .await;
        assert_eq!(
            (status, job["status"].as_str()),
            (StatusCode::OK, Some("succeeded")),
            "{job}"
        );
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "0\n1\n2\n3\n4\n");
    // The compatible exec with wait=true answers the finished job.
    let (status, job) = h
        .call(
            "POST",
            &format!("/sandboxes/{id}/exec"),
            Some(serde_json::json!({"command": "echo hi; echo err >&2; exit 3", "wait": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(
        (job["stdout"].as_str(), job["stderr"].as_str()),
        (Some("hi\n"), Some("err\n"))
    );
    assert_eq!(job["exit_code"], 3);
}

#[tokio::test]
async fn agents_on_unix_sockets_serve_jobs_and_the_v1_proxy() {
    let sockets = tempfile::tempdir().unwrap();
    let h = Harness::new(FakeBackend::unix(sockets.path().into())).await;
    let id = h.ready_sandbox().await;
    let (status, job) = h
        .call(
            "POST",
            &format!("/sandboxes/{id}/exec"),
            Some(serde_json::json!({"command": ["echo", "a b"], "wait": true})),
        )
        .await;
    assert_eq!(
        (status, job["stdout"].as_str()),
        (StatusCode::OK, Some("a b\n")),
        "{job}"
    );
    let (status, out) = h
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(serde_json::json!({"command": ["echo", "proxied"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["exit_code"], 0, "{out}");
}

#[tokio::test]
async fn the_v1_proxy_reaches_agents_over_tcp() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    let (status, out) = h
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(serde_json::json!({"command": ["echo", "over tcp"]})),
        )
        .await;
    assert_eq!(
        (status, out["exit_code"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{out}"
    );
}

#[tokio::test]
async fn waits_are_woken_by_the_change_and_time_out_when_none_comes() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let h = Harness::new(FakeBackend::tcp().gated(gate.clone())).await;
    let rec = h.service.create(&tenant(), create_req()).await.unwrap();
    let err = h
        .service
        .wait_ready(&tenant(), &rec.id, Duration::from_millis(20))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReadyTimeout { .. }), "{err:?}");
    // A job queued while pending waits for the sandbox.
    let job = h
        .service
        .submit(
            &tenant(),
            &rec.id,
            shell("echo queued"),
            JobOptions::default(),
        )
        .await
        .unwrap();
    let waiter = {
        let (s, id) = (h.service.clone(), rec.id.clone());
        tokio::spawn(async move { s.wait_ready(&tenant(), &id, Duration::from_secs(60)).await })
    };
    let (status, body) = h
        .call(
            "POST",
            &format!("/sandboxes/{}/exec", rec.id),
            Some(serde_json::json!({"command": "true"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "queued while pending: {body}");
    gate.add_permits(1);
    let ready = waiter.await.unwrap().unwrap();
    assert_eq!(ready.phase, Phase::Ready);
    let done = h
        .service
        .wait_job(&tenant(), &job.job_id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(done.stdout, "queued\n");
}

#[tokio::test]
async fn quotas_refuse_past_their_limit_and_a_delete_frees_a_slot() {
    let h = Harness::with(FakeBackend::tcp(), |c| c.quotas.max_sandboxes = 1).await;
    let first = h.ready_sandbox().await;
    let (status, body) = h
        .call(
            "POST",
            "/sandboxes",
            Some(serde_json::json!({"image": IMAGE})),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("quota_exceeded")),
        "{body}"
    );
    let (status, _) = h.call("DELETE", &format!("/sandboxes/{first}"), None).await;
    assert_eq!(status, StatusCode::OK);
    h.ready_sandbox().await;

    let h = Harness::with(FakeBackend::tcp(), |c| c.quotas.creates_per_minute = 2).await;
    h.ready_sandbox().await;
    h.ready_sandbox().await;
    let err = h.service.create(&tenant(), create_req()).await.unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
}

#[tokio::test]
async fn ttl_and_stopped_heartbeats_delete_sandboxes() {
    let h = Harness::with(FakeBackend::tcp(), |c| {
        c.policy.heartbeat_timeout = Duration::ZERO;
    })
    .await;
    let kept = h.ready_sandbox().await;
    let beating = h.ready_sandbox().await;
    let mut req = create_req();
    req.ttl_s = Some(0);
    let forever = h.service.create(&tenant(), req).await.unwrap().id;
    h.service.heartbeat(&tenant(), &beating).await.unwrap();
    h.service.expire_now().await;
    assert!(
        h.service.get(&tenant(), &beating).await.is_err(),
        "no heartbeat within 0 s"
    );
    assert!(
        h.service.get(&tenant(), &kept).await.is_ok(),
        "never sent one: not reaped"
    );
    assert!(!h.backend.ids().contains(&beating));

    let h = Harness::with(FakeBackend::tcp(), |c| {
        c.policy.default_ttl = Some(Duration::ZERO)
    })
    .await;
    let short = h.ready_sandbox().await;
    h.service.expire_now().await;
    assert!(
        h.service.get(&tenant(), &short).await.is_err(),
        "its TTL ended"
    );
    assert!(h.backend.ids().is_empty());
    let _ = forever;
}

#[tokio::test]
async fn regression_a_sandbox_whose_liveness_cannot_be_read_is_never_failed() {
    // Issue 30: a descriptor flood made every read of /proc fail, the backend listed
    // every sandbox as stopped, and reconciliation deleted them all.
    let h = Harness::new(FakeBackend::tcp()).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let id = h.ready_sandbox().await;
        h.backend
            .set_liveness(&id, crate::backend::Liveness::Unknown);
        ids.push(id);
    }
    for _ in 0..super::policy::MASS_FAILURE_CONFIRMATIONS + 2 {
        assert!(h.service.reconcile_now().await);
    }
    for id in &ids {
        assert_eq!(
            h.service.get(&tenant(), id).await.unwrap().phase,
            Phase::Ready
        );
    }
    assert_eq!(h.backend.ids().len(), ids.len(), "nothing deleted on doubt");
}

#[tokio::test]
async fn reconciliation_holds_back_a_mass_failure_until_passes_in_a_row_confirm_it() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(h.ready_sandbox().await);
    }
    let (stopped, kept) = ids.split_at(4);
    for id in stopped {
        h.backend.stop(id);
    }
    let phase = |id: String| {
        let s = h.service.clone();
        async move { s.get(&tenant(), &id).await.unwrap().phase }
    };
    for _ in 1..super::policy::MASS_FAILURE_CONFIRMATIONS {
        assert!(h.service.reconcile_now().await);
        for id in &ids {
            assert_eq!(phase(id.clone()).await, Phase::Ready, "held back");
        }
    }
    // A pass without the mass failure in between starts the count again.
    for id in stopped {
        h.backend
            .set_liveness(id, crate::backend::Liveness::Running);
    }
    assert!(h.service.reconcile_now().await);
    for id in stopped {
        h.backend.stop(id);
    }
    for _ in 1..super::policy::MASS_FAILURE_CONFIRMATIONS {
        assert!(h.service.reconcile_now().await);
        assert_eq!(
            phase(stopped[0].clone()).await,
            Phase::Ready,
            "count restarted"
        );
    }
    assert!(h.service.reconcile_now().await);
    for id in stopped {
        assert!(matches!(phase(id.clone()).await, Phase::Failed { .. }));
    }
    assert_eq!(phase(kept[0].clone()).await, Phase::Ready);
}

#[tokio::test]
async fn reconciliation_fails_lost_sandboxes_but_not_when_the_backend_cannot_list() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let lost = h.ready_sandbox().await;
    let stopped = h.ready_sandbox().await;
    h.backend.lose(&lost);
    h.backend.stop(&stopped);
    h.backend
        .list_fails
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(!h.service.reconcile_now().await);
    assert_eq!(
        h.service.get(&tenant(), &lost).await.unwrap().phase,
        Phase::Ready
    );
    h.backend
        .list_fails
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(h.service.reconcile_now().await);
    let phase = |id: String| {
        let s = h.service.clone();
        async move { s.get(&tenant(), &id).await.unwrap().phase }
    };
    assert_eq!(
        phase(lost.clone()).await,
        Phase::Failed {
            message: "the sandbox disappeared from the backend".into()
        }
    );
    assert_eq!(
        phase(stopped.clone()).await,
        Phase::Failed {
            message: "the sandbox stopped on its own".into()
        }
    );
    assert!(
        !h.backend.ids().contains(&stopped),
        "a stopped sandbox is deleted"
    );
    let (status, body) = h
        .call(
            "POST",
            &format!("/sandboxes/{lost}/exec"),
            Some(serde_json::json!({"command": "true"})),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_GATEWAY, Some("sandbox_failed")),
        "{body}"
    );
}

#[tokio::test]
async fn a_restarted_service_adopts_the_backends_sandboxes_and_runs_their_jobs() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let mut req = create_req();
    req.labels.insert("team".into(), "a".into());
    let id = h.service.create(&tenant(), req).await.unwrap().id;
    h.service
        .wait_ready(&tenant(), &id, Duration::from_secs(30))
        .await
        .unwrap();
    let second = h.restart().await;
    let rec = second.get(&tenant(), &id).await.unwrap();
    assert_eq!(rec.phase, Phase::Ready);
    assert_eq!(rec.labels.get("team").map(String::as_str), Some("a"));
    assert_eq!((rec.cpu.as_str(), rec.memory.as_str()), ("1", "1Gi"));
    let (status, job) = call(
        &app(&second),
        "POST",
        &format!("/sandboxes/{id}/exec"),
        Some(KEY),
        Some(serde_json::json!({"command": "echo adopted", "wait": true})),
    )
    .await;
    assert_eq!(
        (status, job["stdout"].as_str()),
        (StatusCode::OK, Some("adopted\n")),
        "{job}"
    );
}

#[tokio::test]
async fn limits_above_the_capacity_are_lowered_and_said_so_where_the_backend_clamps() {
    // The fake backend's machine: 64 CPUs, 256 GiB.
    let h = Harness::new(FakeBackend::tcp()).await;
    let big = serde_json::json!({"image": IMAGE, "cpu": "100", "memory": "1Ti"});
    let (status, created) = h.call("POST", "/sandboxes", Some(big.clone())).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(
        (created["cpu"].as_str(), created["memory"].as_str()),
        (Some("64"), Some("262144Mi"))
    );
    let said = created["status_message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        said.contains("cpu 100 to 64") && said.contains("memory 1Ti to 262144Mi"),
        "{said}"
    );
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let (_, ready) = h
        .call("GET", &format!("/sandboxes/{id}/wait?timeout=30"), None)
        .await;
    assert_eq!(
        (ready["status"].as_str(), ready["status_message"].as_str()),
        (Some("ready"), Some(said.as_str()))
    );
    let spec = h.backend.created.lock().unwrap()[0].clone();
    assert_eq!(
        (spec.cpus, spec.memory_bytes),
        (Some(64.0), Some(256 << 30))
    );
    // A restarted server still says it.
    let second = h.restart().await;
    assert_eq!(
        second.get(&tenant(), &id).await.unwrap().notice.as_deref(),
        Some(said.as_str())
    );
    // Within the capacity, nothing is said.
    let (_, small) = h
        .call(
            "POST",
            "/sandboxes",
            Some(serde_json::json!({"image": IMAGE, "cpu": "2"})),
        )
        .await;
    assert!(small.get("status_message").is_none(), "{small}");

    // A backend that refuses (a cluster) keeps refusing.
    let mut refusing = FakeBackend::tcp();
    refusing.refuses_over_capacity = true;
    let h = Harness::new(refusing).await;
    let (status, refused) = h.call("POST", "/sandboxes", Some(big)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("at most 64 CPUs"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_sandbox_deleted_while_pending_leaves_nothing_and_fails_its_jobs() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let h = Harness::new(FakeBackend::tcp().gated(gate.clone())).await;
    let mut creates = h.backend.creates.subscribe();
    let rec = h.service.create(&tenant(), create_req()).await.unwrap();
    let job = h
        .service
        .submit(
            &tenant(),
            &rec.id,
            shell("echo never"),
            JobOptions::default(),
        )
        .await
        .unwrap();
    // The backend is making it (held at the gate) when the delete comes.
    creates.wait_for(|n| *n >= 1).await.unwrap();
    let mut deletes = h.backend.deletes.subscribe();
    h.service.delete(&tenant(), &rec.id).await.unwrap();
    let failed = h
        .service
        .wait_job(&tenant(), &job.job_id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(
        (failed.status, failed.error.as_deref()),
        (JobStatus::Failed, Some("the sandbox was deleted"))
    );
    gate.add_permits(1);
    // The create task finds its record gone and deletes what it made.
    deletes.wait_for(|n| *n >= 1).await.unwrap();
    assert!(h.backend.ids().is_empty());
}

#[tokio::test]
async fn every_error_maps_to_its_status_and_code() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let h = Harness::new(FakeBackend::tcp().gated(gate.clone())).await;
    let expect = |status: StatusCode, code: &str, (got, body): (StatusCode, serde_json::Value)| {
        assert_eq!((got, body["code"].as_str()), (status, Some(code)), "{body}");
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    };
    expect(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        call(&h.app, "GET", "/sandboxes/nope", None, None).await,
    );
    expect(
        StatusCode::NOT_FOUND,
        "not_found",
        h.call("GET", "/sandboxes/nope", None).await,
    );
    expect(
        StatusCode::NOT_FOUND,
        "not_found",
        h.call("GET", "/jobs/job-nope", None).await,
    );
    expect(
        StatusCode::BAD_REQUEST,
        "bad_request",
        h.call(
            "POST",
            "/v1/sandboxes",
            Some(serde_json::json!({"image": IMAGE, "labels": {"orchard.tenant": "x"}})),
        )
        .await,
    );
    expect(
        StatusCode::BAD_REQUEST,
        "bad_request",
        h.call(
            "POST",
            "/sandboxes",
            Some(serde_json::json!({"image": IMAGE, "sandbox_id": "Bad Id"})),
        )
        .await,
    );
    expect(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        h.call("POST", "/sandboxes", Some(serde_json::json!({"image": 5})))
            .await,
    );
    let id = h.service.create(&tenant(), create_req()).await.unwrap().id;
    expect(
        StatusCode::CONFLICT,
        "conflict",
        h.call("GET", &format!("/v1/sandboxes/{id}/files?path=/"), None)
            .await,
    );
    expect(
        StatusCode::CONFLICT,
        "conflict",
        h.call(
            "POST",
            "/sandboxes",
            Some(serde_json::json!({"image": IMAGE, "sandbox_id": id})),
        )
        .await,
    );
    expect(
        StatusCode::REQUEST_TIMEOUT,
        "timeout",
        h.call(
            "GET",
            &format!("/v1/sandboxes/{id}/wait?timeout=0.01"),
            None,
        )
        .await,
    );
    *h.backend.fail_creates.lock().unwrap() = Some("no room".into());
    gate.add_permits(1);
    let (status, body) = h
        .call("GET", &format!("/v1/sandboxes/{id}/wait?timeout=30"), None)
        .await;
    expect(
        StatusCode::BAD_GATEWAY,
        "sandbox_failed",
        (status, body.clone()),
    );
    assert!(
        body["detail"].as_str().unwrap().contains("no room"),
        "{body}"
    );
    // Another tenant's sandbox is not found, not forbidden.
    let other = Keys::new(["key-2"]);
    let app2 = router(AppState::new(h.service.clone(), other));
    expect(
        StatusCode::NOT_FOUND,
        "not_found",
        call(
            &app2,
            "GET",
            &format!("/sandboxes/{id}"),
            Some("key-2"),
            None,
        )
        .await,
    );
}

/// The WebSocket bridge reaches an agent on TCP (a pod's IP) as it does a Unix socket:
/// the compatible terminal runs `echo hi` and exits.
#[tokio::test]
async fn the_terminal_bridge_reaches_agents_over_tcp() {
    use base64::Engine;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = h.app.clone();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("ws://{addr}/sandboxes/{id}/exec/pty?api_key={KEY}");
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let send = |v: serde_json::Value| Message::Text(v.to_string().into());
    ws.send(send(
        serde_json::json!({"type": "init", "cmd": ["sh"], "env": {}, "cwd": "/",
        "rows": 24, "cols": 80, "login_shell": false}),
    ))
    .await
    .unwrap();
    for line in ["echo hi\n", "exit\n"] {
        let frame = serde_json::json!({"type": "stdin", "data": b64.encode(line)});
        ws.send(send(frame)).await.unwrap();
    }
    let mut out = String::new();
    let exit = loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("a frame within 30 s")
            .expect("the socket stays open until exit")
            .unwrap();
        let Message::Text(text) = msg else { continue };
        let frame: serde_json::Value = serde_json::from_str(&text).unwrap();
        match frame["type"].as_str() {
            Some("stdout") => {
                let bytes = b64.decode(frame["data"].as_str().unwrap()).unwrap();
                out.push_str(&String::from_utf8_lossy(&bytes));
            }
            Some("exit") => break frame,
            _ => {}
        }
    };
    assert_eq!(exit["code"], 0, "{exit}");
    assert!(out.contains("hi\r\n"), "{out:?}");
    server.abort();
}

#[tokio::test]
async fn a_usable_request_id_is_echoed_and_any_other_replaced_by_ours() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let echoed = |sent: Option<String>| {
        let mut req = Request::builder().uri("/v1/sandboxes/nope");
        if let Some(id) = sent {
            req = req.header("x-request-id", id);
        }
        let req = req.body(Body::empty()).unwrap();
        let app = h.app.clone();
        async move {
            let resp = app.oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
            let id = resp.headers().get("x-request-id").unwrap();
            id.to_str().unwrap().to_string()
        }
    };
    let ours = |id: &str| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
    assert_eq!(echoed(Some("r1".into())).await, "r1");
    let long = "x".repeat(128);
    assert_eq!(echoed(Some(long.clone())).await, long);
    for sent in [None, Some(String::new()), Some("x".repeat(129))] {
        let id = echoed(sent.clone()).await;
        assert!(ours(&id), "{sent:?} -> {id}");
    }
    assert_ne!(echoed(None).await, echoed(None).await);
}

/// A pending sandbox whose create lease nobody holds is failed and deleted at the
/// backend, once: the policy knows it failed the record from its own change, not from
/// the record's message, so a record another replica failed with the same words is
/// left alone.
#[tokio::test]
async fn an_orphaned_create_is_failed_and_deleted_once() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let store = h.service.store();
    let pending = crate::state::conformance::record("sb-orphan", "u1");
    store.insert_sandbox(pending.clone()).await.unwrap();
    let deletes = || *h.backend.deletes.borrow();
    let before = deletes();
    policy::fail_orphaned_creates(&h.service, std::slice::from_ref(&pending)).await;
    let rec = store.sandbox("sb-orphan").await.unwrap().unwrap().value;
    assert_eq!(
        rec.phase,
        Phase::Failed {
            message: policy::ORPHANED_CREATE.into()
        }
    );
    assert_eq!(deletes(), before + 1, "the backend's leftovers are deleted");
    // A stale read still shows it pending: the record says failed, in the same
    // words, but not by this pass.
    policy::fail_orphaned_creates(&h.service, std::slice::from_ref(&pending)).await;
    assert_eq!(deletes(), before + 1, "deleted once");
}

#[tokio::test]
async fn an_empty_command_is_refused_first_whatever_the_sandbox() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    for sandbox in [id.as_str(), "no-such-sandbox"] {
        for command in [shell(""), shell(" \n\t"), CompatCommand::Argv(Vec::new())] {
            let e = h
                .service
                .submit(&tenant(), sandbox, command.clone(), JobOptions::default())
                .await
                .unwrap_err();
            assert!(
                matches!(&e, Error::BadRequest(m) if m == "command must not be empty"),
                "{sandbox} {command:?}: {e:?}"
            );
        }
    }
    // A list whose one argument is blank is a command (the program "" fails to run).
    let argv = CompatCommand::Argv(vec![String::new()]);
    assert!(h
        .service
        .submit(&tenant(), &id, argv, JobOptions::default())
        .await
        .is_ok());
}

/// The scheduler's words for a pod no node can take (v1.37, too much CPU).
const NO_NODE: &str = "0/1 nodes are available: 1 Insufficient cpu.";

mod unschedulable;
