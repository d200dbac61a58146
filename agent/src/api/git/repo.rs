//! What the git operations share: the error type, opening a repository (libgit2's
//! owner check turned off once, see the module docs of [`super`]), reading HEAD and
//! resolving commit-ishes, and small helpers over libgit2's paths.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Once;

use git2::{Delta, Repository, RepositoryOpenFlags, Tree};
use orchard_protocol::ErrorCode;

use crate::error::ApiError;

/// Priority of the in-memory object store; above libgit2's loose (1) and packed (2)
/// backends, so every object written while it is attached lands in memory.
pub(super) const MEMPACK_PRIORITY: i32 = 1000;

/// What went wrong in a git operation.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The path is not the work tree (or `.git`) of a repository.
    #[error("no git repository at {0}")]
    NotARepo(String),
    /// A request field is unusable (relative path, bare repository, nothing to commit).
    #[error("{0}")]
    Invalid(String),
    /// A commit-ish does not name a commit (or tree).
    #[error("unknown commit-ish {spec:?}: {message}")]
    BadRevision {
        /// As given.
        spec: String,
        /// libgit2's explanation.
        message: String,
    },
    /// The patch cannot be parsed.
    #[error("malformed patch: {0}")]
    BadPatch(String),
    /// A file operation of the agent itself failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// The operation ("write", "remove").
        what: &'static str,
        /// The path it was done on.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// libgit2 failed.
    #[error("git {what} failed: {message}")]
    Git {
        /// The operation attempted.
        what: &'static str,
        /// libgit2's message: what it could not do, with paths, never internals.
        message: String,
    },
    /// The blocking task running the operation panicked.
    #[error("git {0} stopped unexpectedly")]
    Panicked(&'static str),
}

impl From<GitError> for ApiError {
    fn from(err: GitError) -> Self {
        match &err {
            GitError::NotARepo(_) => ApiError::new(ErrorCode::NotFound, err.to_string()),
            GitError::Invalid(_) | GitError::BadRevision { .. } | GitError::BadPatch(_) => {
                ApiError::invalid(err.to_string())
            }
            GitError::Io { what, path, source } => ApiError::io(what, path, source),
            GitError::Git { .. } | GitError::Panicked(_) => {
                ApiError::new(ErrorCode::Internal, err.to_string())
            }
        }
    }
}

/// Wraps a libgit2 error of operation `what`.
pub(super) fn git(what: &'static str) -> impl FnOnce(git2::Error) -> GitError {
    move |err| GitError::Git {
        what,
        message: err.message().to_string(),
    }
}

pub(super) fn io_error<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> GitError + 'a {
    move |source| GitError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Turns off libgit2's owner check, once per process (see the module docs).
fn allow_foreign_owners() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: libgit2 global options must not change while other threads use
        // libgit2; `Once` runs this before any repository is opened here, and no other
        // code of the agent uses libgit2.
        let _ = unsafe { git2::opts::set_verify_owner_validation(false) };
    });
}

/// Opens the repository whose work tree (or `.git` directory) is `path`. Parent
/// directories are not searched: patch and status paths are relative to the work
/// tree root, so the caller must name it.
pub(super) fn open(path: &Path) -> Result<Repository, GitError> {
    allow_foreign_owners();
    let shown = path.display().to_string();
    let repo = Repository::open_ext(
        path,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&OsStr>(),
    )
    .map_err(|err| {
        if err.code() == git2::ErrorCode::NotFound || !path.exists() {
            GitError::NotARepo(shown.clone())
        } else {
            git("open")(err)
        }
    })?;
    if repo.workdir().is_none() {
        return Err(GitError::Invalid(format!(
            "{shown} is a bare repository; these operations need a work tree"
        )));
    }
    Ok(repo)
}

pub(super) fn workdir(repo: &Repository) -> Result<PathBuf, GitError> {
    repo.workdir()
        .map(Path::to_path_buf)
        .ok_or_else(|| GitError::Invalid("the repository has no work tree".into()))
}

/// The commit HEAD points at; `None` on a branch without commits.
pub(super) fn head_commit(repo: &Repository) -> Result<Option<git2::Commit<'_>>, GitError> {
    match repo.head() {
        Ok(head) => head.peel_to_commit().map(Some).map_err(git("read HEAD")),
        Err(err)
            if matches!(
                err.code(),
                git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
            ) =>
        {
            Ok(None)
        }
        Err(err) => Err(git("read HEAD")(err)),
    }
}

/// Resolves a commit-ish to a commit.
pub(super) fn resolve_commit<'r>(
    repo: &'r Repository,
    spec: &str,
) -> Result<git2::Commit<'r>, GitError> {
    let bad = |err: git2::Error| GitError::BadRevision {
        spec: spec.to_string(),
        message: err.message().to_string(),
    };
    repo.revparse_single(spec)
        .map_err(bad)?
        .peel_to_commit()
        .map_err(bad)
}

/// The tree a diff starts from: `spec` (a commit-ish or tree-ish), HEAD's tree by
/// default, or `None` (the empty tree) on a branch without commits.
pub(super) fn base_tree<'r>(
    repo: &'r Repository,
    spec: Option<&str>,
) -> Result<Option<Tree<'r>>, GitError> {
    match spec {
        Some(spec) => {
            let bad = |err: git2::Error| GitError::BadRevision {
                spec: spec.to_string(),
                message: err.message().to_string(),
            };
            let object = repo.revparse_single(spec).map_err(bad)?;
            object.peel_to_tree().map(Some).map_err(bad)
        }
        None => match head_commit(repo)? {
            Some(commit) => commit.tree().map(Some).map_err(git("read HEAD")),
            None => Ok(None),
        },
    }
}

pub(super) fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(super) fn delta_path(delta: &git2::DiffDelta<'_>) -> String {
    let file = if delta.status() == Delta::Deleted {
        delta.old_file()
    } else {
        delta.new_file()
    };
    file.path_bytes().map(lossy).unwrap_or_default()
}

/// Removes the now empty parent directories of `path`, up to the work tree root.
pub(super) fn prune_empty_dirs(root: &Path, path: &Path) {
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == root || !d.starts_with(root) || fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}
