//! Wire types of stateful sandboxes on the orchestrator's `/v1/` API: pause and resume,
//! snapshots, and forks.
//!
//! - `POST /v1/sandboxes/{id}/pause` and `/resume` answer the sandbox ([`crate::sandbox::Sandbox`],
//!   `paused` set or cleared). A paused sandbox keeps its processes and memory and uses no
//!   CPU; its exec, file and other agent calls answer 409 until it is resumed.
//! - `POST /v1/sandboxes/{id}/snapshots` ([`SnapshotCreate`]) answers a [`Snapshot`]: the
//!   sandbox's filesystem changes and its environment state (image, environment, and each
//!   shell session's directory, exported variables and functions), immutable and
//!   content-addressed. The sandbox is frozen while it is captured and goes on unchanged.
//! - `GET /v1/snapshots` ([`SnapshotList`]), `GET` and `DELETE /v1/snapshots/{snapshot_id}`
//!   ([`SnapshotDeleted`]); a snapshot that running forks use cannot be deleted (409).
//! - `POST /v1/snapshots/{snapshot_id}/fork` ([`ForkRequest`]) starts `count` sandboxes from
//!   a snapshot and answers [`ForkResult`].
//!
//! Running processes are not captured: checkpointing process memory (CRIU) does not work
//! on every kernel. [`SnapshotCreate::processes`] is where a checkpointing backend will
//! be asked for them; today `true` is refused with 501 and every snapshot says
//! `"processes": "none"`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandbox::Sandbox;
use crate::session::SessionState;

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// Body of `POST /v1/sandboxes/{id}/snapshots` (an empty body is the default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreate {
    /// Free-form labels of the snapshot.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Also checkpoint running processes. Not available on this server (no working
    /// CRIU): `true` is answered 501. Forks start with no process but the agent and
    /// their restored shell sessions.
    #[serde(default)]
    pub processes: bool,
}

/// A snapshot as `/v1` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Snapshot {
    /// Its id, `snap-` and 20 hex digits of its digest: the same content, environment
    /// and labels give the same id.
    pub snapshot_id: String,
    /// `sha256:` digest of everything captured (the layers' content, the image, the
    /// environment, the sessions and the labels).
    pub digest: String,
    /// The sandbox it was taken of (which may be gone since).
    pub sandbox_id: String,
    /// The snapshot that sandbox was forked from, if any (its layers are this one's
    /// lower layers).
    pub parent_snapshot_id: Option<String>,
    /// The image the sandbox ran.
    pub image: String,
    /// ISO-8601 UTC.
    pub created_at: String,
    /// Bytes of the filesystem changes this snapshot captured (its own layer).
    pub size_bytes: u64,
    /// Bytes of all its layers, its parents' included.
    pub total_bytes: u64,
    /// Bytes of its `/tmp` (a tmpfs: in memory, so copied into each fork rather than
    /// shared; counted in `size_bytes`).
    pub tmp_bytes: u64,
    /// Layers on top of the image, bottom first (`sha256:` digests).
    pub layers: Vec<String>,
    /// The shell sessions forks get back: id, shell, directory, variables, functions.
    pub sessions: Vec<SessionState>,
    /// Running processes captured: always `none` here (see the module documentation).
    pub processes: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Sandboxes forked from it that still run; it cannot be deleted while any do.
    pub forks: Vec<String>,
    /// How long the sandbox was frozen for the capture, in milliseconds.
    pub frozen_ms: f64,
}

/// Answer of `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotList {
    /// The caller's snapshots, oldest first.
    pub snapshots: Vec<Snapshot>,
}

/// Answer of `DELETE /v1/snapshots/{snapshot_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotDeleted {
    /// The snapshot.
    pub snapshot_id: String,
    /// `deleted`.
    pub status: String,
    /// Disk bytes freed now (layers no other snapshot or sandbox uses).
    pub freed_bytes: u64,
}

/// Body of `POST /v1/snapshots/{snapshot_id}/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes to start (1-64, default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Labels of every fork.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Seconds each fork lives; default the server's (0: until deleted).
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Seconds allowed for readiness; default the server's.
    #[serde(default)]
    pub ready_timeout_s: Option<u64>,
    /// Answer once every fork is ready (default true), else at once with them pending.
    #[serde(default = "yes")]
    pub wait: bool,
}

impl Default for ForkRequest {
    fn default() -> Self {
        ForkRequest {
            count: 1,
            labels: BTreeMap::new(),
            ttl_s: None,
            ready_timeout_s: None,
            wait: true,
        }
    }
}

/// Answer of `POST /v1/snapshots/{snapshot_id}/fork`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ForkResult {
    /// The snapshot forked.
    pub snapshot_id: String,
    /// The new sandboxes, each as `POST /v1/sandboxes` answers it.
    pub sandboxes: Vec<Sandbox>,
}
