//! The fixture of the end-to-end tests: [`Server`], a real `orchard serve` in this
//! process (the router on a loopback port) over the local backend on a fresh root and
//! an image store holding `busybox:latest` from `images/out/`.
//!
//! Dropping a [`Server`] (also when its test failed) destroys its backend: no sandbox,
//! mount, cgroup or directory is left. [`Server::finish`] does the same and asserts
//! that the backend's leak audit is empty.

use std::sync::Arc;
use std::time::Duration;

use orchard::backend::local::{LocalBackend, LocalConfig};
use orchard::config::{Config, ServeArgs};
use orchard::image::{ImageStore, StoreConfig};
use orchard::service::{Keys, Service};
use orchard_test_support::{agent_binary, block_on_own_runtime, image_layout, within, CALL_LIMIT};
use serde_json::{json, Value};

/// The key the server accepts (an operator key, so it may import images).
pub const KEY: &str = "e2e-key";

/// A running server.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// HTTP client.
    pub http: reqwest::Client,
    service: Service,
    backend: LocalBackend,
    finished: bool,
    _data: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Starts a server with default configuration.
    pub async fn start() -> Server {
        // Request lines of an in-process server would drown the test output.
        orchard::log::set_level("warn");
        let data = tempfile::Builder::new()
            .prefix("orchard-e2e-")
            .tempdir()
            .expect("creating the data directory");
        let store = ImageStore::open(data.path().join("images"), StoreConfig::default())
            .expect("opening the image store");
        store
            .import(&image_layout("busybox"), Some("busybox:latest"))
            .expect("importing busybox");
        // A short root: the agent's socket path must stay under 108 bytes.
        let root = tempfile::Builder::new()
            .prefix("orb-")
            .tempdir()
            .expect("creating a backend root")
            .keep();
        let mut local = LocalConfig::new(&root, agent_binary());
        local.ready_timeout = Duration::from_secs(60);
        let backend = LocalBackend::open(local).expect("opening the local backend");
        let config = Config::resolve(ServeArgs {
            data_dir: Some(data.path().to_path_buf()),
            agent: Some(agent_binary()),
            ..Default::default()
        })
        .expect("resolving the configuration");
        let keys = Keys::new([KEY]).with_operators([KEY]);
        let (router, service) =
            orchard::serve::app(Arc::new(backend.clone()), store, &config, keys)
                .await
                .expect("building the app");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Server {
            url,
            http: reqwest::Client::new(),
            service,
            backend,
            finished: false,
            _data: data,
            task,
        }
    }

    /// Starts a server and makes a ready busybox sandbox in it; answers both.
    pub async fn with_sandbox() -> (Server, String) {
        let srv = Server::start().await;
        let id = srv.sandbox().await;
        (srv, id)
    }

    /// A request to `path` with the key.
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .header("X-API-Key", KEY)
    }

    /// A ready busybox sandbox made through `/v1`; answers its id.
    pub async fn sandbox(&self) -> String {
        let (status, body) = send(
            self.req(reqwest::Method::POST, "/v1/sandboxes")
                .json(&json!({"image": "busybox:latest"})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().expect("the sandbox's id").to_string()
    }

    /// Deletes every sandbox, asserts the leak audit is empty and destroys the backend.
    pub async fn finish(mut self) {
        self.service.shutdown().await;
        let report = self.backend.audit().await.expect("running the audit");
        assert!(report.is_clean(), "leaks:\n{report}");
        self.finished = true;
        self.task.abort();
        self.backend
            .destroy()
            .await
            .expect("destroying the backend");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
        if !self.finished {
            // Drop may run inside the test's runtime, where we cannot block. A failed
            // teardown shows in the next run's audit; a test that failed already says
            // what went wrong.
            let backend = self.backend.clone();
            let _ = block_on_own_runtime(async move { backend.destroy().await });
        }
    }
}

/// Sends a request within [`CALL_LIMIT`]; answers its status and JSON body (`Null`
/// when the body is not JSON).
pub async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = within(CALL_LIMIT, req.send())
        .await
        .expect("sending the request");
    let status = resp.status().as_u16();
    let body = within(CALL_LIMIT, resp.bytes())
        .await
        .expect("reading the answer");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Asserts that `answer` (from [`send`]) is the error `status` with `code`; `what`
/// names the request in the failure message.
#[track_caller]
pub fn assert_api_error(answer: &(u16, Value), status: u16, code: &str, what: &str) {
    let (got, body) = answer;
    assert_eq!(
        (*got, body["code"].as_str()),
        (status, Some(code)),
        "{what}: {body}"
    );
}
