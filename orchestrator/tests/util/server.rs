//! A real `orchard serve` for tests: in-process ([`TestServer::start`], the router on a
//! loopback port, over a real local backend and image store on a temporary root), or the
//! real binary ([`ServerProcess`]) for tests that kill it. The busybox test image is
//! imported into every server's store as `busybox:latest`.
//!
//! Dropping a [`TestServer`] deletes its sandboxes and destroys its backend (also when
//! the test failed); [`TestServer::finish`] does so and asserts the leak audit is empty.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orchard::backend::local::LocalBackend;
use orchard::backend::{Backend, BackendError, BackendFuture, BackendSandbox, CreateSpec};
use orchard::config::{Config, ServeArgs};
use orchard::image::{ImageStore, StoreConfig};
use orchard::service::{Keys, Policy, Service};
use serde_json::Value;

use super::sandbox::{agent_binary, assert_clean, fresh_root, test_config, TestBackend};

/// The key every test server accepts, and a second tenant's.
pub const KEY: &str = "test-key-1";
/// Another tenant.
pub const OTHER_KEY: &str = "test-key-2";

pub use orchard_test_support::image_layout;

/// The local backend with a switch that makes `list` fail (reconciliation tests).
pub struct SwitchableBackend {
    /// The real backend.
    pub inner: LocalBackend,
    /// When set, `list` answers `Unavailable`.
    pub list_fails: AtomicBool,
    /// Every id `delete` was called with, in order (the replica tests' audit).
    pub deleted: std::sync::Mutex<Vec<String>>,
}

impl Backend for SwitchableBackend {
    fn name(&self) -> &str {
        "local"
    }
    fn create(&self, spec: CreateSpec) -> BackendFuture<'_, BackendSandbox> {
        Backend::create(&self.inner, spec)
    }
    fn delete<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        self.deleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id.to_string());
        Backend::delete(&self.inner, id)
    }
    fn list(&self) -> BackendFuture<'_, Vec<BackendSandbox>> {
        if self.list_fails.load(Ordering::Relaxed) {
            return Box::pin(async { Err(BackendError::unavailable("listing is switched off")) });
        }
        Backend::list(&self.inner)
    }
    fn recover(&self) -> BackendFuture<'_, Vec<String>> {
        Backend::recover(&self.inner)
    }
    fn shutdown(&self) -> BackendFuture<'_, ()> {
        Backend::shutdown(&self.inner)
    }
    fn disk_room(&self, id: &str) -> Option<orchard::backend::DiskRoom> {
        Backend::disk_room(&self.inner, id)
    }
    fn pause<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        Backend::pause(&self.inner, id)
    }
    fn resume<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        Backend::resume(&self.inner, id)
    }
    fn snapshot(
        &self,
        spec: orchard::backend::SnapshotSpec,
    ) -> BackendFuture<'_, orchard::backend::BackendSnapshot> {
        Backend::snapshot(&self.inner, spec)
    }
    fn snapshots(&self) -> BackendFuture<'_, Vec<orchard::backend::BackendSnapshot>> {
        Backend::snapshots(&self.inner)
    }
    fn delete_snapshot<'a>(&'a self, id: &'a str) -> BackendFuture<'a, u64> {
        Backend::delete_snapshot(&self.inner, id)
    }
}

/// A change to a test server's resolved configuration.
pub type Configure = Arc<dyn Fn(&mut Config) + Send + Sync>;

/// Options of a test server.
#[derive(Clone)]
pub struct Options {
    /// Policies (fast loop by default).
    pub policy: Policy,
    /// Sandboxes per key.
    pub max_sandboxes: usize,
    /// Creates per minute per key.
    pub creates_per_minute: usize,
    /// Auth off.
    pub no_auth: bool,
    /// Where the backend's creates stop (readiness time-out tests).
    pub fail_point: Option<orchard::backend::local::FailPoint>,
    /// Changes the resolved configuration before the server starts.
    pub configure: Option<Configure>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: Policy {
                interval: Duration::from_millis(50),
                reconcile_interval: Duration::from_secs(3600),
                ready_timeout: Duration::from_secs(120),
                ..Policy::default()
            },
            max_sandboxes: 0,
            creates_per_minute: 0,
            no_auth: false,
            fail_point: None,
            configure: None,
        }
    }
}

/// An in-process server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The service behind it.
    pub service: Service,
    /// The backend (with its failure switch).
    pub backend: Arc<SwitchableBackend>,
    /// HTTP client.
    pub http: reqwest::Client,
    /// The local backend fixture (destroys on drop).
    tb: Option<TestBackend>,
    data: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

/// Imports a test image layout into `store` as `name`.
pub fn import(store: &ImageStore, layout: &str, name: &str) {
    store
        .import(&image_layout(layout), Some(name))
        .unwrap_or_else(|e| panic!("importing {layout} as {name}: {e}"));
}

impl TestServer {
    /// A server with default options.
    pub async fn start() -> TestServer {
        Self::with(Options::default()).await
    }

    /// A server with `opts`.
    pub async fn with(opts: Options) -> TestServer {
        // Request lines of in-process servers would drown the test output; the log
        // format is checked on the server process's log.
        orchard::log::set_level("warn");
        let data = temp_dir("orchard-srv-");
        let store = ImageStore::open(data.path().join("images"), StoreConfig::default()).unwrap();
        import(&store, "busybox", "busybox:latest");
        let mut local = test_config(&fresh_root());
        local.fail_point = opts.fail_point;
        let tb = TestBackend::with_config(local);
        let backend = Arc::new(SwitchableBackend {
            inner: tb.backend.clone(),
            list_fails: AtomicBool::new(false),
            deleted: Default::default(),
        });
        let mut config = Config::resolve(ServeArgs {
            data_dir: Some(data.path().to_path_buf()),
            agent: Some(agent_binary()),
            ..Default::default()
        })
        .unwrap();
        config.service.policy = opts.policy.clone();
        config.service.quotas.max_sandboxes = opts.max_sandboxes;
        config.service.quotas.creates_per_minute = opts.creates_per_minute;
        if let Some(f) = &opts.configure {
            f(&mut config);
        }
        let keys = if opts.no_auth {
            Keys::disabled()
        } else {
            Keys::new([KEY, OTHER_KEY]).with_operators([KEY])
        };
        let (router, service) = orchard::serve::app(backend.clone(), store, &config, keys)
            .await
            .unwrap();
        // Only servers given a disk budget run the image GC (it logs and keeps a task).
        if config
            .registry
            .gc
            .is_some_and(|gc| gc.budget != orchard::image::gc::Budget::Off)
        {
            orchard::serve::start_image_gc(&config, &service);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let limits = config.connections.clone();
        let task = tokio::spawn(orchard::server::listen::serve(
            listener,
            router,
            limits,
            std::future::pending(),
        ));
        TestServer {
            url,
            service,
            backend,
            http: reqwest::Client::new(),
            tb: Some(tb),
            data,
            task,
        }
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// A request with the test key.
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .header("X-API-Key", KEY)
    }

    /// GET with the key; answers status and JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        send(self.req(reqwest::Method::GET, path)).await
    }

    /// GET with another key (a second tenant's, or a wrong one).
    pub async fn get_as(&self, key: &str, path: &str) -> (u16, Value) {
        send(
            self.http
                .get(format!("{}{path}", self.url))
                .header("X-API-Key", key),
        )
        .await
    }

    /// POST JSON with the key.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        send(self.req(reqwest::Method::POST, path).json(&body)).await
    }

    /// DELETE with the key.
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        send(self.req(reqwest::Method::DELETE, path)).await
    }

    /// A ready busybox sandbox made through `/v1`; answers its id.
    pub async fn sandbox(&self) -> String {
        let (s, v) = self
            .post(
                "/v1/sandboxes",
                serde_json::json!({"image": "busybox:latest"}),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// How many sandboxes `GET /v1/sandboxes` lists.
    pub async fn sandbox_count(&self) -> usize {
        let (s, list) = self.get("/v1/sandboxes").await;
        assert_eq!(s, 200, "{list}");
        list["sandboxes"].as_array().expect("a list").len()
    }

    /// Queues the compatible job `command` in sandbox `id`; answers the job's id.
    pub async fn submit(&self, id: &str, command: &str) -> String {
        let (s, q) = self
            .post(
                &format!("/sandboxes/{id}/exec"),
                serde_json::json!({ "command": command }),
            )
            .await;
        assert_eq!(s, 200, "{q}");
        q["job_id"].as_str().expect("the job's id").to_string()
    }

    /// `/metrics`, as text.
    pub async fn metrics(&self) -> String {
        let resp = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("GET /metrics");
        resp.text().await.expect("reading /metrics")
    }

    /// Deletes every sandbox through the API, then asserts nothing is left on the host.
    pub async fn finish(mut self) {
        self.service.shutdown().await;
        let tb = self.tb.take().unwrap();
        assert_clean(&tb.backend).await;
        self.task.abort();
        tb.finish().await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends a request; answers status and the JSON body (`Null` when not JSON).
pub async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = tokio::time::timeout(Duration::from_secs(120), req.send())
        .await
        .expect("request did not finish in 120 s")
        .expect("request failed");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A temporary directory named from `prefix`, removed on drop (a server's data
/// directory, mostly).
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("creating a temporary directory")
}

/// Imports the busybox test image through the API of the server at `url` (KEY is the
/// operator).
pub async fn import_busybox(url: &str) {
    let mut tar = tar::Builder::new(Vec::new());
    tar.append_dir_all(".", image_layout("busybox")).unwrap();
    let (s, v) = send(
        reqwest::Client::new()
            .post(format!("{url}/v1/images/import?name=busybox:latest"))
            .header("X-API-Key", KEY)
            .body(tar.into_inner().unwrap()),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

/// `orchard serve` started with `extra` on a fresh data directory named from `prefix`,
/// with the busybox test image imported; answers the directory (it must outlive the
/// server) and the server.
pub async fn busybox_server(prefix: &str, extra: &[&str]) -> (tempfile::TempDir, ServerProcess) {
    let data = temp_dir(prefix);
    let srv = ServerProcess::start(data.path(), extra);
    import_busybox(&srv.url).await;
    (data, srv)
}

/// A ready busybox sandbox `id` of `key` on the server at `url`.
pub async fn sandbox(http: &reqwest::Client, url: &str, key: &str, id: &str) {
    let (s, v) = send(
        http.post(format!("{url}/v1/sandboxes"))
            .header("X-API-Key", key)
            .json(&serde_json::json!({"image": "busybox:latest", "id": id})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
}

/// Runs `command` in `id` as `key` through the compatible API and waits for it;
/// answers the status and the job.
pub async fn exec_waited(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    id: &str,
    command: &str,
) -> (u16, Value) {
    send(
        http.post(format!("{url}/sandboxes/{id}/exec"))
            .header("X-API-Key", key)
            .json(&serde_json::json!({"command": command, "wait": true})),
    )
    .await
}

/// The real `orchard serve` binary on a data directory, for tests that kill it.
pub struct ServerProcess {
    /// The process.
    pub child: Child,
    /// Its base URL.
    pub url: String,
    /// Its data directory.
    pub data_dir: PathBuf,
}

impl ServerProcess {
    /// Starts `orchard serve` on `data_dir` (kept across restarts by the caller) and
    /// waits for its ready file.
    pub fn start(data_dir: &Path, extra: &[&str]) -> ServerProcess {
        Self::start_with_keys(data_dir, &[KEY, OTHER_KEY], extra)
    }

    /// [`ServerProcess::start`] accepting `keys` (none: the server generates one).
    pub fn start_with_keys(data_dir: &Path, keys: &[&str], extra: &[&str]) -> ServerProcess {
        Self::start_with_env(data_dir, keys, &[], extra)
    }

    /// [`ServerProcess::start_with_keys`] with `env` added to its environment.
    pub fn start_with_env(
        data_dir: &Path,
        keys: &[&str],
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> ServerProcess {
        Self::start_limited(data_dir, keys, env, extra, None)
    }

    /// [`ServerProcess::start`] under an open-file limit of `open_files` (soft and
    /// hard: the server cannot raise it), for the descriptor-flood tests.
    pub fn start_with_open_files(
        data_dir: &Path,
        open_files: u64,
        extra: &[&str],
    ) -> ServerProcess {
        Self::start_limited(data_dir, &[KEY, OTHER_KEY], &[], extra, Some(open_files))
    }

    fn start_limited(
        data_dir: &Path,
        keys: &[&str],
        env: &[(&str, &str)],
        extra: &[&str],
        open_files: Option<u64>,
    ) -> ServerProcess {
        let ready = data_dir.join("ready-url");
        let _ = std::fs::remove_file(&ready);
        std::fs::create_dir_all(data_dir).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.join("server.log"))
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_orchard"));
        if let Some(n) = open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork
            // and exec.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(keys.iter().flat_map(|k| ["--api-key", k]))
            // The first key imports the test images.
            .args(
                keys.first()
                    .map(|k| ["--operator-key", k])
                    .into_iter()
                    .flatten(),
            )
            .env_remove("ORCHARD_API_KEYS")
            .env_remove("ORCHARD_OPERATOR_KEYS")
            // The test registries listen on loopback; a test may set it to "" to see
            // the default policy.
            .env("ORCHARD_ALLOW_REGISTRIES", "127.0.0.1")
            .envs(env.iter().copied())
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--agent")
            .arg(agent_binary())
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting orchard serve");
        let mut proc = ServerProcess {
            child,
            url: String::new(),
            data_dir: data_dir.to_path_buf(),
        };
        // The ready file appears once the server listens; nothing to subscribe to.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(u) = std::fs::read_to_string(&ready) {
                if u.ends_with('\n') {
                    proc.url = u.trim().to_string();
                    break;
                }
            }
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!(
                    "orchard serve exited with {status}:\n{}",
                    std::fs::read_to_string(data_dir.join("server.log")).unwrap_or_default()
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "orchard serve did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proc
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("waiting for orchard serve")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// Reaps zombie sandbox inits (the agents' `orchard-init`) re-parented to this test process. A server killed with SIGKILL
/// leaves its sandboxes' inits orphaned; since other tests made this process a child
/// subreaper, they become its children, and the restarted server that deletes them
/// cannot reap them. Only those pids are waited for: a `waitpid(-1)` would steal other
/// tests' children.
pub fn reap_orphaned_agents() {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = &stat[stat.find('(').map_or(0, |i| i + 1)..close];
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // The container's init is the agent's init (`orchard-init`), or an older agent.
        if matches!(comm, "orchard-init" | "orchard-agent")
            && rest.first() == Some(&"Z")
            && rest.get(1) == Some(&me.as_str())
        {
            // SAFETY: waiting for one specific zombie child.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// Pulls `reference` through `POST /v1/images/pull` of the server at `url` with the
/// test key; answers the last NDJSON event.
pub async fn pull(url: &str, reference: &str) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{url}/v1/images/pull"))
        .header("X-API-Key", KEY)
        .json(&serde_json::json!({ "reference": reference }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    let last = body.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {body}"))
}
