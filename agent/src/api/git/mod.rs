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
//! text fixed up for libgit2's parser, `partial`, libgit2's apply limited to some
//! deltas and hunks, `analyze`, which names the failing files and hunks, and `fuzz`,
//! the fuzzy fallback), `commit` and `reset`; `repo` holds the error type and what they
//! share: opening a repository and reading HEAD. This module holds the routes.

use std::path::PathBuf;

use axum::extract::FromRef;
use axum::routing::post;
use axum::{Json, Router};
use orchard_protocol::git::{
    GitApplyRequest, GitApplyResult, GitCommitRequest, GitCommitResult, GitDiff, GitDiffRequest,
    GitResetRequest, GitResetResult, GitStatus, GitStatusRequest,
};

use crate::api::extract::{BodyLimit, JsonBody};
use crate::error::{ApiError, ApiResult};

mod analyze;
mod apply;
mod commit;
mod diff;
mod fuzz;
mod normalize;
mod partial;
mod repo;
mod reset;
mod status;
#[cfg(test)]
mod tests;

pub use self::apply::apply;
pub use self::commit::commit;
pub use self::diff::{diff, diff_patch};
pub use self::fuzz::{fuzz_apply, HunkSpec, MAX_FUZZ};
pub use self::repo::GitError;
pub use self::reset::reset;
pub use self::status::status;

/// Author and committer name of commits that name none.
pub const DEFAULT_AUTHOR_NAME: &str = "Orchard Agent";
/// Author and committer email of commits that name none.
pub const DEFAULT_AUTHOR_EMAIL: &str = "agent@orchard.invalid";
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
