//! The state file of a sandbox, `<root>/sandboxes/<id>/state.json`: everything a later
//! backend on the same root needs to adopt the sandbox (its token, its processes) or to
//! clean it up (its cgroups, its phase). Written before anything is created, updated
//! at every step, replaced atomically (write + rename), readable by root only (it holds
//! the token).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::local::limits::Limits;
use crate::backend::local::network::NetworkMode;
use crate::backend::local::process::ProcRef;
use crate::backend::local::rootfs::ResolvedUser;

/// Version of the state file format.
pub const STATE_VERSION: u32 = 1;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be read or written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a state file of this version.
    #[error("state file {path} is unreadable: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// How far a sandbox got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Being created: a crash now leaves a half-created sandbox, removed on recovery.
    Creating,
    /// Its agent answered: adoptable after a restart.
    Running,
    /// Being deleted.
    Deleting,
}

/// The contents of `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxState {
    /// Format version.
    pub version: u32,
    /// Sandbox id.
    pub id: String,
    /// How far it got.
    pub phase: Phase,
    /// The agent's token.
    pub token: String,
    /// Image reference.
    pub image: String,
    /// Image manifest digest.
    pub image_digest: String,
    /// Creation time, milliseconds since the epoch.
    pub created_unix_ms: u64,
    /// Creation time, RFC 3339 (UTC).
    pub created_at: String,
    /// Limits in force.
    pub limits: Limits,
    /// Network mode.
    pub network: NetworkMode,
    /// Hostname.
    pub hostname: String,
    /// Caller's labels.
    pub labels: BTreeMap<String, String>,
    /// The image's user, resolved; the agent runs commands as this user.
    pub user: Option<ResolvedUser>,
    /// Name of its cgroups.
    pub cgroup_name: String,
    /// Its cgroup directories, as they were at creation.
    pub cgroup_dirs: Vec<PathBuf>,
    /// The container's init (the agent), once created.
    pub init: Option<ProcRef>,
    /// slirp4netns, when the sandbox has egress.
    pub slirp: Option<ProcRef>,
    /// What a snapshot of it needs to start forks: the create's environment, ...
    #[serde(default)]
    pub env: Vec<String>,
    /// ... the image's unpacked layers (bottom first) ...
    #[serde(default)]
    pub image_layers: Vec<PathBuf>,
    /// ... and its run config.
    #[serde(default)]
    pub image_config: crate::image::ImageConfig,
    /// The snapshot it was forked from (which cannot be deleted while it runs).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// That snapshot's layers (hex digests, bottom first), mounted above the image's.
    #[serde(default)]
    pub snapshot_layers: Vec<String>,
    /// Where the runtime's files (`/etc/hosts` and the like) are mounted, relative to
    /// the root: their mount points are the runtime's, which snapshots leave out.
    #[serde(default)]
    pub runtime_files: Vec<PathBuf>,
}

/// Writes `state` to `path` atomically, mode 0600.
pub fn save(path: &Path, state: &SandboxState) -> Result<(), StateError> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    crate::atomic_file::write_private(path, &bytes).map_err(|source| StateError::Io {
        op: "replacing",
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the state file at `path`.
pub fn load(path: &Path) -> Result<SandboxState, StateError> {
    let bytes = std::fs::read(path).map_err(|source| StateError::Io {
        op: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    let state: SandboxState = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(StateError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("version {} (expected {STATE_VERSION})", state.version),
        });
    }
    Ok(state)
}

pub use crate::time::{now_ms as now_unix_ms, rfc3339};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let state = SandboxState {
            version: STATE_VERSION,
            id: "sb-1".into(),
            phase: Phase::Creating,
            token: "secret".into(),
            image: "busybox".into(),
            image_digest: "sha256:00".into(),
            created_unix_ms: 1,
            created_at: rfc3339(1),
            limits: Limits::default(),
            network: NetworkMode::None,
            hostname: "sb-1".into(),
            labels: BTreeMap::from([("k".into(), "v".into())]),
            user: None,
            cgroup_name: "orchard-t-sb-1".into(),
            cgroup_dirs: vec![],
            init: Some(ProcRef {
                pid: 7,
                start_time: 9,
            }),
            slirp: None,
            env: vec!["A=1".into()],
            image_layers: vec![],
            image_config: Default::default(),
            snapshot: Some("snap-1".into()),
            snapshot_layers: vec!["ab".into()],
            runtime_files: vec!["etc/hosts".into()],
        };
        save(&path, &state).unwrap();
        assert_eq!(load(&path).unwrap(), state);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(load(&path), Err(StateError::Corrupt { .. })));
    }
}
