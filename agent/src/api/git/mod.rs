//! The git capability: status, diff, apply, commit and reset of a repository in the
//! sandbox, through libgit2 (vendored and linked statically), so the image needs no
//! `git` binary.
//!
//! - **diff** stages the work tree into an *in-memory* copy of the index (`git add -A`
//!   semantics: untracked, deleted, mode and type changes, ignore rules) and diffs the
//!   base tree against the tree of that index, with rename detection. Every object
//!   this writes goes to an in-memory object store (libgit2's mempack backend) layered
//!   over the repository's, so a diff never writes into `.git`, not even on a
//!   repository owned by someone else or mounted read-only. The result is equivalent
//!   to what `git add -A && git diff --cached --binary <base>` prints, and libgit2's
//!   few deviations that `git apply` refuses are fixed up (see `delta_text`).
//! - **apply** hands the patch to libgit2, which computes every post-image in memory
//!   before it writes anything, so a patch applies whole or not at all. When it does
//!   not apply, the deltas and hunks are re-checked one at a time to name the failing
//!   file and hunk. The opt-in fuzzy fallback re-places failing text hunks at another
//!   offset and with up to [`MAX_FUZZ`] mismatching context lines at each end, again
//!   computing everything before writing anything.
//! - **commit** is `git add -A` plus a commit on HEAD; **reset** is `git reset --hard`
//!   plus `git clean -fd` (or `-fdx`).
//!
//! libgit2 is blocking; every route runs its work on a blocking thread. libgit2 refuses
//! repositories owned by another uid by default (CVE-2022-24765 "safe.directory");
//! in a sandbox the agent runs as root next to a workspace owned by the user, and
//! every caller already holds the sandbox token, so that check is turned off once.
//!
//! One file per operation: `status`, `diff`, `apply` (with `normalize`, the patch
//! text fixed up for libgit2's parser, `analyze`, which names the failing files and
//! hunks, and `fuzz`, the fuzzy fallback), `commit` and `reset`. This module holds the
//! routes, the error type and what they share: opening a repository and reading HEAD.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Once;

use axum::extract::FromRef;
use axum::routing::post;
use axum::{Json, Router};
use git2::{Delta, Repository, RepositoryOpenFlags, Tree};
use orchard_protocol::git::{
    GitApplyRequest, GitApplyResult, GitCommitRequest, GitCommitResult, GitDiff, GitDiffRequest,
    GitResetRequest, GitResetResult, GitStatus, GitStatusRequest,
};
use orchard_protocol::ErrorCode;

use crate::api::extract::{BodyLimit, JsonBody};
use crate::error::{ApiError, ApiResult};

mod analyze;
mod apply;
mod commit;
mod diff;
mod fuzz;
mod normalize;
mod reset;
mod status;
#[cfg(test)]
mod tests;

pub use self::apply::apply;
pub use self::commit::commit;
pub use self::diff::{diff, diff_patch};
pub use self::fuzz::{fuzz_apply, HunkSpec};
pub use self::reset::reset;
pub use self::status::status;

/// Author and committer name of commits that name none.
pub const DEFAULT_AUTHOR_NAME: &str = "Orchard Agent";
/// Author and committer email of commits that name none.
pub const DEFAULT_AUTHOR_EMAIL: &str = "agent@orchard.invalid";
/// Most context lines the fuzzy fallback may ignore at each end of a hunk.
pub const MAX_FUZZ: usize = 2;
/// Priority of the in-memory object store; above libgit2's loose (1) and packed (2)
/// backends, so every object written while it is attached lands in memory.
const MEMPACK_PRIORITY: i32 = 1000;

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
fn git(what: &'static str) -> impl FnOnce(git2::Error) -> GitError {
    move |err| GitError::Git {
        what,
        message: err.message().to_string(),
    }
}

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> GitError + 'a {
    move |source| GitError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Routes of the git capability. It has no state of its own: a request names its
/// repository, and only the body limit applies.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route("/v1/git/status", post(status_route))
        .route("/v1/git/diff", post(diff_route))
        .route("/v1/git/apply", post(apply_route))
        .route("/v1/git/commit", post(commit_route))
        .route("/v1/git/reset", post(reset_route))
}

/// Runs `f` on a blocking thread and answers its result as JSON.
async fn blocking<T, F>(what: &'static str, f: F) -> ApiResult<Json<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, GitError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map(Json).map_err(ApiError::from),
        Err(_) => Err(GitError::Panicked(what).into()),
    }
}

/// Parses the `repo` field: an absolute path.
fn repo_path(raw: &str) -> Result<PathBuf, GitError> {
    if !raw.starts_with('/') || raw.contains('\0') {
        return Err(GitError::Invalid(format!(
            "repo must be the absolute path of a repository's work tree, got {raw:?}"
        )));
    }
    Ok(PathBuf::from(raw))
}

async fn status_route(JsonBody(req): JsonBody<GitStatusRequest>) -> ApiResult<Json<GitStatus>> {
    let repo = repo_path(&req.repo)?;
    blocking("status", move || status(&repo)).await
}

async fn diff_route(JsonBody(req): JsonBody<GitDiffRequest>) -> ApiResult<Json<GitDiff>> {
    let repo = repo_path(&req.repo)?;
    blocking("diff", move || {
        diff(
            &repo,
            req.base.as_deref(),
            req.include_untracked,
            req.binary,
        )
    })
    .await
}

async fn apply_route(JsonBody(req): JsonBody<GitApplyRequest>) -> ApiResult<Json<GitApplyResult>> {
    let repo = repo_path(&req.repo)?;
    blocking("apply", move || {
        apply(&repo, &req.patch, req.check_only, req.fuzzy)
    })
    .await
}

async fn commit_route(
    JsonBody(req): JsonBody<GitCommitRequest>,
) -> ApiResult<Json<GitCommitResult>> {
    let repo = repo_path(&req.repo)?;
    blocking("commit", move || {
        let name = req.author_name.as_deref().unwrap_or(DEFAULT_AUTHOR_NAME);
        let email = req.author_email.as_deref().unwrap_or(DEFAULT_AUTHOR_EMAIL);
        commit(&repo, &req.message, name, email, req.allow_empty)
    })
    .await
}

async fn reset_route(JsonBody(req): JsonBody<GitResetRequest>) -> ApiResult<Json<GitResetResult>> {
    let repo = repo_path(&req.repo)?;
    blocking("reset", move || {
        reset(
            &repo,
            req.target.as_deref(),
            req.clean_untracked,
            req.keep_ignored,
        )
    })
    .await
}

// ---------------------------------------------------------------------------------
// Opening

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
fn open(path: &Path) -> Result<Repository, GitError> {
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

fn workdir(repo: &Repository) -> Result<PathBuf, GitError> {
    repo.workdir()
        .map(Path::to_path_buf)
        .ok_or_else(|| GitError::Invalid("the repository has no work tree".into()))
}

/// The commit HEAD points at; `None` on a branch without commits.
fn head_commit(repo: &Repository) -> Result<Option<git2::Commit<'_>>, GitError> {
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
fn resolve_commit<'r>(repo: &'r Repository, spec: &str) -> Result<git2::Commit<'r>, GitError> {
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
fn base_tree<'r>(repo: &'r Repository, spec: Option<&str>) -> Result<Option<Tree<'r>>, GitError> {
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

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn delta_path(delta: &git2::DiffDelta<'_>) -> String {
    let file = if delta.status() == Delta::Deleted {
        delta.old_file()
    } else {
        delta.new_file()
    };
    file.path_bytes().map(lossy).unwrap_or_default()
}

/// Removes the now empty parent directories of `path`, up to the work tree root.
fn prune_empty_dirs(root: &Path, path: &Path) {
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == root || !d.starts_with(root) || fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}
