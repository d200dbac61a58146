//! Wire types of the orchestrator's own `/v1/` API: the sandbox lifecycle and images.
//! The agent routes of a sandbox are served under `/v1/sandboxes/{id}/` with the agent's
//! own types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn yes() -> bool {
    true
}

/// Body of `POST /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxCreate {
    /// Image reference (`python:3.11-slim`); pulled first when not in the store.
    pub image: String,
    /// The id to give it (1-63 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or
    /// digit); generated (`sb-` and 12 hex digits) when
    /// absent.
    #[serde(default)]
    pub id: Option<String>,
    /// CPU limit like `"2"` or `"500m"`.
    #[serde(default)]
    pub cpu: Option<String>,
    /// Memory limit like `"1Gi"` or `"512Mi"`.
    #[serde(default)]
    pub memory: Option<String>,
    /// Deny all egress (default true).
    #[serde(default = "yes")]
    pub block_network: bool,
    /// Seconds allowed for readiness; default the server's.
    #[serde(default)]
    pub ready_timeout_s: Option<u64>,
    /// Seconds the sandbox lives; default the server's (0: until deleted).
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Extra environment of every command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Answer once ready (default true), else at once with `status: "pending"`.
    #[serde(default = "yes")]
    pub wait: bool,
}

/// How to reach a sandbox's agent directly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentEndpoint {
    /// Unix socket path (local backend).
    pub socket: Option<String>,
    /// `http://ip:port` (cluster backends).
    pub url: Option<String>,
    /// Value of the `x-orchard-token` header.
    pub token: String,
}

/// A sandbox as `/v1` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Sandbox {
    /// Its id.
    pub id: String,
    /// The image as asked for.
    pub image: String,
    /// `pending`, `unschedulable` (pending, and no node can take it yet: it waits for
    /// one within its readiness limit), `running`, `paused` or `failed`.
    pub status: String,
    /// True once commands can run.
    pub ready: bool,
    /// Why it failed, why no node can take it (the scheduler's reason), or what its
    /// create has to say (limits lowered).
    pub status_message: Option<String>,
    /// ISO-8601 UTC.
    pub created_at: String,
    /// When it became ready.
    pub ready_at: Option<String>,
    /// When the TTL or the heartbeat period ends it, if ever.
    pub expires_at: Option<String>,
    /// Egress denied.
    pub block_network: bool,
    /// CPU limit as asked for.
    pub cpu: Option<String>,
    /// Memory limit as asked for.
    pub memory: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The agent's own endpoint and token; null until ready.
    pub agent: Option<AgentEndpoint>,
    /// Frozen (`POST /v1/sandboxes/{id}/pause`): its agent routes answer 409 until it
    /// is resumed.
    #[serde(default)]
    pub paused: bool,
}

/// Answer of `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxList {
    /// The caller's sandboxes, oldest first.
    pub sandboxes: Vec<Sandbox>,
}

/// Answer of `DELETE /v1/sandboxes/{id}` and `POST /v1/sandboxes/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxDone {
    /// The sandbox.
    pub id: String,
    /// `deleted` or `ok`.
    pub status: String,
    /// When it now expires (heartbeat), if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageInfo {
    /// Normalised reference.
    pub reference: String,
    /// Manifest digest.
    pub digest: String,
    /// Number of layers.
    pub layers: usize,
    /// Bytes of its unpacked layers (shared layers counted in full).
    pub size_bytes: u64,
}

/// Answer of `GET /v1/images` and `POST /v1/images/import`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageList {
    /// The images.
    pub images: Vec<ImageInfo>,
}

/// Body of `POST /v1/images/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// What to pull.
    pub reference: String,
}

/// One line of the NDJSON answer of `POST /v1/images/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PullEvent {
    /// Where the pull is.
    Progress {
        /// Normalised reference.
        reference: String,
        /// Layer digest this report is about.
        layer: String,
        /// Bytes of that layer received.
        layer_bytes_done: u64,
        /// Size of that layer.
        layer_bytes_total: u64,
        /// Layers complete.
        layers_done: usize,
        /// Layers in the image.
        layers_total: usize,
    },
    /// Finished; last line.
    Done {
        /// The image.
        image: ImageInfo,
    },
    /// Failed; last line.
    Error {
        /// Why.
        detail: String,
    },
}

/// Answer of `DELETE /v1/images`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageRemoved {
    /// The removed reference.
    pub reference: String,
    /// Always `deleted`.
    pub status: String,
}
