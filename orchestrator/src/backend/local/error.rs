//! The local backend's error: one enum wrapping each part's own error, plus the
//! backend-level failures (bad requests, a busy root, an agent that never answered,
//! a cleanup that left something behind).

use std::io;
use std::path::{Path, PathBuf};

use crate::backend::local::cgroup::CgroupError;
use crate::backend::local::network::NetworkError;
use crate::backend::local::process::ProcessError;
use crate::backend::local::rootfs::RootfsError;
use crate::backend::local::runc::RuncError;
use crate::backend::local::spec::SpecError;
use crate::backend::local::state::StateError;

/// Errors of the local backend.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The backend root could not be prepared.
    #[error("backend root {path}: {source}")]
    Root {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Another backend uses this root.
    #[error("another backend is using {0} (its lock is held)")]
    Busy(PathBuf),
    /// Another process of a shared root is creating or deleting this sandbox (its lock
    /// stayed held for `lock_wait`).
    #[error("sandbox {0} is being created or deleted by another process (its lock is held)")]
    SandboxBusy(String),
    /// The agent (or harness) could not be injected.
    #[error("preparing the injected volume: {0}")]
    Inject(#[from] orchard_injector::InjectError),
    /// A bad sandbox id.
    #[error("invalid sandbox id {0:?}: use 1-63 characters of a-z, 0-9, '-', '_', '.', starting with a letter or digit")]
    InvalidId(String),
    /// The id is taken.
    #[error("sandbox {0} already exists")]
    AlreadyExists(String),
    /// No such sandbox.
    #[error("no sandbox {0}")]
    NotFound(String),
    /// No such snapshot.
    #[error("no snapshot {0}")]
    SnapshotNotFound(String),
    /// Sandboxes forked from the snapshot still exist.
    #[error("snapshot {id} is in use by the sandboxes forked from it: {}; delete them first", forks.join(", "))]
    SnapshotInUse {
        /// The snapshot.
        id: String,
        /// Its forks.
        forks: Vec<String>,
    },
    /// A bad request (env, labels, limits, hostname).
    #[error("invalid sandbox request: {0}")]
    Invalid(String),
    /// Root filesystem.
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// Runtime config.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The runtime's files (`/etc/hosts` and the like).
    #[error(transparent)]
    RuntimeFiles(#[from] super::runtime_files::RuntimeFileError),
    /// The sandbox's size-limited filesystem.
    #[error(transparent)]
    Disk(#[from] super::disk::DiskError),
    /// runc.
    #[error(transparent)]
    Runc(#[from] RuncError),
    /// Network.
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// cgroups.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Host processes.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// State file.
    #[error(transparent)]
    State(#[from] StateError),
    /// No random bytes for a sandbox id, agent token or backend tag.
    #[error(transparent)]
    Random(#[from] crate::random::RandomError),
    /// The agent did not answer in time or died.
    #[error(
        "the agent of sandbox {id} did not become ready: {reason}\n--- agent/runc log ---\n{log}"
    )]
    NotReady {
        /// The sandbox.
        id: String,
        /// Why.
        reason: String,
        /// The end of its log.
        log: String,
    },
    /// Deleting left something behind.
    #[error("removing sandbox {id} left things behind: {}", problems.join("; "))]
    Cleanup {
        /// The sandbox.
        id: String,
        /// What was left.
        problems: Vec<String>,
    },
    /// Any other I/O error.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The task running the operation panicked or was cancelled.
    #[error("internal error: {0}")]
    Task(String),
    /// The backend is shutting down: it starts no more sandboxes.
    #[error("the backend is shutting down")]
    ShuttingDown,
}

pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> LocalError + 'a {
    move |source| LocalError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl From<super::limits::InvalidLimits> for LocalError {
    fn from(e: super::limits::InvalidLimits) -> Self {
        LocalError::Invalid(e.0)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::backend::BackendError;

    /// A local failure reaches the service as `Failed` with the local error, and the
    /// OS's error under it, as its cause; the message is the local error's own.
    #[test]
    fn a_local_failure_keeps_its_io_error() {
        let path = Path::new("/var/lib/orchard/sandboxes/sb-1");
        let local = io_err("removing", path)(io::Error::from(io::ErrorKind::PermissionDenied));
        let message = local.to_string();
        let e = BackendError::from(local);
        assert!(matches!(e, BackendError::Failed { .. }), "{e:?}");
        assert_eq!(e.to_string(), message);
        let local = e.source().and_then(|s| s.downcast_ref::<LocalError>());
        assert!(matches!(local, Some(LocalError::Io { .. })), "{local:?}");
        let io = local
            .and_then(|l| l.source())
            .and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(
            io.map(io::Error::kind),
            Some(io::ErrorKind::PermissionDenied)
        );
    }

    /// Each local error takes the kind the service decides on; the data kinds keep
    /// only their id, the others the local error as their cause.
    #[test]
    fn local_errors_map_to_backend_kinds() {
        let kind = |e: LocalError| {
            let b = BackendError::from(e);
            let caused = b.source().is_some_and(|s| s.is::<LocalError>());
            (b, caused)
        };
        assert!(matches!(
            kind(LocalError::NotFound("sb-1".into())),
            (BackendError::NotFound(id), false) if id == "sb-1"
        ));
        assert!(matches!(
            kind(LocalError::AlreadyExists("sb-1".into())),
            (BackendError::Exists(id), false) if id == "sb-1"
        ));
        assert!(matches!(
            kind(LocalError::SnapshotNotFound("snap-1".into())),
            (BackendError::NotFound(id), false) if id == "snap-1"
        ));
        let in_use = LocalError::SnapshotInUse {
            id: "snap-1".into(),
            forks: vec!["sb-2".into()],
        };
        assert!(matches!(
            kind(in_use),
            (BackendError::Conflict { .. }, true)
        ));
        assert!(matches!(
            kind(LocalError::InvalidId("-x".into())),
            (BackendError::Invalid { .. }, true)
        ));
        assert!(matches!(
            kind(LocalError::Invalid("cpus".into())),
            (BackendError::Invalid { .. }, true)
        ));
        assert!(matches!(
            kind(LocalError::SandboxBusy("sb-1".into())),
            (BackendError::Failed { .. }, true)
        ));
        assert!(matches!(
            kind(LocalError::ShuttingDown),
            (BackendError::Unavailable { .. }, true)
        ));
    }
}
