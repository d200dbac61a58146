//! Sandbox backends. [`local`] runs sandboxes on this machine with runc over overlayfs;
//! [`kubernetes`] runs each sandbox as a pod, its agent reached on the pod IP.
//!
//! [`Backend`] is what the server needs of one: create, delete, list, adopt what a
//! previous process left. Futures are boxed so the server can hold any backend as
//! `Arc<dyn Backend>` (tests wrap the local backend to inject failures).

#[cfg(test)]
pub mod fake;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
/// Built without the `kubernetes` feature: only the backend's settings, so its flags and
/// the file's `[kubernetes]` table parse as in every build, and choosing the backend is
/// refused with the feature's name (`crate::config`).
#[cfg(not(feature = "kubernetes"))]
pub mod kubernetes {
    pub mod config;
    pub use config::{KubeArgs, KubeConfig};
}
pub mod local;
pub mod offload;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::image::Image;

/// A boxed future of a backend call.
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + 'a>>;

/// The cause behind an error, of whatever type it has.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a backend. The variant is the kind the service and the server
/// decide on (`server/error.rs` maps each to its status); the message is what the
/// client reads; `source`, when the failure had a cause (the local backend's
/// `LocalError`, the Kubernetes backend's `KubeError`, an `io::Error`, a
/// task that ended early), is that cause itself, for logs and for callers that look
/// deeper. As in kube-rs, the message may quote its cause: walk `source()` for the type.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The sandbox does not exist.
    #[error("no sandbox {0}")]
    NotFound(String),
    /// The request cannot be satisfied (bad id, limits).
    #[error("{message}")]
    Invalid {
        /// What is wrong with it, as the client is told.
        message: String,
        /// The backend's own error, when it found the fault.
        #[source]
        source: Option<BoxError>,
    },
    /// The id is taken.
    #[error("sandbox {0} already exists")]
    Exists(String),
    /// The backend cannot answer this call now (e.g. it cannot list).
    #[error("{message}")]
    Unavailable {
        /// What it cannot do, as the client is told.
        message: String,
        /// Why, when something failed (an API call, a timeout).
        #[source]
        source: Option<BoxError>,
    },
    /// The sandbox or snapshot is not in a state for this call (a snapshot in use).
    #[error("{message}")]
    Conflict {
        /// What is in the way, as the client is told.
        message: String,
        /// The backend's own error, when it found the conflict.
        #[source]
        source: Option<BoxError>,
    },
    /// This backend cannot do this (snapshots on Kubernetes, process checkpoints):
    /// a fact about the backend, with no cause behind it.
    #[error("{0}")]
    Unsupported(String),
    /// Anything else.
    #[error("{message}")]
    Failed {
        /// What failed, as the client is told.
        message: String,
        /// The cause, when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

impl BackendError {
    /// [`BackendError::Invalid`] saying `message`, with no error behind it.
    pub fn invalid(message: impl Into<String>) -> Self {
        BackendError::Invalid {
            message: message.into(),
            source: None,
        }
    }

    /// [`BackendError::Invalid`] saying `message`, found by `source`.
    pub fn invalid_by(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BackendError::Invalid {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`BackendError::Unavailable`] saying `message`, with nothing failed behind it.
    pub fn unavailable(message: impl Into<String>) -> Self {
        BackendError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// [`BackendError::Unavailable`] saying `message`, caused by `source`.
    pub fn unavailable_by(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BackendError::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`BackendError::Conflict`] saying `message`, found by `source`.
    pub fn conflict_by(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BackendError::Conflict {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`BackendError::Failed`] saying `message`, with no error behind it.
    pub fn failed(message: impl Into<String>) -> Self {
        BackendError::Failed {
            message: message.into(),
            source: None,
        }
    }

    /// [`BackendError::Failed`] saying `message`, caused by `source`.
    pub fn failed_by(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BackendError::Failed {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// What to create: backend-neutral.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    /// Its id (the server picks it).
    pub id: String,
    /// The image.
    pub image: SandboxImage,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Allow egress.
    pub egress: bool,
    /// `KEY=value` added to the image's environment.
    pub env: Vec<String>,
    /// Labels recorded with the sandbox (the server keeps its own metadata here so a
    /// restarted server can rebuild its records).
    pub labels: BTreeMap<String, String>,
    /// Its lifetime, when it has one: a backend that can stop a sandbox by itself
    /// (Kubernetes' `activeDeadlineSeconds`) uses it as a backstop for a server that is
    /// gone; the server's policy loop deletes it on time otherwise.
    pub ttl: Option<Duration>,
    /// The snapshot to start from (a fork): its filesystem and image instead of `image`'s
    /// own, which names the same image.
    pub snapshot: Option<String>,
    /// Where the backend says what the create waits for while it waits.
    pub progress: StartProgress,
}

/// Where a backend reports, during a create, that the sandbox waits for capacity: the
/// service shows it on the pending sandbox (status `unschedulable`) and in the failure
/// when the readiness limit runs out. Only the Kubernetes backend reports (a pod no node
/// can take yet, which a node joining or freeing up lets start); the default sink
/// drops what it is told.
#[derive(Debug, Clone, Default)]
pub struct StartProgress(Option<Arc<tokio::sync::watch::Sender<Option<String>>>>);

impl StartProgress {
    /// A sink and what it says: `Some(reason)` while no node can take the sandbox.
    pub fn channel() -> (StartProgress, tokio::sync::watch::Receiver<Option<String>>) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (StartProgress(Some(Arc::new(tx))), rx)
    }

    /// No node can take the sandbox now, for `reason` (the scheduler's message). A
    /// repeat of the same reason wakes nobody.
    pub fn unschedulable(&self, reason: &str) {
        if let Some(tx) = &self.0 {
            tx.send_if_modified(|now| {
                let changed = now.as_deref() != Some(reason);
                if changed {
                    *now = Some(reason.to_string());
                }
                changed
            });
        }
    }

    /// A node took the sandbox (or it never waited for one).
    pub fn scheduled(&self) {
        if let Some(tx) = &self.0 {
            tx.send_if_modified(|now| now.take().is_some());
        }
    }
}

/// What to capture in a snapshot: backend-neutral.
#[derive(Debug, Clone, Default)]
pub struct SnapshotSpec {
    /// The sandbox.
    pub sandbox_id: String,
    /// The snapshot's labels (the server's own metadata included).
    pub labels: BTreeMap<String, String>,
    /// What forks are created with (the server's settings of the sandbox); part of the
    /// snapshot's digest.
    pub config: BTreeMap<String, String>,
    /// Its shell sessions, as the agent captured them.
    pub sessions: Vec<orchard_protocol::session::SessionState>,
}

/// A snapshot as a backend reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BackendSnapshot {
    /// `snap-` and 20 hex digits of the digest.
    pub id: String,
    /// `sha256:` of everything captured.
    pub digest: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The snapshot that sandbox was forked from.
    pub parent: Option<String>,
    /// The image reference.
    pub image: String,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// Bytes of its own layer.
    pub size_bytes: u64,
    /// Bytes of all its layers.
    pub total_bytes: u64,
    /// Its layers' digests, bottom first (`sha256:`).
    pub layers: Vec<String>,
    /// Labels as given.
    pub labels: BTreeMap<String, String>,
    /// The forks' settings as given.
    pub config: BTreeMap<String, String>,
    /// Shell sessions.
    pub sessions: Vec<orchard_protocol::session::SessionState>,
    /// The create's environment of the sandbox (`KEY=value`), which forks get.
    pub env: Vec<String>,
    /// How long the sandbox was frozen, ms.
    pub frozen_ms: f64,
    /// Sandboxes forked from it that still exist.
    #[serde(default)]
    pub forks: Vec<String>,
    /// Image layer directories it keeps in use (the image store must keep them).
    #[serde(default)]
    pub image_layers: Vec<PathBuf>,
    /// The sandbox's in-memory `/tmp` (a tmpfs), captured apart (`sha256:` digest):
    /// copied into each fork's own `/tmp`, since a tmpfs cannot share layers.
    #[serde(default)]
    pub tmp_layer: Option<String>,
    /// Bytes of that `/tmp` (also in `size_bytes`).
    #[serde(default)]
    pub tmp_bytes: u64,
}

/// The image of a sandbox, in the form its backend needs.
#[derive(Debug, Clone)]
pub enum SandboxImage {
    /// Pulled and unpacked by the server's image store (the local backend).
    Local(Image),
    /// Only its normalised reference (`docker.io/library/python:3.11-slim`): the backend
    /// pulls it (on Kubernetes, the kubelet).
    Reference(String),
}

impl SandboxImage {
    /// Its normalised reference.
    pub fn reference(&self) -> &str {
        match self {
            SandboxImage::Local(i) => &i.reference,
            SandboxImage::Reference(r) => r,
        }
    }
}

/// Whether `id` is a valid sandbox id: 1-63 characters of `a-z0-9-_.`, starting with a
/// letter or digit (a name every backend can use: a directory, a runc id, a pod name).
pub fn valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.')
        })
}

/// How a sandbox's agent is reached: what a backend hands back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentEndpoint {
    /// A Unix socket on this host (the local backend).
    Unix(PathBuf),
    /// `http://ip:port` (a pod IP on Kubernetes).
    Http(std::net::SocketAddr),
}

impl AgentEndpoint {
    /// The client's view of it.
    pub fn client(&self) -> orchard_client::Endpoint {
        match self {
            AgentEndpoint::Unix(p) => orchard_client::Endpoint::Unix(p.clone()),
            AgentEndpoint::Http(a) => orchard_client::Endpoint::Tcp(*a),
        }
    }

    /// Parses `http://ip:port` (a pod's agent URL), as the client does
    /// ([`orchard_client::Endpoint::parse_http_url`], the one parser of the form).
    pub fn parse_url(url: &str) -> Option<AgentEndpoint> {
        match orchard_client::Endpoint::parse_http_url(url)? {
            orchard_client::Endpoint::Tcp(addr) => Some(AgentEndpoint::Http(addr)),
            orchard_client::Endpoint::Unix(_) => None,
        }
    }

    /// The `/v1` wire form: `socket` or `url`, with the token.
    pub fn wire(&self, token: &str) -> orchard_protocol::sandbox::AgentEndpoint {
        let (socket, url) = match self {
            AgentEndpoint::Unix(p) => (Some(p.display().to_string()), None),
            AgentEndpoint::Http(_) => (None, Some(self.to_string())),
        };
        orchard_protocol::sandbox::AgentEndpoint {
            socket,
            url,
            token: token.to_string(),
        }
    }
}

/// `unix:PATH` or `http://ip:port`, as the client writes its endpoints (one printer of
/// the form, in the lower crate).
impl std::fmt::Display for AgentEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.client().fmt(f)
    }
}

/// A sandbox as a backend reports it.
#[derive(Debug, Clone)]
pub struct BackendSandbox {
    /// Its id.
    pub id: String,
    /// Its image reference.
    pub image: String,
    /// Creation time, ISO-8601 UTC.
    pub created_at: String,
    /// How its agent is reached.
    pub agent: AgentEndpoint,
    /// The agent's token.
    pub token: String,
    /// Whether its init is alive, as far as the backend can tell.
    pub liveness: Liveness,
    /// Labels given at create.
    pub labels: BTreeMap<String, String>,
}

/// Whether a sandbox's init is alive. Only positive evidence says `Stopped`; a check
/// that failed (out of descriptors, `EIO`, a time-out) is `Unknown`, and nothing is
/// failed or deleted on `Unknown` (issue 30: a descriptor flood made every read of
/// `/proc` fail, and reconciliation deleted every sandbox as dead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It runs.
    Running,
    /// It stopped: its init was reaped, is gone or a zombie, or the runtime says so.
    Stopped,
    /// The check itself failed; neither can be said.
    Unknown,
}

/// The most one sandbox can be given: the host's (or the largest node's) CPUs and
/// memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// CPU cores.
    pub cpus: f64,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

impl Capacity {
    /// This host: the CPUs this process may use and its physical memory.
    pub fn of_host() -> Option<Capacity> {
        let cpus = std::thread::available_parallelism().ok()?.get() as f64;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kb: u64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(Capacity {
            cpus,
            memory_bytes: kb * 1024,
        })
    }
}

/// CPU and memory: a node's size, what it lets pods have, or what pods request of it.
/// CPU is in millicores, as Kubernetes counts it, so that sums over thousands of pods
/// are exact (sums of fractional cores are not: `0.1 + 0.2`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    /// Thousandths of a CPU core.
    pub millicpus: u64,
    /// Bytes of memory.
    pub memory_bytes: u64,
}

impl Amount {
    /// CPU cores, as the API answers them.
    pub fn cores(&self) -> f64 {
        self.millicpus as f64 / 1000.0
    }

    /// Each figure the larger of the two.
    pub fn max(self, other: Amount) -> Amount {
        Amount {
            millicpus: self.millicpus.max(other.millicpus),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
        }
    }

    /// What is left of `self` once `used` is taken, each figure at least zero (a node
    /// may be asked more than it has).
    pub fn less(self, used: Amount) -> Amount {
        Amount {
            millicpus: self.millicpus.saturating_sub(used.millicpus),
            memory_bytes: self.memory_bytes.saturating_sub(used.memory_bytes),
        }
    }
}

impl std::ops::Add for Amount {
    type Output = Amount;
    fn add(self, other: Amount) -> Amount {
        Amount {
            millicpus: self.millicpus.saturating_add(other.millicpus),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }
}

impl std::ops::AddAssign for Amount {
    fn add_assign(&mut self, other: Amount) {
        *self = *self + other;
    }
}

/// One node of a cluster, as `GET /resources` and `/metrics` report it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCapacity {
    /// The node's name.
    pub name: String,
    /// Its whole size (Kubernetes' `status.capacity`).
    pub capacity: Amount,
    /// What pods may have of it: the capacity less what the system keeps
    /// (`status.allocatable`).
    pub allocatable: Amount,
    /// What the backend's own pods on it request (not other workloads': the backend
    /// says which pods it counts).
    pub requested: Amount,
}

/// The nodes of a cluster backend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterNodes {
    /// Every node, by name.
    pub nodes: Vec<NodeCapacity>,
    /// Why these figures are incomplete, when they are (the nodes cannot be read): the
    /// answer says so rather than passing zeros off as the cluster's size.
    pub incomplete: Option<String>,
}

/// A sandbox's writable disk, as far as its backend knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskRoom {
    /// The disk's size (the local backend's `--sandbox-disk`, a pod's ephemeral-storage
    /// limit).
    pub size: u64,
    /// Bytes free on it now, when the backend can tell (the local backend asks the
    /// sandbox's mounted image; a pod's usage is not known here).
    pub free: Option<u64>,
}

impl DiskRoom {
    /// Bytes a write into the sandbox can still take: what is free, else the size.
    pub fn room(&self) -> u64 {
        self.free.map_or(self.size, |f| f.min(self.size))
    }
}

/// What the server needs of a backend.
pub trait Backend: Send + Sync + 'static {
    /// Short name (`local`), reported as the compatible API's `namespace`.
    fn name(&self) -> &str;
    /// Whether the backend pulls images itself ([`SandboxImage::Reference`]); when
    /// not, the server pulls and unpacks them first ([`SandboxImage::Local`]).
    fn pulls_images(&self) -> bool {
        false
    }
    /// Creates a sandbox; returns once its agent answers. On failure nothing is left.
    fn create(&self, spec: CreateSpec) -> BackendFuture<'_, BackendSandbox>;
    /// Removes a sandbox and everything it holds.
    fn delete<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()>;
    /// Every sandbox; `Unavailable` when the backend cannot list now.
    fn list(&self) -> BackendFuture<'_, Vec<BackendSandbox>>;
    /// Adopts what a previous server process left; returns the ids adopted.
    fn recover(&self) -> BackendFuture<'_, Vec<String>>;
    /// Deletes every sandbox (shutdown).
    fn shutdown(&self) -> BackendFuture<'_, ()>;
    /// Stops without deleting the sandboxes (kept for the next start): lets creates in
    /// flight end and releases what is this process's alone. Nothing by default.
    fn release(&self) -> BackendFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    /// The most one sandbox can be given, when the backend knows; creates asking for
    /// more are lowered to it or refused up front, as [`Backend::clamps_to_capacity`]
    /// says.
    fn capacity(&self) -> Option<Capacity> {
        Capacity::of_host()
    }
    /// Whether a limit above [`Backend::capacity`] is lowered to it (the default: on one
    /// machine a limit is a ceiling, not a reservation, and a sandbox limited to 4 CPUs
    /// on a 2-CPU host behaves exactly like one limited to 2) rather than refused (a
    /// cluster, where the limit is also a request the scheduler places).
    fn clamps_to_capacity(&self) -> bool {
        true
    }
    /// The cluster's nodes with their capacity, allocatable and requested CPU and
    /// memory (`GET /resources`, `/metrics`), from what the backend keeps in memory (no
    /// API call per answer). `None`, the default: the backend's one node is this host,
    /// which the server reports itself.
    fn nodes(&self) -> Option<ClusterNodes> {
        None
    }
    /// The room on sandbox `id`'s writable disk, when its disk is bounded: what an
    /// upload into it may spool on the host (issue 30). `None`: unbounded or unknown.
    fn disk_room(&self, id: &str) -> Option<DiskRoom> {
        let _ = id;
        None
    }
    /// Freezes every process of a sandbox (its memory kept, no CPU used).
    fn pause<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        let _ = id;
        Box::pin(async move { Err(unsupported(self.name(), "pause")) })
    }
    /// Thaws a paused sandbox.
    fn resume<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        let _ = id;
        Box::pin(async move { Err(unsupported(self.name(), "resume")) })
    }
    /// Captures a sandbox's filesystem changes (frozen meanwhile) as a snapshot.
    fn snapshot(&self, spec: SnapshotSpec) -> BackendFuture<'_, BackendSnapshot> {
        let _ = spec;
        Box::pin(async move { Err(unsupported(self.name(), "snapshots")) })
    }
    /// Every snapshot.
    fn snapshots(&self) -> BackendFuture<'_, Vec<BackendSnapshot>> {
        Box::pin(async move { Ok(Vec::new()) })
    }
    /// Deletes a snapshot no sandbox was forked from (`Conflict` otherwise) and the
    /// layers nothing else uses; answers the bytes freed.
    fn delete_snapshot<'a>(&'a self, id: &'a str) -> BackendFuture<'a, u64> {
        Box::pin(async move { Err(BackendError::NotFound(id.to_string())) })
    }
}

/// The error of a call a backend does not have.
fn unsupported(backend: &str, what: &str) -> BackendError {
    BackendError::Unsupported(format!(
        "this server's backend ({backend}) does not support {what} yet (see docs/snapshots-kubernetes.md)"
    ))
}

#[cfg(test)]
mod tests {
    use super::AgentEndpoint;

    /// Parsing and printing are the client's (`orchard_client::Endpoint`); the forms
    /// stored, logged and answered stay what they were.
    #[test]
    fn agent_endpoints_parse_print_and_answer_in_the_clients_forms() {
        let http = AgentEndpoint::parse_url("http://10.1.2.3:7070/").unwrap();
        assert_eq!(http, AgentEndpoint::Http("10.1.2.3:7070".parse().unwrap()));
        assert_eq!(http.to_string(), "http://10.1.2.3:7070");
        assert_eq!(http.wire("t").url.as_deref(), Some("http://10.1.2.3:7070"));
        assert_eq!(AgentEndpoint::parse_url("unix:/run/a.sock"), None);
        assert_eq!(AgentEndpoint::parse_url("http://agent:7070"), None);
        let unix = AgentEndpoint::Unix("/run/a.sock".into());
        assert_eq!(unix.to_string(), "unix:/run/a.sock");
        let wire = unix.wire("t");
        assert_eq!(
            (wire.socket.as_deref(), wire.url),
            (Some("/run/a.sock"), None)
        );
        assert_eq!(
            serde_json::to_string(&http).unwrap(),
            r#"{"http":"10.1.2.3:7070"}"#
        );
    }
}
