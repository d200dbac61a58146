//! A backend for tests that need no root: a "sandbox" is the real agent library served
//! in this process, on a loopback TCP port (as a pod's agent is reached) or a Unix
//! socket (as the local backend's), running commands as the test's own user. Knobs make
//! it fail creates, hold creates until released, fail its list, or lose a sandbox, so
//! the service's every path can be driven without runc.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use orchard_agent::config::Config as AgentConfig;
use orchard_agent::proc::reaper::Reaper;

use super::{AgentEndpoint, Backend, BackendError, BackendFuture, BackendSandbox, CreateSpec};

/// One fake sandbox.
struct Sandbox {
    info: BackendSandbox,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The fake backend.
pub struct FakeBackend {
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    /// Agents listen on Unix sockets in this directory instead of TCP.
    unix_dir: Option<PathBuf>,
    /// Creates fail with this message.
    pub fail_creates: Mutex<Option<String>>,
    /// Creates wait for a permit of this semaphore (tests of pending sandboxes).
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
    /// `list` answers `Unavailable`.
    pub list_fails: AtomicBool,
    /// Creates made, in order.
    pub created: Mutex<Vec<CreateSpec>>,
    /// Deletes asked for, in order.
    pub deleted: Mutex<Vec<String>>,
    /// How many deletes were asked for: tests wait on it instead of sleeping.
    pub deletes: tokio::sync::watch::Sender<usize>,
    /// How many creates reached the backend.
    pub creates: tokio::sync::watch::Sender<usize>,
    /// Limits above the capacity are refused, as on a cluster, instead of lowered.
    pub refuses_over_capacity: bool,
    /// What `nodes` answers (a cluster's nodes; `None`, the default, as on one host).
    pub nodes: Mutex<Option<super::ClusterNodes>>,
}

impl FakeBackend {
    /// Agents on loopback TCP.
    pub fn tcp() -> FakeBackend {
        FakeBackend {
            sandboxes: Mutex::new(HashMap::new()),
            unix_dir: None,
            fail_creates: Mutex::new(None),
            gate: None,
            list_fails: AtomicBool::new(false),
            created: Mutex::new(Vec::new()),
            deleted: Mutex::new(Vec::new()),
            deletes: tokio::sync::watch::Sender::new(0),
            creates: tokio::sync::watch::Sender::new(0),
            refuses_over_capacity: false,
            nodes: Mutex::new(None),
        }
    }

    /// Agents on Unix sockets in `dir`.
    pub fn unix(dir: PathBuf) -> FakeBackend {
        FakeBackend {
            unix_dir: Some(dir),
            ..FakeBackend::tcp()
        }
    }

    /// Creates wait until `gate` gives a permit.
    pub fn gated(mut self, gate: Arc<tokio::sync::Semaphore>) -> FakeBackend {
        self.gate = Some(gate);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a sandbox stopped (its agent keeps answering), as a crashed init.
    pub fn stop(&self, id: &str) {
        self.set_liveness(id, crate::backend::Liveness::Stopped);
    }

    /// Sets what the list says of a sandbox's init (`Unknown`: as a failed read of
    /// `/proc` when the server is out of descriptors).
    pub fn set_liveness(&self, id: &str, liveness: crate::backend::Liveness) {
        if let Some(s) = self.lock().get_mut(id) {
            s.info.liveness = liveness;
        }
    }

    /// Loses a sandbox without a delete, as a node that went away.
    pub fn lose(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Ids of the sandboxes that exist.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Serves a real agent; answers how it is reached and its server task.
    async fn serve_agent(
        &self,
        id: &str,
        token: &str,
    ) -> Result<(AgentEndpoint, tokio::task::JoinHandle<()>), BackendError> {
        let failed = |e: std::io::Error| BackendError::failed_by(format!("fake agent: {e}"), e);
        let state = orchard_agent::server::AppState::new(
            AgentConfig::new(token),
            Arc::new(Reaper::only_registered()),
        );
        let app = orchard_agent::server::router(state);
        match &self.unix_dir {
            Some(dir) => {
                let path = dir.join(format!("{id}.sock"));
                let _ = std::fs::remove_file(&path);
                let listener = tokio::net::UnixListener::bind(&path).map_err(failed)?;
                let task = tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                });
                Ok((AgentEndpoint::Unix(path), task))
            }
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(failed)?;
                let addr = listener.local_addr().map_err(failed)?;
                let task = tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                });
                Ok((AgentEndpoint::Http(addr), task))
            }
        }
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &str {
        "fake"
    }

    fn create(&self, spec: CreateSpec) -> BackendFuture<'_, BackendSandbox> {
        Box::pin(async move {
            self.created
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(spec.clone());
            self.creates.send_modify(|n| *n += 1);
            if let Some(gate) = &self.gate {
                let permit = gate.acquire().await;
                permit
                    .map_err(|e| BackendError::failed_by(e.to_string(), e))?
                    .forget();
            }
            if let Some(m) = self
                .fail_creates
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            {
                return Err(BackendError::failed(m));
            }
            if self.lock().contains_key(&spec.id) {
                return Err(BackendError::Exists(spec.id));
            }
            let token =
                crate::random::hex(16).map_err(|e| BackendError::failed_by(e.to_string(), e))?;
            let (agent, server) = self.serve_agent(&spec.id, &token).await?;
            let info = BackendSandbox {
                id: spec.id.clone(),
                image: spec.image.reference().to_string(),
                created_at: crate::time::rfc3339(crate::time::now_ms()),
                agent,
                token,
                liveness: crate::backend::Liveness::Running,
                labels: spec.labels.clone(),
            };
            self.lock().insert(
                spec.id.clone(),
                Sandbox {
                    info: info.clone(),
                    server,
                },
            );
            Ok(info)
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            self.deleted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(id.to_string());
            self.lock().remove(id);
            self.deletes.send_modify(|n| *n += 1);
            Ok(())
        })
    }

    fn list(&self) -> BackendFuture<'_, Vec<BackendSandbox>> {
        Box::pin(async move {
            if self.list_fails.load(Ordering::Relaxed) {
                return Err(BackendError::unavailable("listing is switched off"));
            }
            Ok(self.lock().values().map(|s| s.info.clone()).collect())
        })
    }

    fn recover(&self) -> BackendFuture<'_, Vec<String>> {
        Box::pin(async move { Ok(self.ids()) })
    }

    fn shutdown(&self) -> BackendFuture<'_, ()> {
        Box::pin(async move {
            self.lock().clear();
            Ok(())
        })
    }

    fn clamps_to_capacity(&self) -> bool {
        !self.refuses_over_capacity
    }

    fn capacity(&self) -> Option<super::Capacity> {
        Some(super::Capacity {
            cpus: 64.0,
            memory_bytes: 256 << 30,
        })
    }

    fn nodes(&self) -> Option<super::ClusterNodes> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
