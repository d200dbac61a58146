//! Git operations on a repository inside the sandbox: status, diff, apply, commit and
//! reset.
//!
//! Every request names its repository with `repo`, the absolute path of the work tree
//! root (the directory that holds `.git`); a path that is not a repository is answered
//! with `not_found` ("no git repository at …"). Paths in answers are relative to that
//! root, with `/` separators, as git prints them. Commit-ish fields (`base`, `target`)
//! take anything `git rev-parse` does: a full or short commit id, a branch, a tag,
//! `HEAD~2`; an unknown one is answered with `invalid_argument`.
//!
//! The agent carries libgit2, so none of this needs a `git` binary in the image.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::route::{Body, Route};

fn yes() -> bool {
    true
}

/// Body of `POST /v1/git/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitStatusRequest {
    /// Absolute path of the repository's work tree.
    pub repo: String,
}

/// How a path differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GitFileStatus {
    /// New in the index (staged) or, unstaged, an intent-to-add entry.
    Added,
    /// Content or mode changed.
    Modified,
    /// Removed.
    Deleted,
    /// Moved, possibly with changes; `old_path` is where it was.
    Renamed,
    /// Changed kind (file, symbolic link, submodule).
    Typechange,
    /// In the work tree but not in the index, and not ignored.
    Untracked,
    /// Left with merge conflicts.
    Conflicted,
}

/// One changed path of [`GitStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitStatusEntry {
    /// Path relative to the work tree root.
    pub path: String,
    /// How it differs.
    pub status: GitFileStatus,
    /// True for a change between HEAD and the index (staged), false for one between
    /// the index and the work tree. A path changed in both is listed twice.
    pub staged: bool,
    /// Previous path of a rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
}

/// Answer of `POST /v1/git/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitStatus {
    /// Current branch (`main`), also when it has no commit yet; null when HEAD is
    /// detached.
    pub branch: Option<String>,
    /// Commit id of HEAD; null on a branch without commits.
    pub head: Option<String>,
    /// Changed, untracked and conflicted paths, sorted by path. Ignored files are not
    /// listed; untracked directories are listed file by file.
    pub entries: Vec<GitStatusEntry>,
    /// True when `entries` is empty.
    pub clean: bool,
}

/// Body of `POST /v1/git/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitDiffRequest {
    /// Absolute path of the repository's work tree.
    pub repo: String,
    /// Commit-ish (or tree-ish) to diff against; default `HEAD`. On a branch without
    /// commits the default is the empty tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Include files that are not tracked (and not ignored) as new files; default true.
    #[serde(default = "yes")]
    pub include_untracked: bool,
    /// Include binary files as `GIT binary patch` sections, so `git apply` can
    /// reproduce them; default true. When false they appear as
    /// `Binary files … differ`, which `git apply` refuses.
    #[serde(default = "yes")]
    pub binary: bool,
}

/// Answer of `POST /v1/git/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitDiff {
    /// The work tree's changes against the base as a unified git patch, equivalent to
    /// what `git add -A && git diff --cached --binary <base>` prints (renames, mode
    /// changes, new, deleted and binary files; the index and object store are not
    /// touched). `git apply` (and `git apply --index`) on a clean checkout of the base
    /// reproduces the work tree. Text files that are not UTF-8 are encoded as binary
    /// patches, so the patch is always valid UTF-8. Empty when nothing changed.
    pub patch: String,
    /// Files in the patch.
    pub files_changed: u64,
    /// Added lines of text files.
    pub insertions: u64,
    /// Removed lines of text files.
    pub deletions: u64,
}

/// Body of `POST /v1/git/apply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitApplyRequest {
    /// Absolute path of the repository's work tree.
    pub repo: String,
    /// A unified patch as `git diff` prints it (text hunks, `GIT binary patch`
    /// sections, renames, mode changes, new and deleted files).
    pub patch: String,
    /// Only check whether the patch applies; never write. Default false.
    #[serde(default)]
    pub check_only: bool,
    /// When the patch does not apply exactly, retry failing text hunks at a
    /// different line offset and with up to 2 mismatching context lines at each end
    /// of a hunk (like `patch`'s offset and fuzz). Default false.
    #[serde(default)]
    pub fuzzy: bool,
}

/// A hunk or file of a patch that does not apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitConflict {
    /// Path the failing part of the patch changes.
    pub path: String,
    /// Index of the failing hunk within the file's part of the patch, from 1; null
    /// when the file itself is the problem (missing, already exists, wrong binary
    /// preimage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hunk: Option<u32>,
    /// The hunk's range header, e.g. `@@ -12,7 +12,8 @@`; null with `hunk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Why it does not apply.
    pub reason: String,
}

/// Answer of `POST /v1/git/apply`.
///
/// A patch that does not apply is not an error: the answer is 200 with
/// `applied: false` and the conflicts, and the work tree is untouched (all or
/// nothing). A patch that cannot be parsed is `invalid_argument`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitApplyResult {
    /// True when the whole patch applied (with `check_only`: would apply). False
    /// means nothing was written.
    pub applied: bool,
    /// Paths the patch changes (new paths of renames), in patch order.
    pub files: Vec<String>,
    /// Paths whose hunks only applied with the fuzzy fallback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fuzzed: Vec<String>,
    /// Why the patch does not apply, per file and hunk; empty when it applied.
    pub conflicts: Vec<GitConflict>,
}

/// Body of `POST /v1/git/commit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitCommitRequest {
    /// Absolute path of the repository's work tree.
    pub repo: String,
    /// Commit message.
    pub message: String,
    /// Author and committer name; default `Orchard Agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_name: Option<String>,
    /// Author and committer email; default `agent@orchard.invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_email: Option<String>,
    /// Commit even when the tree equals HEAD's; default false, which answers
    /// `invalid_argument` ("nothing to commit").
    #[serde(default)]
    pub allow_empty: bool,
}

/// Answer of `POST /v1/git/commit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitCommitResult {
    /// Id of the new commit, now HEAD.
    pub commit: String,
    /// Files that differ from the parent commit (all files of a first commit).
    pub files_changed: u64,
}

/// Body of `POST /v1/git/reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitResetRequest {
    /// Absolute path of the repository's work tree.
    pub repo: String,
    /// Commit-ish to reset to; default `HEAD`. The current branch moves to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Also remove untracked files and directories (`git clean -fd`); default true.
    #[serde(default = "yes")]
    pub clean_untracked: bool,
    /// Keep ignored files when cleaning; default true. False also removes them
    /// (`git clean -fdx`). Nested repositories are always kept.
    #[serde(default = "yes")]
    pub keep_ignored: bool,
}

/// Answer of `POST /v1/git/reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitResetResult {
    /// Commit id of HEAD after the reset; null on a branch without commits.
    pub head: Option<String>,
    /// Untracked (and ignored) paths removed, directories with a trailing `/`.
    pub removed: Vec<String>,
}

fn schema<T: JsonSchema>(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    gen.subschema_for::<T>()
}

/// Routes of the git capability.
pub const GIT_ROUTES: &[Route] = &[
    Route {
        method: "POST",
        path: "/v1/git/status",
        summary: "Branch, HEAD and the changed, untracked and conflicted paths of a repository.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<GitStatusRequest>),
        response: Body::Json(schema::<GitStatus>),
    },
    Route {
        method: "POST",
        path: "/v1/git/diff",
        summary: "The work tree against HEAD or a commit as a patch `git apply` accepts.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<GitDiffRequest>),
        response: Body::Json(schema::<GitDiff>),
    },
    Route {
        method: "POST",
        path: "/v1/git/apply",
        summary: "Apply a patch to the work tree, all or nothing, with a conflict report.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<GitApplyRequest>),
        response: Body::Json(schema::<GitApplyResult>),
    },
    Route {
        method: "POST",
        path: "/v1/git/commit",
        summary: "Stage everything (`git add -A`) and commit it on HEAD.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<GitCommitRequest>),
        response: Body::Json(schema::<GitCommitResult>),
    },
    Route {
        method: "POST",
        path: "/v1/git/reset",
        summary: "Hard reset to a commit and remove untracked files.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<GitResetRequest>),
        response: Body::Json(schema::<GitResetResult>),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_fields() {
        let req: GitDiffRequest = serde_json::from_str(r#"{"repo": "/w"}"#).unwrap();
        assert!(req.include_untracked && req.binary && req.base.is_none());
        let req: GitResetRequest = serde_json::from_str(r#"{"repo": "/w"}"#).unwrap();
        assert!(req.clean_untracked && req.keep_ignored);
        let req: GitApplyRequest = serde_json::from_str(r#"{"repo": "/w", "patch": ""}"#).unwrap();
        assert!(!req.check_only && !req.fuzzy);
        assert!(serde_json::from_str::<GitStatusRequest>(r#"{"repo": "/w", "x": 1}"#).is_err());
        assert!(serde_json::from_str::<GitStatusRequest>("{}").is_err());
    }
}
