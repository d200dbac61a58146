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

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Once};

use axum::routing::post;
use axum::{Json, Router};
use git2::{
    ApplyLocation, ApplyOptions, Delta, Diff, DiffFindOptions, DiffOptions, IndexAddOption, Patch,
    Repository, RepositoryOpenFlags, RepositoryState, ResetType, Signature, Status, StatusOptions,
    Tree,
};
use orchard_protocol::git::{
    GitApplyRequest, GitApplyResult, GitCommitRequest, GitCommitResult, GitConflict, GitDiff,
    GitDiffRequest, GitFileStatus, GitResetRequest, GitResetResult, GitStatus, GitStatusEntry,
    GitStatusRequest,
};
use orchard_protocol::ErrorCode;

use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::state::AppState;

/// Author and committer name of commits that name none.
pub const DEFAULT_AUTHOR_NAME: &str = "Orchard Agent";
/// Author and committer email of commits that name none.
pub const DEFAULT_AUTHOR_EMAIL: &str = "agent@orchard.invalid";
/// Most context lines the fuzzy fallback may ignore at each end of a hunk.
pub const MAX_FUZZ: usize = 2;
/// Priority of the in-memory object store; above libgit2's loose (1) and packed (2)
/// backends, so every object written while it is attached lands in memory.
const MEMPACK_PRIORITY: i32 = 1000;
/// Prefix of the temporary files the fuzzy fallback writes before renaming them.
const TEMP_PREFIX: &str = ".orchard-git-";

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

/// Routes of the git capability.
pub fn routes() -> Router<Arc<AppState>> {
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

// ---------------------------------------------------------------------------------
// Status

/// Branch, HEAD and changed paths of the repository at `repo`.
pub fn status(repo: &Path) -> Result<GitStatus, GitError> {
    let repo = open(repo)?;
    let branch = match repo.find_reference("HEAD") {
        // Read without resolving: an unborn branch still has a name.
        Ok(head) => head
            .symbolic_target_bytes()
            .map(|target| lossy(target.strip_prefix(b"refs/heads/").unwrap_or(target))),
        Err(err) => return Err(git("read HEAD")(err)),
    };
    let head = head_commit(&repo)?.map(|c| c.id().to_string());
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .renames_head_to_index(true)
        .renames_index_to_workdir(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(git("status"))?;
    let mut entries = Vec::new();
    for entry in statuses.iter() {
        let s = entry.status();
        let path = lossy(entry.path_bytes());
        if s.is_conflicted() {
            entries.push(GitStatusEntry {
                path,
                status: GitFileStatus::Conflicted,
                staged: false,
                old_path: None,
            });
            continue;
        }
        let staged = [
            (Status::INDEX_NEW, GitFileStatus::Added),
            (Status::INDEX_MODIFIED, GitFileStatus::Modified),
            (Status::INDEX_DELETED, GitFileStatus::Deleted),
            (Status::INDEX_RENAMED, GitFileStatus::Renamed),
            (Status::INDEX_TYPECHANGE, GitFileStatus::Typechange),
        ];
        let unstaged = [
            (Status::WT_NEW, GitFileStatus::Untracked),
            (Status::WT_MODIFIED, GitFileStatus::Modified),
            (Status::WT_DELETED, GitFileStatus::Deleted),
            (Status::WT_RENAMED, GitFileStatus::Renamed),
            (Status::WT_TYPECHANGE, GitFileStatus::Typechange),
        ];
        for (is_staged, table, delta) in [
            (true, &staged, entry.head_to_index()),
            (false, &unstaged, entry.index_to_workdir()),
        ] {
            let Some(&(_, kind)) = table.iter().find(|(flag, _)| s.contains(*flag)) else {
                continue;
            };
            let (path, old_path) = match (&delta, kind) {
                (Some(delta), GitFileStatus::Renamed) => (
                    delta.new_file().path_bytes().map_or(path.clone(), lossy),
                    delta.old_file().path_bytes().map(lossy),
                ),
                _ => (path.clone(), None),
            };
            entries.push(GitStatusEntry {
                path,
                status: kind,
                staged: is_staged,
                old_path,
            });
        }
    }
    entries.sort_by(|a, b| (&a.path, !a.staged).cmp(&(&b.path, !b.staged)));
    Ok(GitStatus {
        branch,
        head,
        clean: entries.is_empty(),
        entries,
    })
}

// ---------------------------------------------------------------------------------
// Diff

/// The patch of the work tree of `repo` against `base` (default HEAD), untracked and
/// binary files included: what the diff route answers, for benchmarks.
pub fn diff_patch(repo: &Path, base: Option<&str>) -> Result<String, GitError> {
    diff(repo, base, true, true).map(|d| d.patch)
}

/// The work tree of `repo` against `base` (default HEAD; the empty tree on a branch
/// without commits) as a patch `git apply` accepts, with its statistics.
pub fn diff(
    repo: &Path,
    base: Option<&str>,
    include_untracked: bool,
    binary: bool,
) -> Result<GitDiff, GitError> {
    let repo = open(repo)?;
    let old = base_tree(&repo, base)?;
    let odb = repo.odb().map_err(git("diff"))?;
    // Blobs of changed files and the trees of the staged index land here, not in
    // `.git/objects`.
    let _mempack = odb
        .add_new_mempack_backend(MEMPACK_PRIORITY)
        .map_err(git("diff"))?;
    // The repository's index, changed in memory only: never written back.
    let mut index = repo.index().map_err(git("read the index"))?;
    stage_work_tree(&mut index, include_untracked)?;
    let tree_id = index.write_tree().map_err(git("stage the work tree"))?;
    let new = repo
        .find_tree(tree_id)
        .map_err(git("stage the work tree"))?;

    let mut opts = DiffOptions::new();
    opts.show_binary(binary);
    let mut diff = repo
        .diff_tree_to_tree(old.as_ref(), Some(&new), Some(&mut opts))
        .map_err(git("diff"))?;
    find_renames(&mut diff)?;
    let stats = diff.stats().map_err(git("diff"))?;
    let mut patch = Vec::new();
    for (i, delta) in diff.deltas().enumerate() {
        let Some(mut one) = Patch::from_diff(&diff, i).map_err(git("diff"))? else {
            continue;
        };
        let text = delta_text(&mut one, &delta)?;
        if std::str::from_utf8(&text).is_ok() {
            patch.extend_from_slice(&text);
        } else {
            // A text file that is not UTF-8 (Latin-1, say): encoded as a binary patch,
            // so the answer stays a JSON string and still applies byte for byte.
            patch.extend(forced_binary(&repo, old.as_ref(), &new, &delta, binary)?);
        }
    }
    let patch = match String::from_utf8(patch) {
        Ok(text) => text,
        // Only non-UTF-8 file names get here; they cannot travel in JSON exactly.
        Err(err) => lossy(err.as_bytes()),
    };
    Ok(GitDiff {
        patch,
        files_changed: stats.files_changed() as u64,
        insertions: stats.insertions() as u64,
        deletions: stats.deletions() as u64,
    })
}

/// The patch text of one delta, fixed up where libgit2's differs from git's in ways
/// `git apply` cares about.
fn delta_text(patch: &mut Patch<'_>, delta: &git2::DiffDelta<'_>) -> Result<Vec<u8>, GitError> {
    let mut text = patch.to_buf().map_err(git("diff"))?.to_vec();
    if delta.old_file().id() == delta.new_file().id() {
        drop_binary_notice(&mut text);
    }
    full_binary_ids(&mut text, delta.old_file().id(), delta.new_file().id());
    Ok(text)
}

/// Writes full object ids on the `index` line of a binary section, as `git diff
/// --binary` does: `git apply` checks the preimage against them and refuses a binary
/// patch with abbreviated ones.
fn full_binary_ids(text: &mut Vec<u8>, old: git2::Oid, new: git2::Oid) {
    const MARK: &[u8] = b"\nGIT binary patch\n";
    let Some(mark) = text.windows(MARK.len()).position(|w| w == MARK) else {
        return;
    };
    let header = &text[..mark + 1];
    let Some(start) = header
        .split_inclusive(|&b| b == b'\n')
        .scan(0, |at, line| {
            let here = *at;
            *at += line.len();
            Some((here, line))
        })
        .find(|(_, line)| line.starts_with(b"index "))
        .map(|(at, _)| at)
    else {
        return;
    };
    // "index <old>..<new>[ <mode>]": the ids end at the first space after "index ".
    let ids_start = start + b"index ".len();
    let ids_end = text[ids_start..]
        .iter()
        .position(|&b| b == b' ' || b == b'\n')
        .map_or(text.len(), |n| ids_start + n);
    text.splice(ids_start..ids_end, format!("{old}..{new}").into_bytes());
}

/// Removes the `Binary files … differ` line libgit2 prints for a binary file whose
/// content did not change (a pure rename or mode change): there is nothing to patch,
/// and `git apply` refuses the line.
fn drop_binary_notice(text: &mut Vec<u8>) {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let start = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if body[start..].starts_with(b"Binary files ") {
        text.truncate(start);
    }
}

/// `git add -A` (`git add -u` without `include_untracked`) on `index`, in memory.
fn stage_work_tree(index: &mut git2::Index, include_untracked: bool) -> Result<(), GitError> {
    let everything = std::iter::empty::<&str>();
    if include_untracked {
        // One pass over the work tree: adds new and changed files, drops deleted ones.
        index.add_all(everything, IndexAddOption::DEFAULT, None)
    } else {
        index.update_all(everything, None)
    }
    .map_err(git("stage the work tree"))?;
    if index.has_conflicts() {
        return Err(GitError::Invalid(
            "the index has unresolved conflicts; resolve or reset them first".into(),
        ));
    }
    Ok(())
}

fn find_renames(diff: &mut Diff<'_>) -> Result<(), GitError> {
    let mut find = DiffFindOptions::new();
    find.renames(true);
    diff.find_similar(Some(&mut find)).map_err(git("diff"))
}

/// The patch of one delta's paths with their content treated as binary.
fn forced_binary(
    repo: &Repository,
    old: Option<&Tree<'_>>,
    new: &Tree<'_>,
    delta: &git2::DiffDelta<'_>,
    binary: bool,
) -> Result<Vec<u8>, GitError> {
    let mut opts = DiffOptions::new();
    opts.show_binary(binary)
        .force_binary(true)
        .disable_pathspec_match(true);
    for file in [delta.old_file(), delta.new_file()] {
        if let Some(path) = file.path_bytes() {
            opts.pathspec(path);
        }
    }
    let mut diff = repo
        .diff_tree_to_tree(old, Some(new), Some(&mut opts))
        .map_err(git("diff"))?;
    find_renames(&mut diff)?;
    let mut out = Vec::new();
    for (i, delta) in diff.deltas().enumerate() {
        if let Some(mut one) = Patch::from_diff(&diff, i).map_err(git("diff"))? {
            out.extend(delta_text(&mut one, &delta)?);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------
// Apply

/// Applies `patch` to the work tree of `repo`, all or nothing. A patch that does not
/// apply is answered with `applied: false` and the conflicts, not as an error.
pub fn apply(
    repo: &Path,
    patch: &str,
    check_only: bool,
    fuzzy: bool,
) -> Result<GitApplyResult, GitError> {
    let repo = open(repo)?;
    let root = workdir(&repo)?;
    // libgit2 reads the patch's paths as C strings: a NUL inside a header line cut
    // one short and left a delta with no new path, which its apply then passed to
    // strcmp (a segfault, found by fuzzing). Git never prints a NUL in a patch: text
    // with one is binary and travels as a `GIT binary patch`, in base85.
    if let Some(at) = patch.find('\0') {
        return Err(GitError::BadPatch(format!(
            "it contains a NUL byte (at byte {at}); binary content travels as a GIT binary patch"
        )));
    }
    let patch = normalize_patch(patch);
    let diff = Diff::from_buffer(patch.as_bytes())
        .map_err(|err| GitError::BadPatch(err.message().to_string()))?;
    let count = diff.deltas().len();
    if count == 0 {
        return Err(GitError::BadPatch("it changes no file".into()));
    }
    check_modes(&diff)?;
    check_paths(&diff)?;
    check_binary_data(&diff)?;
    // libgit2 writes every post-image as a blob before checking it out, also in check
    // mode; they stay in memory.
    let odb = repo.odb().map_err(git("apply"))?;
    let _mempack = odb
        .add_new_mempack_backend(MEMPACK_PRIORITY)
        .map_err(git("apply"))?;
    let files: Vec<String> = diff.deltas().map(|d| delta_path(&d)).collect();
    let result = |applied, fuzzed, conflicts| GitApplyResult {
        applied,
        files: files.clone(),
        fuzzed,
        conflicts,
    };

    // libgit2's check mode stops before the checkout, which is where a new file that
    // already exists would be refused; that one is checked here. So are paths beyond
    // a symbolic link, which libgit2 would write through.
    let mut existing = existing_targets(&diff, &root);
    for (i, conflict) in beyond_links(&diff, &root) {
        existing.entry(i).or_insert(conflict);
    }
    let whole_error = if existing.is_empty() {
        let all = |_| true;
        let applied = if check_only {
            run_apply(&repo, &diff, &all, None, true)
        } else {
            write_apply(&repo, &root, &diff, &all)
        };
        match applied {
            Ok(()) => return Ok(result(true, Vec::new(), Vec::new())),
            Err(err) => Some(err),
        }
    } else {
        None
    };

    let analysis = analyze(&repo, &diff, &existing)?;
    if analysis.conflicts.is_empty() {
        // Every part applies on its own and together in check mode, yet the real
        // apply failed: the checkout itself (I/O, a lock), not the patch.
        let message = whole_error.map_or_else(String::new, |e| e.message().to_string());
        return Err(GitError::Git {
            what: "apply",
            message,
        });
    }
    if !fuzzy {
        let conflicts = analysis.conflicts.into_iter().map(|(_, c)| c).collect();
        return Ok(result(false, Vec::new(), conflicts));
    }
    apply_fuzzy(&repo, &root, &diff, analysis, check_only)
        .map(|(applied, fuzzed, conflicts)| result(applied, fuzzed, conflicts))
}

/// Rewrites what libgit2's patch parser cannot read in patches git (and libgit2's own
/// diff) print, without changing their meaning:
///
/// - `diff --git a/x y b/x y`: git leaves names with spaces unquoted there; the parser
///   then cannot split the line and needs `---`/`+++` or rename lines for the paths,
///   which binary, mode-only and empty-file sections lack. The paths get quoted, split
///   by git's own rule: both halves name the same path after their prefix. Rename and
///   copy paths with spaces are quoted too: the parser stops at a space there.
/// - The extended header lines are put in git's order (libgit2 prints a rename's
///   mode change after the rename lines, and then cannot parse it back).
/// - A new or deleted empty file is a header ending in its `index` line; the parser
///   wants more after it, so the `---`/`+++` lines are added.
fn normalize_patch(patch: &str) -> String {
    const HEADER: &str = "diff --git ";
    // Extended header lines in the order git prints them.
    const EXTENDED: &[(&str, u8)] = &[
        ("old mode ", 0),
        ("new mode ", 1),
        ("deleted file mode ", 2),
        ("new file mode ", 2),
        ("similarity index ", 3),
        ("dissimilarity index ", 3),
        ("rename from ", 4),
        ("copy from ", 4),
        ("rename to ", 5),
        ("copy to ", 5),
        ("index ", 6),
    ];
    let rank = |line: &str| {
        EXTENDED
            .iter()
            .find(|(key, _)| line.starts_with(key))
            .map(|&(_, rank)| rank)
    };
    let lines: Vec<&str> = patch.split_inclusive('\n').collect();
    let mut out = String::with_capacity(patch.len() + 256);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(rest) = line.strip_prefix(HEADER) else {
            out.push_str(line);
            continue;
        };
        let body = rest.trim_end_matches(['\n', '\r']);
        let paths = split_header_paths(body);
        match &paths {
            Some((left, right)) => {
                out.push_str(HEADER);
                out.push_str(left);
                out.push(' ');
                out.push_str(right);
                out.push_str(&rest[body.len()..]);
            }
            None => out.push_str(line),
        }
        let mut extended: Vec<(u8, String)> = Vec::new();
        while let Some(rank) = lines.get(i).and_then(|l| rank(l)) {
            let mut line = lines[i].to_string();
            i += 1;
            if !line.ends_with('\n') {
                line.push('\n');
            }
            if let Some(key) = ["rename from ", "rename to ", "copy from ", "copy to "]
                .into_iter()
                .find(|key| line.starts_with(key))
            {
                let path = line[key.len()..].trim_end_matches(['\n', '\r']);
                if path.contains(' ') && !path.starts_with('"') {
                    line = format!("{key}{}{}", c_quote(path), &line[key.len() + path.len()..]);
                }
            }
            extended.push((rank, line));
        }
        // Stable: equal ranks keep their order.
        extended.sort_by_key(|(rank, _)| *rank);
        let creates = extended.iter().find_map(|(_, l)| {
            if l.starts_with("new file mode ") {
                Some(true)
            } else if l.starts_with("deleted file mode ") {
                Some(false)
            } else {
                None
            }
        });
        let has_index = extended.iter().any(|(_, l)| l.starts_with("index "));
        for (_, l) in &extended {
            out.push_str(l);
        }
        let section_ends = lines.get(i).is_none_or(|next| next.starts_with(HEADER));
        if let (true, true, Some(creates), Some((left, right))) =
            (section_ends, has_index, creates, &paths)
        {
            let (old, new) = if creates {
                ("/dev/null", right.as_str())
            } else {
                (left.as_str(), "/dev/null")
            };
            out.push_str(&format!("--- {old}\n+++ {new}\n"));
        }
    }
    out
}

/// The two paths of a `diff --git` line (after the prefix), quoted when they hold a
/// space; `None` when the line cannot be split unambiguously.
fn split_header_paths(body: &str) -> Option<(String, String)> {
    if let Some(quoted) = body.strip_prefix('"') {
        // C-quoted by git already: the first token ends at an unescaped quote.
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| {
            let close = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            close.then_some(i)
        })?;
        let left = &body[..end + 2];
        let right = body[end + 2..].strip_prefix(' ')?;
        return Some((left.to_string(), right.to_string()));
    }
    if !body.contains(' ') {
        return None;
    }
    if body.matches(' ').count() == 1 {
        let (left, right) = body.split_once(' ')?;
        return Some((left.to_string(), right.to_string()));
    }
    if body.ends_with('"') {
        // Plain old path, quoted new path.
        let start = body.rfind(" \"")?;
        return Some((body[..start].to_string(), body[start + 1..].to_string()));
    }
    let half = body.len().checked_sub(1)? / 2;
    let (left, right) = (body.get(..half)?, body.get(half + 1..)?);
    let same = body.as_bytes().get(half) == Some(&b' ')
        && left.split_once('/').map(|(_, p)| p) == right.split_once('/').map(|(_, p)| p);
    same.then(|| (c_quote(left), c_quote(right)))
}

/// Quotes a path the way git does for names it must quote (only `"` and `\\` need
/// escaping here: names with control characters arrive quoted already).
fn c_quote(path: &str) -> String {
    format!("\"{}\"", path.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Runs libgit2's apply on the work tree for the deltas `deltas` selects and, when
/// given, only the hunks (0-based, per delta) `hunks` selects.
fn run_apply(
    repo: &Repository,
    diff: &Diff<'_>,
    deltas: &dyn Fn(usize) -> bool,
    hunks: Option<&dyn Fn(usize) -> bool>,
    check: bool,
) -> Result<(), git2::Error> {
    // libgit2 calls back in delta order, each delta's hunks right after it.
    let (next_delta, next_hunk) = (&Cell::new(0usize), &Cell::new(0usize));
    // Built and used in place: the options hold a pointer to themselves for the
    // callbacks, so they must not move after the callbacks are set.
    let mut opts = ApplyOptions::new();
    opts.check(check);
    opts.delta_callback(move |_| {
        let i = next_delta.get();
        next_delta.set(i + 1);
        next_hunk.set(0);
        deltas(i)
    });
    if let Some(hunks) = hunks {
        opts.hunk_callback(move |_| {
            let i = next_hunk.get();
            next_hunk.set(i + 1);
            hunks(i)
        });
    }
    repo.apply(diff, ApplyLocation::WorkDir, Some(&mut opts))
}

/// Applies the selected deltas for real. A pure rename carries no mode in the patch
/// and libgit2 then writes the new path as a plain 0644 file; the renamed file keeps
/// its permissions here, as with `git apply`.
fn write_apply(
    repo: &Repository,
    root: &Path,
    diff: &Diff<'_>,
    deltas: &dyn Fn(usize) -> bool,
) -> Result<(), git2::Error> {
    let mut keep = Vec::new();
    for (i, delta) in diff.deltas().enumerate() {
        let modeless = u32::from(delta.new_file().mode()) == 0
            && matches!(delta.status(), Delta::Renamed | Delta::Copied);
        let (Some(old), Some(new)) = (delta.old_file().path(), delta.new_file().path()) else {
            continue;
        };
        if !modeless || !deltas(i) {
            continue;
        }
        if let Ok(meta) = fs::symlink_metadata(root.join(old)) {
            if meta.is_file() {
                keep.push((root.join(new), meta.permissions()));
            }
        }
    }
    run_apply(repo, diff, deltas, None, false)?;
    for (path, permissions) in keep {
        // Best effort: the content is in place, and a failure here is a race with
        // someone changing the file.
        let _ = fs::set_permissions(path, permissions);
    }
    Ok(())
}

/// Deltas that create a path (new file, rename target) that already exists in the
/// work tree and that no earlier delta of the patch removes, with their conflict.
fn existing_targets(diff: &Diff<'_>, root: &Path) -> BTreeMap<usize, GitConflict> {
    let mut freed = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (i, delta) in diff.deltas().enumerate() {
        let old = delta.old_file().path_bytes().map(lossy);
        let new = delta.new_file().path_bytes().map(lossy);
        if matches!(delta.status(), Delta::Deleted | Delta::Renamed) {
            if let Some(old) = &old {
                freed.insert(old.clone());
            }
        }
        if !matches!(
            delta.status(),
            Delta::Added | Delta::Renamed | Delta::Copied
        ) {
            continue;
        }
        let Some(new) = new else { continue };
        if freed.contains(&new) {
            continue;
        }
        if fs::symlink_metadata(root.join(&new)).is_ok() {
            out.insert(
                i,
                GitConflict {
                    path: new,
                    hunk: None,
                    header: None,
                    reason: "already exists in the working directory".into(),
                },
            );
        }
    }
    out
}

/// Deltas with a path (old or new) that leaves the work tree: through a symbolic link
/// in the work tree, or by a `..` or absolute component. libgit2 writes through a
/// linked parent directory (a new `out/x` with `out -> ../elsewhere` lands in
/// `../elsewhere/x`), so these are conflicts, as `git apply` refuses a path "beyond a
/// symbolic link". The last component may be a link: a patch changes the link itself.
fn beyond_links(diff: &Diff<'_>, root: &Path) -> BTreeMap<usize, GitConflict> {
    let mut out = BTreeMap::new();
    for (i, delta) in diff.deltas().enumerate() {
        for file in [delta.old_file(), delta.new_file()] {
            let Some(path) = file.path() else { continue };
            if let Some(reason) = escape_reason(root, path) {
                out.entry(i).or_insert(GitConflict {
                    path: path.to_string_lossy().into_owned(),
                    hunk: None,
                    header: None,
                    reason,
                });
            }
        }
    }
    out
}

/// Why `rel` leaves the work tree `root`, if it does.
fn escape_reason(root: &Path, rel: &Path) -> Option<String> {
    let parts: Vec<Component<'_>> = rel.components().collect();
    let mut dir = root.to_path_buf();
    for (n, part) in parts.iter().enumerate() {
        let Component::Normal(name) = part else {
            return Some("the path is not inside the working directory".into());
        };
        if n + 1 == parts.len() {
            break;
        }
        dir.push(name);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let shown = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
                return Some(format!("it is beyond a symbolic link ({shown})"));
            }
            Ok(_) => {}
            // Missing: the apply creates it as a directory.
            Err(_) => return None,
        }
    }
    None
}

/// File modes git writes (and `0`: no file on that side).
const KNOWN_MODES: [u32; 7] = [
    0, 0o040000, 0o100644, 0o100664, 0o100755, 0o120000, 0o160000,
];

/// Refuses a patch with a file mode git does not know. libgit2's parser takes any octal
/// number, and git2's `DiffFile::mode` panics on one it does not know (`new file mode
/// 120644` made the apply route answer 500).
fn check_modes(diff: &Diff<'_>) -> Result<(), GitError> {
    for delta in diff.deltas() {
        for file in [delta.old_file(), delta.new_file()] {
            // SAFETY: `raw` points at the `git_diff_file` that `file` borrows from the
            // diff, alive and unchanged while `diff` is.
            let mode = u32::from(unsafe { (*git2::Binding::raw(&file)).mode });
            if !KNOWN_MODES.contains(&mode) {
                return Err(GitError::BadPatch(format!(
                    "{}: unknown file mode {mode:o}",
                    delta_path(&delta)
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a delta without an old or a new path. libgit2's parser gives both to every
/// delta it reads from a well-formed patch (the same path twice for an added or a
/// deleted file), and its apply compares them without checking for none.
fn check_paths(diff: &Diff<'_>) -> Result<(), GitError> {
    for delta in diff.deltas() {
        if delta.old_file().path_bytes().is_none() || delta.new_file().path_bytes().is_none() {
            return Err(GitError::BadPatch(format!(
                "{}: a file header without both paths",
                delta_path(&delta)
            )));
        }
    }
    Ok(())
}

/// Refuses a binary hunk whose zlib data does not inflate to exactly its stated size.
/// libgit2 (1.9) loops forever, never returning, on zlib data that ends early
/// (libgit2 issue #7342): the data is inflated here first, with a bounded output.
fn check_binary_data(diff: &Diff<'_>) -> Result<(), GitError> {
    let mut problem = None;
    let mut check = |delta: git2::DiffDelta<'_>, binary: git2::DiffBinary<'_>| {
        for (side, file) in [("old", binary.old_file()), ("new", binary.new_file())] {
            if matches!(file.kind(), git2::DiffBinaryKind::None) {
                continue;
            }
            if let Err(reason) = inflate_exactly(file.data(), file.inflated_len()) {
                problem = Some(format!(
                    "the binary {side} data of {}: {reason}",
                    delta_path(&delta)
                ));
                return false;
            }
        }
        true
    };
    let walked = diff.foreach(&mut |_, _| true, Some(&mut check), None, None);
    if let Some(problem) = problem {
        return Err(GitError::BadPatch(problem));
    }
    walked.map_err(|err| GitError::BadPatch(err.message().to_string()))
}

/// Inflates zlib `data` into nothing, failing unless it ends within `data` and makes
/// exactly `len` bytes.
fn inflate_exactly(data: &[u8], len: usize) -> Result<(), String> {
    let mut inflater = flate2::Decompress::new(true);
    let mut sink = vec![0u8; 64 * 1024];
    loop {
        let (read, made) = (inflater.total_in(), inflater.total_out());
        let rest = data.get(read as usize..).unwrap_or_default();
        let status = inflater
            .decompress(rest, &mut sink, flate2::FlushDecompress::Finish)
            .map_err(|err| format!("it is not valid zlib data ({err})"))?;
        if inflater.total_out() > len as u64 {
            return Err(format!("it inflates to more than the stated {len} bytes"));
        }
        match status {
            flate2::Status::StreamEnd => break,
            _ if inflater.total_in() == read && inflater.total_out() == made => {
                return Err("its zlib data ends early".into())
            }
            _ => {}
        }
    }
    if inflater.total_out() != len as u64 {
        return Err(format!(
            "it inflates to {} bytes, not the stated {len}",
            inflater.total_out()
        ));
    }
    Ok(())
}

/// Why a patch does not apply.
struct Analysis {
    /// Conflicts with the index of the delta each belongs to, in patch order.
    conflicts: Vec<(usize, GitConflict)>,
    /// Deltas that fail, alone or with the others touching the same paths.
    failing: BTreeSet<usize>,
    /// Deltas that share a path with another delta.
    grouped: BTreeSet<usize>,
}

/// Finds the files and hunks of a patch that do not apply. Deltas that touch the same
/// path (a type change is a deletion plus an addition) are checked together, then
/// the deltas of a failing group alone, then each hunk of a failing delta alone.
fn analyze(
    repo: &Repository,
    diff: &Diff<'_>,
    existing: &BTreeMap<usize, GitConflict>,
) -> Result<Analysis, GitError> {
    let groups = path_groups(diff);
    let mut analysis = Analysis {
        conflicts: Vec::new(),
        failing: BTreeSet::new(),
        grouped: groups
            .iter()
            .filter(|g| g.len() > 1)
            .flatten()
            .copied()
            .collect(),
    };
    for group in groups {
        let mut group_conflicts = Vec::new();
        for &d in &group {
            if let Some(conflict) = existing.get(&d) {
                group_conflicts.push((d, conflict.clone()));
            }
        }
        let in_group = |i: usize| group.contains(&i) && !existing.contains_key(&i);
        let Err(group_error) = run_apply(repo, diff, &in_group, None, true) else {
            if !group_conflicts.is_empty() {
                analysis.failing.extend(group.iter().copied());
                analysis.conflicts.extend(group_conflicts);
            }
            continue;
        };
        for &d in group.iter().filter(|d| !existing.contains_key(d)) {
            group_conflicts.extend(delta_conflicts(repo, diff, d)?);
        }
        if group_conflicts.is_empty() {
            let path = diff.get_delta(group[0]).map(|d| delta_path(&d));
            group_conflicts.push((
                group[0],
                GitConflict {
                    path: path.unwrap_or_default(),
                    hunk: None,
                    header: None,
                    reason: group_error.message().to_string(),
                },
            ));
        }
        analysis.failing.extend(group.iter().copied());
        analysis.conflicts.extend(group_conflicts);
    }
    analysis.conflicts.sort_by_key(|(d, c)| (*d, c.hunk));
    Ok(analysis)
}

/// Deltas grouped by shared paths (old or new), each group in patch order.
fn path_groups(diff: &Diff<'_>) -> Vec<Vec<usize>> {
    let count = diff.deltas().len();
    let mut parent: Vec<usize> = (0..count).collect();
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut owner: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, delta) in diff.deltas().enumerate() {
        for file in [delta.old_file(), delta.new_file()] {
            let Some(path) = file.path_bytes() else {
                continue;
            };
            match owner.get(path) {
                Some(&j) => {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    parent[a] = b;
                }
                None => {
                    owner.insert(path.to_vec(), i);
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..count {
        let root = find(&mut parent, i);
        groups.entry(root).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    groups.sort_by_key(|g| g[0]);
    groups
}

/// The conflicts of delta `d` checked alone: the file itself, else each hunk alone.
fn delta_conflicts(
    repo: &Repository,
    diff: &Diff<'_>,
    d: usize,
) -> Result<Vec<(usize, GitConflict)>, GitError> {
    let Some(delta) = diff.get_delta(d) else {
        return Ok(Vec::new());
    };
    let path = delta_path(&delta);
    let only = |i: usize| i == d;
    let conflict = |hunk: Option<(u32, String)>, reason: &str| {
        let (hunk, header) = hunk.unzip();
        (
            d,
            GitConflict {
                path: path.clone(),
                hunk,
                header,
                reason: reason.to_string(),
            },
        )
    };
    // With every hunk skipped only the file itself is checked: that it exists, and
    // binary patches (which have no hunks).
    if let Err(err) = run_apply(repo, diff, &only, Some(&|_| false), true) {
        return Ok(vec![conflict(None, err.message())]);
    }
    let patch = Patch::from_diff(diff, d).map_err(git("apply"))?;
    let mut out = Vec::new();
    let hunks = patch.as_ref().map_or(0, Patch::num_hunks);
    for h in 0..hunks {
        let one = |i: usize| i == h;
        if let Err(err) = run_apply(repo, diff, &only, Some(&one), true) {
            let header = patch
                .as_ref()
                .and_then(|p| p.hunk(h).ok())
                .map(|(hunk, _)| hunk_header(&hunk))
                .unwrap_or_default();
            out.push(conflict(Some((h as u32 + 1, header)), err.message()));
        }
    }
    if out.is_empty() {
        // Each hunk applies alone but not all of them together (they overlap).
        if let Err(err) = run_apply(repo, diff, &only, None, true) {
            out.push(conflict(None, err.message()));
        }
    }
    Ok(out)
}

fn hunk_header(hunk: &git2::DiffHunk<'_>) -> String {
    format!(
        "@@ -{},{} +{},{} @@",
        hunk.old_start(),
        hunk.old_lines(),
        hunk.new_start(),
        hunk.new_lines()
    )
}

/// A text file's new content computed by the fuzzy fallback.
struct Fuzzed {
    /// Path the content goes to (the new path of a rename).
    target: PathBuf,
    /// Path to remove afterwards (the old path of a rename).
    remove: Option<PathBuf>,
    /// The content.
    content: Vec<u8>,
    /// Permission bits of the written file.
    mode: u32,
    /// Path as shown in the answer.
    shown: String,
}

/// The fuzzy fallback: deltas that fail exactly and are plain text changes of one
/// existing file are re-applied here in memory; the rest goes through libgit2. Only
/// when every part succeeds is anything written. Answers (applied, fuzzed, conflicts).
fn apply_fuzzy(
    repo: &Repository,
    root: &Path,
    diff: &Diff<'_>,
    analysis: Analysis,
    check_only: bool,
) -> Result<(bool, Vec<String>, Vec<GitConflict>), GitError> {
    let mut fuzzed = Vec::new();
    let mut conflicts = Vec::new();
    for &d in &analysis.failing {
        let exact: Vec<GitConflict> = analysis
            .conflicts
            .iter()
            .filter(|(i, _)| *i == d)
            .map(|(_, c)| c.clone())
            .collect();
        // Only hunks are re-placed: a file that is missing, or a target that already
        // exists, stays a conflict.
        if exact.iter().any(|c| c.hunk.is_none()) {
            conflicts.extend(exact);
            continue;
        }
        match fuzz_delta(root, diff, d, analysis.grouped.contains(&d))? {
            Ok(Some(result)) => fuzzed.push(result),
            // Not a plain text change: its exact conflicts stand.
            Ok(None) => conflicts.extend(exact),
            Err(failed) => conflicts.extend(failed),
        }
    }
    if !conflicts.is_empty() {
        return Ok((false, Vec::new(), conflicts));
    }
    let exact_part = |i: usize| !analysis.failing.contains(&i);
    let any_exact = (0..diff.deltas().len()).any(exact_part);
    if any_exact {
        if let Err(err) = run_apply(repo, diff, &exact_part, None, true) {
            conflicts.push(GitConflict {
                path: String::new(),
                hunk: None,
                header: None,
                reason: err.message().to_string(),
            });
            return Ok((false, Vec::new(), conflicts));
        }
    }
    let shown: Vec<String> = fuzzed.iter().map(|f| f.shown.clone()).collect();
    if check_only {
        return Ok((true, shown, Vec::new()));
    }
    // New contents are first written beside their targets, so the only steps left
    // after libgit2 wrote its part are renames.
    let mut staged = Staged::default();
    for f in &fuzzed {
        staged.write(&f.target, &f.content, f.mode)?;
    }
    if any_exact {
        write_apply(repo, root, diff, &exact_part).map_err(git("apply"))?;
    }
    staged.commit()?;
    for f in &fuzzed {
        if let Some(old) = &f.remove {
            fs::remove_file(old).map_err(io_error("remove", old))?;
            prune_empty_dirs(root, old);
        }
    }
    Ok((true, shown, Vec::new()))
}

/// Fuzzy-applies delta `d`. `Ok(None)` when the delta is not a text change of one
/// existing file (binary, new, deleted, or sharing its path with another delta);
/// `Err` with a conflict per hunk that does not fit anywhere.
#[allow(clippy::type_complexity)]
fn fuzz_delta(
    root: &Path,
    diff: &Diff<'_>,
    d: usize,
    grouped: bool,
) -> Result<Result<Option<Fuzzed>, Vec<GitConflict>>, GitError> {
    let Some(delta) = diff.get_delta(d) else {
        return Ok(Ok(None));
    };
    let fuzzable = matches!(delta.status(), Delta::Modified | Delta::Renamed)
        && !delta.flags().is_binary()
        && !grouped;
    let (Some(old), Some(new)) = (delta.old_file().path(), delta.new_file().path()) else {
        return Ok(Ok(None));
    };
    let Some(patch) = Patch::from_diff(diff, d).map_err(git("apply"))? else {
        return Ok(Ok(None));
    };
    if !fuzzable || patch.num_hunks() == 0 {
        return Ok(Ok(None));
    }
    let old_path = root.join(old);
    let meta = match fs::symlink_metadata(&old_path) {
        Ok(meta) if meta.is_file() => meta,
        _ => return Ok(Ok(None)),
    };
    let content = fs::read(&old_path).map_err(io_error("read", &old_path))?;
    let hunks = hunk_specs(&patch).map_err(git("apply"))?;
    let shown = delta_path(&delta);
    match fuzz_apply(&content, &hunks) {
        Ok(new_content) => {
            let (old_mode, new_mode) = (
                u32::from(delta.old_file().mode()),
                u32::from(delta.new_file().mode()),
            );
            // Keep the file's own permissions unless the patch changes the mode.
            let mode = if old_mode != 0 && new_mode != 0 && old_mode != new_mode {
                if new_mode & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                }
            } else {
                meta.permissions().mode() & 0o7777
            };
            let renamed = old != new;
            Ok(Ok(Some(Fuzzed {
                target: root.join(new),
                remove: renamed.then_some(old_path),
                content: new_content,
                mode,
                shown,
            })))
        }
        Err(failed) => Ok(Err(failed
            .into_iter()
            .map(|h| GitConflict {
                path: shown.clone(),
                hunk: Some(h as u32 + 1),
                header: hunks.get(h).map(|s| s.header.clone()),
                reason: format!(
                    "the hunk's context is nowhere in the file, also not at another \
                     offset with up to {MAX_FUZZ} context lines ignored at each end"
                ),
            })
            .collect())),
    }
}

/// One text hunk as lines, each with its newline (none on a last line without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkSpec {
    /// First line of the hunk in the new file, from 1 (0 for an empty new file).
    pub new_start: usize,
    /// Lines the hunk expects: context and removed lines.
    pub pre: Vec<Vec<u8>>,
    /// Lines it leaves: context and added lines.
    pub post: Vec<Vec<u8>>,
    /// Context lines before the first change.
    pub lead: usize,
    /// Context lines after the last change.
    pub trail: usize,
    /// `@@ -a,b +c,d @@`.
    pub header: String,
}

/// The hunks of a parsed patch as [`HunkSpec`]s.
fn hunk_specs(patch: &Patch<'_>) -> Result<Vec<HunkSpec>, git2::Error> {
    let mut specs = Vec::new();
    for h in 0..patch.num_hunks() {
        let (hunk, count) = patch.hunk(h)?;
        let header = hunk_header(&hunk);
        let new_start = hunk.new_start() as usize;
        let mut lines: Vec<(char, Vec<u8>)> = Vec::new();
        for l in 0..count {
            let line = patch.line_in_hunk(h, l)?;
            match line.origin() {
                c @ (' ' | '+' | '-') => lines.push((c, line.content().to_vec())),
                // "\ No newline at end of file": the line before it has none. (libgit2
                // strips it itself while applying, so it may be gone already.)
                '=' | '>' | '<' => {
                    if let Some((_, last)) = lines.last_mut() {
                        if last.ends_with(b"\n") {
                            last.pop();
                        }
                    }
                }
                _ => {}
            }
        }
        let lead = lines.iter().take_while(|(c, _)| *c == ' ').count();
        let trail = if lead == lines.len() {
            0
        } else {
            lines.iter().rev().take_while(|(c, _)| *c == ' ').count()
        };
        let pre = lines
            .iter()
            .filter(|(c, _)| *c != '+')
            .map(|(_, l)| l.clone())
            .collect();
        let post = lines
            .iter()
            .filter(|(c, _)| *c != '-')
            .map(|(_, l)| l.clone())
            .collect();
        specs.push(HunkSpec {
            new_start,
            pre,
            post,
            lead,
            trail,
            header,
        });
    }
    Ok(specs)
}

/// Splits `content` into lines that keep their newline.
fn split_lines(content: &[u8]) -> Vec<Vec<u8>> {
    content
        .split_inclusive(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

/// Applies text hunks to `content` like `patch` does: each hunk is looked for nearest
/// to where it is expected (carrying the offset of the hunk before), first exactly,
/// then ignoring 1, then 2 context lines at each end. Hunks must stay in order and
/// not overlap. Answers the new content, or the 0-based indices of hunks that fit
/// nowhere.
pub fn fuzz_apply(content: &[u8], hunks: &[HunkSpec]) -> Result<Vec<u8>, Vec<usize>> {
    let mut image = split_lines(content);
    let mut failed = Vec::new();
    // Offset at which the previous hunk was found, relative to where it was expected.
    let mut offset: isize = 0;
    // Line count difference of hunks that failed: later `new_start`s assumed them.
    let mut skipped: isize = 0;
    // First line a hunk may start at: after the previous one.
    let mut floor = 0usize;
    for (h, hunk) in hunks.iter().enumerate() {
        if hunk.lead + hunk.trail > hunk.pre.len().min(hunk.post.len()) {
            // Inconsistent counts (not from `hunk_specs`): nothing sensible to place.
            failed.push(h);
            continue;
        }
        let expected = hunk.new_start.saturating_sub(1) as isize + offset - skipped;
        let mut found = None;
        let mut tried = Vec::new();
        for fuzz in 0..=MAX_FUZZ {
            let (lead, trail) = (fuzz.min(hunk.lead), fuzz.min(hunk.trail));
            if tried.contains(&(lead, trail)) {
                // The hunk has no more context to ignore than at the previous level.
                continue;
            }
            tried.push((lead, trail));
            let pre = &hunk.pre[lead..hunk.pre.len() - trail];
            if pre.is_empty() && !hunk.pre.is_empty() {
                // Without any context the hunk would fit anywhere.
                continue;
            }
            let want = expected + lead as isize;
            if let Some(at) = find_lines(&image, pre, want, floor) {
                found = Some((at, want, lead, trail));
                break;
            }
        }
        match found {
            Some((at, want, lead, trail)) => {
                let pre_len = hunk.pre.len() - lead - trail;
                let post = &hunk.post[lead..hunk.post.len() - trail];
                image.splice(at..at + pre_len, post.iter().cloned());
                offset = at as isize - want;
                floor = at + post.len();
            }
            None => {
                failed.push(h);
                skipped += hunk.post.len() as isize - hunk.pre.len() as isize;
            }
        }
    }
    if failed.is_empty() {
        Ok(image.concat())
    } else {
        Err(failed)
    }
}

/// The start of `needle` in `image` at or after `floor`, nearest to `want`.
fn find_lines(image: &[Vec<u8>], needle: &[Vec<u8>], want: isize, floor: usize) -> Option<usize> {
    let last = image.len().checked_sub(needle.len())?;
    if floor > last {
        return None;
    }
    let want = want.clamp(floor as isize, last as isize) as usize;
    let fits = |at: usize| image[at..at + needle.len()] == *needle;
    for distance in 0..=last.max(want) {
        if let Some(at) = want.checked_add(distance).filter(|&at| at <= last) {
            if fits(at) {
                return Some(at);
            }
        }
        if let Some(at) = want.checked_sub(distance).filter(|&at| at >= floor) {
            if distance > 0 && fits(at) {
                return Some(at);
            }
        }
        if want + distance > last && want.saturating_sub(distance) <= floor {
            break;
        }
    }
    None
}

/// Files written next to their targets, renamed over them on `commit`, removed if
/// dropped before.
#[derive(Default)]
struct Staged {
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    fn write(&mut self, target: &Path, content: &[u8], mode: u32) -> Result<(), GitError> {
        let dir = target.parent().unwrap_or(Path::new("/"));
        fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        let temp = dir.join(format!("{TEMP_PREFIX}{}", crate::files::unique_suffix()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(io_error("write", target))?;
        self.files.push((temp.clone(), target.to_path_buf()));
        file.write_all(content).map_err(io_error("write", target))?;
        drop(file);
        fs::set_permissions(&temp, Permissions::from_mode(mode)).map_err(io_error("write", target))
    }

    fn commit(mut self) -> Result<(), GitError> {
        while let Some((temp, target)) = self.files.pop() {
            if let Err(err) = fs::rename(&temp, &target) {
                let _ = fs::remove_file(&temp);
                return Err(io_error("write", &target)(err));
            }
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (temp, _) in self.files.drain(..) {
            let _ = fs::remove_file(temp);
        }
    }
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

// ---------------------------------------------------------------------------------
// Commit

/// Stages everything (`git add -A`) and commits it on HEAD with `message`, authored
/// and committed by `name <email>`.
pub fn commit(
    repo: &Path,
    message: &str,
    name: &str,
    email: &str,
    allow_empty: bool,
) -> Result<GitCommitResult, GitError> {
    if message.trim().is_empty() {
        return Err(GitError::Invalid("the commit message is empty".into()));
    }
    let signature = Signature::now(name, email)
        .map_err(|err| GitError::Invalid(format!("invalid author: {}", err.message())))?;
    let mut repo = open(repo)?;
    // A merge in progress gets its other heads as parents, as `git commit` does.
    let mut merge_heads = Vec::new();
    if repo.state() == RepositoryState::Merge {
        repo.mergehead_foreach(|id| {
            merge_heads.push(*id);
            true
        })
        .map_err(git("read MERGE_HEAD"))?;
    }
    let mut index = repo.index().map_err(git("read the index"))?;
    stage_work_tree(&mut index, true)?;
    index.write().map_err(git("write the index"))?;
    let tree_id = index.write_tree().map_err(git("write the tree"))?;
    let tree = repo.find_tree(tree_id).map_err(git("write the tree"))?;
    let parent = head_commit(&repo)?;
    let parent_tree = match &parent {
        Some(p) => Some(p.tree().map_err(git("read HEAD"))?),
        None => None,
    };
    let files_changed = repo
        .diff_tree_to_tree(parent_tree.as_ref(), Some(&tree), None)
        .map_err(git("diff"))?
        .deltas()
        .len() as u64;
    if files_changed == 0 && !allow_empty {
        return Err(GitError::Invalid(
            "nothing to commit: the work tree matches HEAD (set allow_empty to commit anyway)"
                .into(),
        ));
    }
    let mut parents: Vec<git2::Commit<'_>> = parent.into_iter().collect();
    for id in &merge_heads {
        parents.push(repo.find_commit(*id).map_err(git("read MERGE_HEAD"))?);
    }
    let parent_refs: Vec<&git2::Commit<'_>> = parents.iter().collect();
    let id = repo
        .commit(
            Some("HEAD"),
            &signature,
            &signature,
            message,
            &tree,
            &parent_refs,
        )
        .map_err(git("commit"))?;
    if !merge_heads.is_empty() {
        repo.cleanup_state().map_err(git("commit"))?;
    }
    Ok(GitCommitResult {
        commit: id.to_string(),
        files_changed,
    })
}

// ---------------------------------------------------------------------------------
// Reset

/// Hard-resets `repo` to `target` (default HEAD) and, with `clean_untracked`, removes
/// untracked files and directories, and ignored ones unless `keep_ignored`.
pub fn reset(
    repo: &Path,
    target: Option<&str>,
    clean_untracked: bool,
    keep_ignored: bool,
) -> Result<GitResetResult, GitError> {
    let repo = open(repo)?;
    let root = workdir(&repo)?;
    let commit = match target {
        Some(spec) => Some(resolve_commit(&repo, spec)?),
        None => head_commit(&repo)?,
    };
    match &commit {
        Some(commit) => {
            let mut checkout = git2::build::CheckoutBuilder::new();
            checkout.force();
            repo.reset(commit.as_object(), ResetType::Hard, Some(&mut checkout))
                .map_err(git("reset"))?;
        }
        None => unborn_reset(&repo, &root)?,
    }
    let removed = if clean_untracked {
        clean(&repo, &root, keep_ignored)?
    } else {
        Vec::new()
    };
    Ok(GitResetResult {
        head: commit.map(|c| c.id().to_string()),
        removed,
    })
}

/// `git reset --hard` on a branch without commits: everything staged is dropped from
/// the index and the work tree.
fn unborn_reset(repo: &Repository, root: &Path) -> Result<(), GitError> {
    let mut index = repo.index().map_err(git("read the index"))?;
    for entry in index.iter() {
        let path = root.join(lossy(&entry.path));
        match fs::remove_file(&path) {
            Ok(()) => prune_empty_dirs(root, &path),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_error("remove", &path)(err)),
        }
    }
    index.clear().map_err(git("reset"))?;
    index.write().map_err(git("write the index"))
}

/// `git clean -fd` (`-fdx` without `keep_ignored`). Answers the removed paths.
fn clean(repo: &Repository, root: &Path, keep_ignored: bool) -> Result<Vec<String>, GitError> {
    let mut opts = StatusOptions::new();
    // Keeping ignored files means looking inside untracked directories, which may
    // hold ignored files; otherwise a whole untracked directory goes at once.
    opts.include_untracked(true)
        .recurse_untracked_dirs(keep_ignored)
        .include_ignored(!keep_ignored)
        .recurse_ignored_dirs(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(git("status"))?;
    let wanted = if keep_ignored {
        Status::WT_NEW
    } else {
        Status::WT_NEW | Status::IGNORED
    };
    let paths: Vec<String> = statuses
        .iter()
        .filter(|e| e.status().intersects(wanted))
        .map(|e| lossy(e.path_bytes()))
        .collect();
    drop(statuses);
    let mut removed = Vec::new();
    for shown in paths {
        let path = root.join(shown.trim_end_matches('/'));
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(io_error("remove", &path)(err)),
        };
        if meta.is_dir() {
            // A nested repository is someone's work; `git clean` keeps it too.
            if path.join(".git").exists() {
                continue;
            }
            fs::remove_dir_all(&path).map_err(io_error("remove", &path))?;
        } else {
            fs::remove_file(&path).map_err(io_error("remove", &path))?;
        }
        prune_empty_dirs(root, &path);
        removed.push(shown);
    }
    removed.sort();
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::fs::symlink;
    use std::process::Command;

    /// Runs the git CLI (tests only) in `dir`, isolated from the machine's config.
    fn git_cli(dir: &Path, args: &[&str]) -> Vec<u8> {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "Test")
            .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
            .env("GIT_COMMITTER_NAME", "Test")
            .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
            .output()
            .expect("the git CLI runs");
        assert!(
            out.status.success(),
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn git_text(dir: &Path, args: &[&str]) -> String {
        String::from_utf8(git_cli(dir, args)).unwrap()
    }

    fn init_repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        git_cli(dir.path(), &["init", "-q", "-b", "main"]);
        dir
    }

    fn commit_all(dir: &Path, message: &str) {
        git_cli(dir, &["add", "-A"]);
        git_cli(dir, &["commit", "-q", "--allow-empty", "-m", message]);
    }

    fn clone(src: &Path) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("clone");
        git_cli(src, &["clone", "-q", ".", dst.to_str().unwrap()]);
        dir
    }

    fn write(path: &Path, content: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn set_exec(path: &Path, exec: bool) {
        let mode = if exec { 0o755 } else { 0o644 };
        fs::set_permissions(path, Permissions::from_mode(mode)).unwrap();
    }

    /// Every file of a work tree (outside `.git`): executable bit and bytes, or a
    /// symbolic link's target.
    fn snapshot(root: &Path) -> BTreeMap<String, (bool, Vec<u8>)> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (bool, Vec<u8>)>) {
            for entry in fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let path = entry.path();
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if rel == ".git" {
                    continue;
                }
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.is_dir() {
                    walk(root, &path, out);
                } else if meta.file_type().is_symlink() {
                    let target = fs::read_link(&path).unwrap();
                    out.insert(rel, (false, target.to_string_lossy().as_bytes().to_vec()));
                } else {
                    let exec = meta.permissions().mode() & 0o111 != 0;
                    out.insert(rel, (exec, fs::read(&path).unwrap()));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(root, root, &mut out);
        out
    }

    /// xorshift64*: deterministic randomness without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.next() % 100 < percent
        }

        fn text(&mut self, lines: usize) -> Vec<u8> {
            let words = [
                "alpha",
                "beta",
                "gamma",
                "delta",
                "fn main()",
                "{",
                "}",
                "",
                "x = 1;",
            ];
            let mut out = Vec::new();
            for _ in 0..lines {
                for _ in 0..1 + self.below(4) {
                    out.extend_from_slice(words[self.below(words.len())].as_bytes());
                    out.push(b' ');
                }
                out.extend_from_slice(format!("{}", self.next() % 1000).as_bytes());
                out.push(b'\n');
            }
            out
        }

        fn text_n(&mut self, min: usize, spread: usize) -> Vec<u8> {
            let n = min + self.below(spread);
            self.text(n)
        }

        fn binary_n(&mut self, min: usize, spread: usize) -> Vec<u8> {
            let n = min + self.below(spread);
            self.binary(n)
        }

        fn binary(&mut self, len: usize) -> Vec<u8> {
            (0..len)
                .map(|i| if i % 7 == 0 { 0 } else { self.next() as u8 })
                .collect()
        }
    }

    fn is_binary(content: &[u8]) -> bool {
        content.contains(&0)
    }

    /// Changes lines of a text file: replaces, inserts and deletes a few, sometimes
    /// drops or restores the final newline.
    fn edit_text(rng: &mut Rng, content: &[u8]) -> Vec<u8> {
        let mut lines = split_lines(content);
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(lines.len() + 1);
            match rng.below(3) {
                0 if at < lines.len() => lines[at] = rng.text(1),
                1 if at < lines.len() => {
                    lines.remove(at);
                }
                _ => lines.insert(at.min(lines.len()), rng.text_n(1, 3)),
            }
        }
        let mut out = lines.concat();
        if rng.chance(15) {
            if out.ends_with(b"\n") {
                out.pop();
            } else {
                out.push(b'\n');
            }
        }
        out
    }

    /// A committed repository with text, binary, executable and empty files in nested
    /// directories (one name has a space), then a random set of changes on top.
    fn random_repo(seed: u64) -> tempfile::TempDir {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join(".gitignore"), "*.log\n").unwrap();
        for i in 0..12 {
            let sub = ["", "src/", "src/deep/er/", "docs/"][i % 4];
            write(&root.join(format!("{sub}file{i}.txt")), &rng.text_n(20, 40));
        }
        write(&root.join("docs/with space.txt"), &rng.text(25));
        write(&root.join("empty.txt"), b"");
        for i in 0..3 {
            write(
                &root.join(format!("bin/blob{i}.bin")),
                &rng.binary_n(500, 4000),
            );
        }
        for i in 0..2 {
            let path = root.join(format!("scripts/run{i}.sh"));
            write(&path, format!("#!/bin/sh\necho {i}\n").as_bytes());
            set_exec(&path, true);
        }
        symlink("file0.txt", root.join("link")).unwrap();
        commit_all(root, "initial");

        let mut counter = 0;
        for _ in 0..12 {
            let files: Vec<String> = snapshot(root)
                .into_keys()
                .filter(|p| p != ".gitignore" && p != "link" && p != "file0.txt")
                .collect();
            if files.is_empty() {
                break;
            }
            let pick = root.join(&files[rng.below(files.len())]);
            counter += 1;
            match rng.below(9) {
                // Modify.
                0 | 1 => {
                    let old = fs::read(&pick).unwrap();
                    let new = if is_binary(&old) {
                        let mut new = old.clone();
                        for _ in 0..1 + rng.below(20) {
                            let at = rng.below(new.len().max(1));
                            if at < new.len() {
                                new[at] = rng.next() as u8;
                            }
                        }
                        new.extend(rng.binary_n(0, 300));
                        new
                    } else {
                        edit_text(&mut rng, &old)
                    };
                    fs::write(&pick, new).unwrap();
                }
                // Add, sometimes in new nested directories, sometimes empty.
                2 => {
                    let sub = match rng.below(3) {
                        0 => String::new(),
                        1 => format!("new{counter}/"),
                        _ => format!("new{counter}/a/b/"),
                    };
                    let content = match rng.below(4) {
                        0 => Vec::new(),
                        1 => rng.binary_n(100, 2000),
                        _ => rng.text_n(5, 30),
                    };
                    write(&root.join(format!("{sub}added{counter}.txt")), &content);
                }
                // Delete.
                3 => fs::remove_file(&pick).unwrap(),
                // Rename, keeping most of the content.
                4 | 5 => {
                    let content = fs::read(&pick).unwrap();
                    let target = if rng.chance(50) {
                        root.join(format!("moved{counter}/renamed{counter}.txt"))
                    } else {
                        pick.with_file_name(format!("renamed{counter}.txt"))
                    };
                    let exec = fs::metadata(&pick).unwrap().permissions().mode() & 0o111 != 0;
                    fs::remove_file(&pick).unwrap();
                    let content = if !is_binary(&content)
                        && split_lines(&content).len() > 10
                        && rng.chance(50)
                    {
                        let mut lines = split_lines(&content);
                        let at = rng.below(lines.len());
                        lines[at] = rng.text(1);
                        lines.concat()
                    } else {
                        content
                    };
                    write(&target, &content);
                    set_exec(&target, exec);
                }
                // Mode change.
                6 => {
                    let exec = fs::metadata(&pick).unwrap().permissions().mode() & 0o111 != 0;
                    set_exec(&pick, !exec);
                }
                // Binary change: a text file becomes binary or a new binary appears.
                7 => {
                    let len = 200 + rng.below(3000);
                    fs::write(&pick, rng.binary(len)).unwrap();
                }
                // Mode change together with content.
                _ => {
                    let old = fs::read(&pick).unwrap();
                    if !is_binary(&old) {
                        fs::write(&pick, edit_text(&mut rng, &old)).unwrap();
                    }
                    let exec = fs::metadata(&pick).unwrap().permissions().mode() & 0o111 != 0;
                    set_exec(&pick, !exec);
                }
            }
        }
        // Ignored files stay out of every diff.
        write(&root.join("debug.log"), b"noise\n");
        dir
    }

    /// The paths whose mode or content differ between two snapshots.
    fn differences(
        actual: &BTreeMap<String, (bool, Vec<u8>)>,
        expected: &BTreeMap<String, (bool, Vec<u8>)>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for path in actual
            .keys()
            .chain(expected.keys())
            .collect::<BTreeSet<_>>()
        {
            match (actual.get(path), expected.get(path)) {
                (Some(a), Some(e)) if a == e => {}
                (Some(a), Some(e)) if a.1 == e.1 => {
                    out.push(format!("{path}: exec {} not {}", a.0, e.0))
                }
                (Some(_), Some(_)) => out.push(format!("{path}: content differs")),
                (Some(_), None) => out.push(format!("{path}: unexpected")),
                (None, _) => out.push(format!("{path}: missing")),
            }
        }
        out
    }

    fn without_ignored(
        mut snap: BTreeMap<String, (bool, Vec<u8>)>,
    ) -> BTreeMap<String, (bool, Vec<u8>)> {
        snap.retain(|path, _| !path.ends_with(".log"));
        snap
    }

    /// Our diff applied by `git apply --index` and by `git apply`, and the CLI's diff
    /// applied by our apply, all reproduce the changed work tree on a fresh clone.
    #[test]
    fn randomized_round_trip_between_our_diff_apply_and_the_git_cli() {
        // More seeds on demand: ORCHARD_GIT_SEEDS=500 cargo test ... round_trip
        let seeds = std::env::var("ORCHARD_GIT_SEEDS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(10u64);
        for seed in 1..=seeds {
            let dir = random_repo(seed);
            let repo = dir.path();
            let expected = without_ignored(snapshot(repo));
            let ours = diff(repo, None, true, true).unwrap();
            assert!(!ours.patch.is_empty(), "seed {seed}: empty diff");
            assert_eq!(diff_patch(repo, None).unwrap(), ours.patch);
            // The diff wrote nothing: neither the index nor objects.
            assert!(
                git_text(repo, &["status", "--porcelain"]).lines().count() > 0,
                "seed {seed}"
            );

            git_cli(repo, &["add", "-A"]);
            let listing = git_text(repo, &["ls-files", "-s"]);
            let cli_patch = git_cli(repo, &["diff", "--cached", "--binary", "HEAD"]);
            let shown = |what: &str| {
                format!(
                    "seed {seed} ({what}); our patch:\n{}\nthe CLI's:\n{}",
                    ours.patch,
                    String::from_utf8_lossy(&cli_patch)
                )
            };

            // (a) Our patch through `git apply --index`: same index and work tree.
            let a = clone(repo);
            let a = a.path().join("clone");
            fs::write(a.join("../ours.patch"), &ours.patch).unwrap();
            git_cli(&a, &["apply", "--index", "../ours.patch"]);
            assert_eq!(
                git_text(&a, &["ls-files", "-s"]),
                listing,
                "{}",
                shown("--index")
            );
            let diffs = differences(&snapshot(&a), &expected);
            assert!(diffs.is_empty(), "{}\n{diffs:?}", shown("--index"));

            // ... and through plain `git apply`.
            let b = clone(repo);
            let b = b.path().join("clone");
            fs::write(b.join("../ours.patch"), &ours.patch).unwrap();
            git_cli(&b, &["apply", "../ours.patch"]);
            let diffs = differences(&snapshot(&b), &expected);
            assert!(diffs.is_empty(), "{}\n{diffs:?}", shown("plain"));

            // (b) The CLI's patch through our apply.
            let c = clone(repo);
            let c = c.path().join("clone");
            let cli_text = String::from_utf8(cli_patch.clone()).unwrap();
            let result = apply(&c, &cli_text, false, false).unwrap();
            assert!(
                result.applied,
                "{}: {:?}",
                shown("ours applies the CLI's"),
                result
            );
            let diffs = differences(&snapshot(&c), &expected);
            assert!(
                diffs.is_empty(),
                "{}\n{diffs:?}",
                shown("ours applies the CLI's")
            );

            // And our patch through our apply.
            let d = clone(repo);
            let d = d.path().join("clone");
            let result = apply(&d, &ours.patch, false, false).unwrap();
            assert!(
                result.applied,
                "{}: {:?}",
                shown("ours applies ours"),
                result
            );
            let diffs = differences(&snapshot(&d), &expected);
            assert!(
                diffs.is_empty(),
                "{}\n{diffs:?}",
                shown("ours applies ours")
            );
        }
    }

    #[test]
    fn binary_patch_with_truncated_zlib_data_is_refused_not_applied_forever() {
        let dir = init_repo();
        let root = dir.path();
        let old: Vec<u8> = (0..400u32).map(|i| (i * 7919 % 251) as u8).collect();
        fs::write(root.join("blob.bin"), &old).unwrap();
        commit_all(root, "base");
        let new: Vec<u8> = (0..400u32)
            .map(|i| (i * 104_729 % 241) as u8 ^ 0x5a)
            .collect();
        fs::write(root.join("blob.bin"), &new).unwrap();
        let patch = git_text(root, &["diff", "--binary"]);
        git_cli(root, &["checkout", "--", "."]);
        // Without the last data line of the first binary chunk, its zlib stream ends
        // early while every line is still valid base85.
        let lines: Vec<&str> = patch.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.starts_with("literal ") || l.starts_with("delta "))
            .expect("a binary chunk");
        let end = start
            + 1
            + lines[start + 1..]
                .iter()
                .position(|l| l.is_empty())
                .unwrap();
        assert!(end - start > 2, "several data lines:\n{patch}");
        let mut cut = lines.clone();
        cut.remove(end - 1);
        let truncated = cut.join("\n") + "\n";

        let (tx, rx) = std::sync::mpsc::channel();
        let repo = root.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(apply(&repo, &truncated, false, false));
        });
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("apply returns (libgit2 loops forever on zlib data that ends early)");
        let err = result.expect_err("a truncated binary patch is refused");
        assert!(matches!(err, GitError::BadPatch(_)), "{err:?}");
        assert!(err.to_string().contains("ends early"), "{err}");
        assert_eq!(fs::read(root.join("blob.bin")).unwrap(), old);
        // The patch as git printed it applies.
        assert!(apply(root, &patch, false, false).unwrap().applied);
        assert_eq!(fs::read(root.join("blob.bin")).unwrap(), new);
    }

    #[test]
    fn unknown_file_mode_in_a_patch_is_a_bad_patch_not_a_panic() {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("a.txt"), "a\n").unwrap();
        commit_all(root, "base");
        let new = "diff --git a/n.txt b/n.txt\nnew file mode 120644\nindex 0000000..ce01362\n\
                   --- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+hello\n";
        let chmod = "diff --git a/a.txt b/a.txt\nold mode 100644\nnew mode 100777\n";
        for patch in [new, chmod] {
            for (check_only, fuzzy) in [(false, false), (true, false), (false, true)] {
                let err = apply(root, patch, check_only, fuzzy).unwrap_err();
                assert!(matches!(err, GitError::BadPatch(_)), "{err:?}");
                assert!(err.to_string().contains("unknown file mode"), "{err}");
            }
        }
        assert!(!root.join("n.txt").exists());
    }

    /// Found by `make fuzz` (git_apply): a NUL in a `diff --git` line left a deleted
    /// file's delta without a new path, and libgit2's apply segfaulted on it, taking
    /// the agent (the sandbox's PID 1) down with it.
    #[test]
    fn regression_a_nul_in_a_patch_header_is_a_bad_patch_not_a_segfault() {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("x"), "c\n").unwrap();
        commit_all(root, "base");
        let patch = "diff --git a/n\0diff --git a/x b/x\ndeleted file mode 100644\n\
                     --- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-c\n";
        let parsed = Diff::from_buffer(normalize_patch(patch).as_bytes()).unwrap();
        let delta = parsed.deltas().next().unwrap();
        assert!(
            delta.new_file().path().is_none(),
            "libgit2 changed: the test needs a new input"
        );
        assert!(matches!(check_paths(&parsed), Err(GitError::BadPatch(_))));
        for (check_only, fuzzy) in [(false, false), (true, false), (false, true)] {
            let err = apply(root, patch, check_only, fuzzy).unwrap_err();
            assert!(matches!(err, GitError::BadPatch(_)), "{err:?}");
            assert!(err.to_string().contains("NUL byte"), "{err}");
        }
        assert_eq!(fs::read(root.join("x")).unwrap(), b"c\n");
    }

    #[test]
    fn patch_paths_beyond_a_symbolic_link_are_conflicts_not_written_outside() {
        let outer = tempfile::tempdir().unwrap();
        let outside = outer.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("run.sh"), "echo hi\n").unwrap();
        fs::write(root.join("a.txt"), "a\n").unwrap();
        symlink(&outside, root.join("out")).unwrap();
        symlink("out", root.join("out2")).unwrap();
        commit_all(root, "base");
        let new = |path: &str| {
            format!(
                "diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..ce01362\n\
                 --- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+hello\n"
            )
        };
        let rename = "diff --git a/run.sh b/out/run.sh\nsimilarity index 100%\n\
                      rename from run.sh\nrename to out/run.sh\n";
        let change = "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+b\n";
        let cases = [
            (new("out/pwned"), false),
            (new("out/pwned"), true),
            (new("out2/deeper/pwned"), false),
            (rename.to_string(), false),
            (format!("{change}{}", new("out/pwned")), true),
        ];
        for (patch, fuzzy) in cases {
            for check_only in [true, false] {
                let result = apply(root, &patch, check_only, fuzzy).unwrap();
                assert!(!result.applied, "{patch}");
                let conflict = result.conflicts.last().unwrap();
                assert!(conflict.path.starts_with("out"), "{conflict:?}");
                assert!(conflict.reason.contains("symbolic link"), "{conflict:?}");
            }
        }
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            0,
            "written outside"
        );
        assert_eq!(fs::read_to_string(root.join("a.txt")).unwrap(), "a\n");
        assert!(root.join("run.sh").exists());
        // A new file next to the links still applies.
        assert!(apply(root, &new("in/ok"), false, false).unwrap().applied);
    }

    fn numbered(lines: std::ops::RangeInclusive<usize>, tag: &str) -> String {
        lines.map(|i| format!("{tag} line {i}\n")).collect()
    }

    /// A repository with `a.txt` (30 lines), `b.txt` (10 lines) and a binary file, and
    /// the patch of a change to both text files, `a.txt` in two hunks. The work tree
    /// is back at HEAD afterwards.
    fn repo_with_patch() -> (tempfile::TempDir, String) {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("a.txt"), numbered(1..=30, "a")).unwrap();
        fs::write(root.join("b.txt"), numbered(1..=10, "b")).unwrap();
        fs::write(root.join("c.bin"), [0u8, 1, 2, 3, 0, 255]).unwrap();
        commit_all(root, "base");
        let a = numbered(1..=30, "a")
            .replace("a line 3\n", "a line three\n")
            .replace("a line 25\n", "a line twenty-five\n");
        fs::write(root.join("a.txt"), a).unwrap();
        fs::write(
            root.join("b.txt"),
            numbered(1..=10, "b").replace("b line 5\n", "b line five\n"),
        )
        .unwrap();
        let patch = diff_patch(root, None).unwrap();
        git_cli(root, &["checkout", "--", "."]);
        (dir, patch)
    }

    #[test]
    fn a_conflicting_patch_changes_nothing_and_names_file_and_hunk() {
        let (dir, patch) = repo_with_patch();
        let root = dir.path();
        // The second hunk of a.txt no longer matches.
        let a = numbered(1..=30, "a").replace("a line 25\n", "a line 25 (edited)\n");
        fs::write(root.join("a.txt"), &a).unwrap();
        let before = snapshot(root);

        for check_only in [false, true] {
            let result = apply(root, &patch, check_only, false).unwrap();
            assert!(!result.applied);
            assert_eq!(result.files, ["a.txt", "b.txt"]);
            assert_eq!(result.conflicts.len(), 1, "{result:?}");
            let conflict = &result.conflicts[0];
            assert_eq!(conflict.path, "a.txt");
            assert_eq!(conflict.hunk, Some(2));
            assert_eq!(conflict.header.as_deref(), Some("@@ -22,7 +22,7 @@"));
            assert!(!conflict.reason.is_empty());
            // Not even b.txt, which alone would apply, changed.
            assert_eq!(snapshot(root), before);
        }

        // A missing file is a conflict of the file, not of a hunk.
        fs::write(root.join("a.txt"), numbered(1..=30, "a")).unwrap();
        fs::remove_file(root.join("b.txt")).unwrap();
        let before = snapshot(root);
        let result = apply(root, &patch, false, false).unwrap();
        assert!(!result.applied);
        assert_eq!(result.conflicts.len(), 1, "{result:?}");
        assert_eq!(result.conflicts[0].path, "b.txt");
        assert_eq!(result.conflicts[0].hunk, None);
        assert_eq!(snapshot(root), before);

        // A new file whose path is taken is refused, also in check mode (libgit2
        // itself would only notice when writing).
        git_cli(root, &["checkout", "--", "."]);
        fs::write(root.join("new.txt"), "new\n").unwrap();
        let adding = diff_patch(root, None).unwrap();
        for check_only in [true, false] {
            let result = apply(root, &adding, check_only, false).unwrap();
            assert!(!result.applied);
            assert_eq!(result.conflicts[0].path, "new.txt");
            assert!(result.conflicts[0].reason.contains("already exists"));
        }
    }

    #[test]
    fn check_only_never_writes_and_a_clean_patch_applies() {
        let (dir, patch) = repo_with_patch();
        let root = dir.path();
        let before = snapshot(root);
        let result = apply(root, &patch, true, false).unwrap();
        assert!(result.applied && result.conflicts.is_empty());
        assert_eq!(snapshot(root), before);
        let result = apply(root, &patch, false, false).unwrap();
        assert!(result.applied);
        assert!(fs::read_to_string(root.join("a.txt"))
            .unwrap()
            .contains("a line twenty-five\n"));
        assert_eq!(diff_patch(root, None).unwrap(), patch);
    }

    #[test]
    fn malformed_patches_and_bad_requests_are_invalid_arguments() {
        let (dir, _) = repo_with_patch();
        let root = dir.path();
        for bad in ["", "not a patch\n", "diff --git a/x b/x\n@@ -1 +1 @@\n-a\n"] {
            let err = apply(root, bad, false, false).unwrap_err();
            assert!(matches!(err, GitError::BadPatch(_)), "{bad:?}: {err:?}");
            assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);
        }
        let err = diff(root, Some("no-such-branch"), true, true).unwrap_err();
        assert!(matches!(err, GitError::BadRevision { .. }), "{err:?}");
        assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);
        let err = reset(root, Some("HEAD~5"), true, true).unwrap_err();
        assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);

        let plain = tempfile::tempdir().unwrap();
        let err = status(plain.path()).unwrap_err();
        let api = ApiError::from(err);
        assert_eq!(api.code, ErrorCode::NotFound);
        assert!(
            api.message.starts_with("no git repository at "),
            "{}",
            api.message
        );
        let api = ApiError::from(status(&plain.path().join("missing")).unwrap_err());
        assert_eq!(api.code, ErrorCode::NotFound);
        assert_eq!(
            ApiError::from(repo_path("relative").unwrap_err()).code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn fuzzy_applies_hunks_whose_context_moved_and_changed() {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("f.txt"), numbered(1..=40, "f")).unwrap();
        fs::write(root.join("g.txt"), numbered(1..=5, "g")).unwrap();
        commit_all(root, "base");
        let changed = numbered(1..=40, "f")
            .replace("f line 20\n", "f line twenty\n")
            .replace("f line 35\n", "f line thirty-five\n");
        fs::write(root.join("f.txt"), &changed).unwrap();
        fs::write(root.join("g.txt"), numbered(1..=6, "g")).unwrap();
        fs::write(root.join("new.bin"), [0u8, 9, 8, 7]).unwrap();
        let patch = diff_patch(root, None).unwrap();
        assert!(patch.contains("@@ -17,7 +17,7 @@"), "{patch}");
        git_cli(root, &["checkout", "--", "."]);
        fs::remove_file(root.join("new.bin")).unwrap();

        // Five lines more on top, and the first context line of the first hunk edited.
        let shifted = format!("{}{}", numbered(1..=5, "top"), numbered(1..=40, "f"))
            .replace("f line 17\n", "f line 17 (edited)\n");
        fs::write(root.join("f.txt"), &shifted).unwrap();
        let before = snapshot(root);
        let exact = apply(root, &patch, false, false).unwrap();
        assert!(!exact.applied);
        assert_eq!(snapshot(root), before);

        let checked = apply(root, &patch, true, true).unwrap();
        assert!(checked.applied, "{checked:?}");
        assert_eq!(checked.fuzzed, ["f.txt"]);
        assert_eq!(snapshot(root), before);

        let result = apply(root, &patch, false, true).unwrap();
        assert!(result.applied, "{result:?}");
        assert_eq!(result.fuzzed, ["f.txt"]);
        assert_eq!(result.files, ["f.txt", "g.txt", "new.bin"]);
        let expected = shifted
            .replace("f line 20\n", "f line twenty\n")
            .replace("f line 35\n", "f line thirty-five\n");
        assert_eq!(fs::read_to_string(root.join("f.txt")).unwrap(), expected);
        assert_eq!(
            fs::read_to_string(root.join("g.txt")).unwrap(),
            numbered(1..=6, "g")
        );
        assert_eq!(fs::read(root.join("new.bin")).unwrap(), [0u8, 9, 8, 7]);
        let leftovers: Vec<_> = fs::read_dir(root)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
            .collect();
        assert!(leftovers.is_empty());

        // Three edited context lines are more than the fuzz allows: nothing changes.
        git_cli(root, &["checkout", "--", "."]);
        fs::remove_file(root.join("new.bin")).unwrap();
        let far = numbered(1..=40, "f")
            .replace("f line 17\n", "x\n")
            .replace("f line 18\n", "x\n")
            .replace("f line 19\n", "x\n")
            .replace("f line 21\n", "x\n")
            .replace("f line 22\n", "x\n")
            .replace("f line 23\n", "x\n");
        fs::write(root.join("f.txt"), &far).unwrap();
        let before = snapshot(root);
        let result = apply(root, &patch, false, true).unwrap();
        assert!(!result.applied);
        assert_eq!(result.conflicts.len(), 1, "{result:?}");
        assert_eq!(result.conflicts[0].path, "f.txt");
        assert_eq!(result.conflicts[0].hunk, Some(1));
        assert_eq!(snapshot(root), before);
    }

    #[test]
    fn fuzz_apply_handles_offsets_fuzz_and_missing_final_newlines() {
        let spec = |new_start, pre: &[&str], post: &[&str], lead, trail| HunkSpec {
            new_start,
            pre: pre.iter().map(|l| l.as_bytes().to_vec()).collect(),
            post: post.iter().map(|l| l.as_bytes().to_vec()).collect(),
            lead,
            trail,
            header: String::new(),
        };
        // Found 2 lines further down than expected.
        let hunk = spec(1, &["a\n", "b\n", "c\n"], &["a\n", "B\n", "c\n"], 1, 1);
        assert_eq!(
            fuzz_apply(b"x\ny\na\nb\nc\n", std::slice::from_ref(&hunk)).unwrap(),
            b"x\ny\na\nB\nc\n"
        );
        // The outer context differs: fuzz 1.
        assert_eq!(
            fuzz_apply(b"A\nb\nC\n", std::slice::from_ref(&hunk)).unwrap(),
            b"A\nB\nC\n"
        );
        // A last line without newline.
        let eof = spec(2, &["b\n", "c"], &["b\n", "c\n", "d"], 2, 0);
        assert_eq!(fuzz_apply(b"a\nb\nc", &[eof]).unwrap(), b"a\nb\nc\nd");
        // Nowhere to be found.
        assert_eq!(fuzz_apply(b"p\nq\n", &[hunk]).unwrap_err(), vec![0]);
        // Into an empty file.
        let add = spec(1, &[], &["new\n"], 0, 0);
        assert_eq!(fuzz_apply(b"", &[add]).unwrap(), b"new\n");
    }

    #[test]
    fn commit_then_status_is_clean_and_reset_cleans_but_keeps_ignored_files() {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join(".gitignore"), "*.log\nbuild/\n").unwrap();
        fs::write(root.join("keep.txt"), "keep\n").unwrap();
        fs::write(root.join("gone.txt"), "gone\n").unwrap();

        // A first commit, on the unborn branch.
        let st = status(root).unwrap();
        assert_eq!(st.branch.as_deref(), Some("main"));
        assert_eq!(st.head, None);
        assert!(!st.clean);
        let first = commit(
            root,
            "first",
            DEFAULT_AUTHOR_NAME,
            DEFAULT_AUTHOR_EMAIL,
            false,
        )
        .unwrap();
        assert_eq!(first.files_changed, 3);
        let st = status(root).unwrap();
        assert!(st.clean, "{st:?}");
        assert_eq!(st.head.as_deref(), Some(first.commit.as_str()));

        // Modified, deleted, untracked and ignored files.
        fs::write(root.join("keep.txt"), "changed\n").unwrap();
        fs::remove_file(root.join("gone.txt")).unwrap();
        write(&root.join("dir/new.txt"), b"new\n");
        fs::write(root.join("debug.log"), "log\n").unwrap();
        let st = status(root).unwrap();
        let summary: Vec<(String, GitFileStatus, bool)> = st
            .entries
            .iter()
            .map(|e| (e.path.clone(), e.status, e.staged))
            .collect();
        assert_eq!(
            summary,
            [
                ("dir/new.txt".to_string(), GitFileStatus::Untracked, false),
                ("gone.txt".to_string(), GitFileStatus::Deleted, false),
                ("keep.txt".to_string(), GitFileStatus::Modified, false),
            ]
        );
        let second = commit(root, "second", "Someone", "someone@example.invalid", false).unwrap();
        assert_eq!(second.files_changed, 3);
        assert!(status(root).unwrap().clean);
        let log = git_text(root, &["log", "-1", "--format=%an|%ae|%s|%P"]);
        assert_eq!(
            log.trim(),
            format!("Someone|someone@example.invalid|second|{}", first.commit)
        );
        assert_eq!(git_text(root, &["status", "--porcelain"]), "");
        // Nothing left to commit.
        let err = commit(root, "third", "a", "b@c", false).unwrap_err();
        assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);
        let empty = commit(root, "empty", "a", "b@c", true).unwrap();
        assert_eq!(empty.files_changed, 0);

        // Reset: modifications and untracked files go, ignored ones stay.
        fs::write(root.join("keep.txt"), "scribbled\n").unwrap();
        fs::remove_file(root.join("dir/new.txt")).unwrap();
        write(&root.join("untracked/deep/x.txt"), b"x\n");
        write(&root.join("mixed/u.txt"), b"u\n");
        write(&root.join("mixed/i.log"), b"i\n");
        write(&root.join("build/out.o"), b"o\n");
        fs::write(root.join("top.txt"), "t\n").unwrap();
        let result = reset(root, None, true, true).unwrap();
        assert_eq!(result.head.as_deref(), Some(empty.commit.as_str()));
        assert_eq!(
            result.removed,
            ["mixed/u.txt", "top.txt", "untracked/deep/x.txt"]
        );
        assert_eq!(
            fs::read_to_string(root.join("keep.txt")).unwrap(),
            "changed\n"
        );
        assert!(root.join("dir/new.txt").exists());
        assert!(!root.join("untracked").exists());
        assert!(root.join("debug.log").exists());
        assert!(root.join("mixed/i.log").exists());
        assert!(root.join("build/out.o").exists());
        assert!(status(root).unwrap().clean);

        // Without keep_ignored, ignored files and directories go too; and a reset to an
        // older commit moves the branch.
        let result = reset(root, Some(&first.commit), true, false).unwrap();
        assert_eq!(result.head.as_deref(), Some(first.commit.as_str()));
        assert_eq!(result.removed, ["build/", "debug.log", "mixed/"]);
        assert!(!root.join("dir").exists());
        assert_eq!(fs::read_to_string(root.join("gone.txt")).unwrap(), "gone\n");
        assert_eq!(git_text(root, &["rev-parse", "HEAD"]).trim(), first.commit);
        assert_eq!(git_text(root, &["status", "--porcelain", "--ignored"]), "");
    }

    #[test]
    fn an_unborn_branch_diffs_against_the_empty_tree_and_resets_to_nothing() {
        let dir = init_repo();
        let root = dir.path();
        write(&root.join("a/b.txt"), b"hello\n");
        write(&root.join("bin"), &[0, 1, 2]);
        let result = diff(root, None, true, true).unwrap();
        assert_eq!(result.files_changed, 2);
        assert_eq!(result.insertions, 1);
        let target = init_repo();
        fs::write(target.path().join(".git/unborn.patch"), &result.patch).unwrap();
        git_cli(target.path(), &["apply", "--index", ".git/unborn.patch"]);
        assert_eq!(snapshot(target.path()), snapshot(root));
        let none = diff(root, None, false, true).unwrap();
        assert_eq!(none.patch, "");

        git_cli(root, &["add", "a/b.txt"]);
        let st = status(root).unwrap();
        assert_eq!(st.entries[0].status, GitFileStatus::Added);
        assert!(st.entries[0].staged);
        let result = reset(root, None, false, true).unwrap();
        assert_eq!(result.head, None);
        assert!(!root.join("a").exists());
        assert!(root.join("bin").exists());
    }

    #[test]
    fn diff_against_an_older_commit_and_staged_renames_in_status() {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("one.txt"), numbered(1..=20, "one")).unwrap();
        commit_all(root, "one");
        let first = git_text(root, &["rev-parse", "HEAD"]);
        fs::write(root.join("two.txt"), "two\n").unwrap();
        commit_all(root, "two");
        fs::write(root.join("three.txt"), "three\n").unwrap();
        let patch = diff_patch(root, Some("HEAD~1")).unwrap();
        assert!(patch.contains("b/two.txt") && patch.contains("b/three.txt"));
        assert_eq!(patch, diff_patch(root, Some(first.trim())).unwrap());

        git_cli(root, &["mv", "one.txt", "uno.txt"]);
        let st = status(root).unwrap();
        let renamed = st
            .entries
            .iter()
            .find(|e| e.status == GitFileStatus::Renamed);
        let renamed = renamed.expect("a staged rename");
        assert_eq!(renamed.path, "uno.txt");
        assert_eq!(renamed.old_path.as_deref(), Some("one.txt"));
        assert!(renamed.staged);
    }

    /// libgit2 refuses repositories owned by another uid unless told otherwise.
    #[test]
    fn a_repository_owned_by_another_uid_works() {
        let dir = random_repo(99);
        let root = dir.path();
        let expected = diff_patch(root, None).unwrap();
        let out = Command::new("chown")
            .args(["-R", "12345:12345"])
            .arg(root)
            .status()
            .unwrap();
        assert!(out.success());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(root.join(".git")).unwrap().uid(), 12345);
        let st = status(root).unwrap();
        assert!(!st.clean);
        assert_eq!(diff_patch(root, None).unwrap(), expected);
        // Nothing was written into the repository by status or diff.
        let root_owned = Command::new("find")
            .arg(root.join(".git"))
            .args(["-not", "-uid", "12345"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&root_owned.stdout), "");
    }

    #[test]
    fn text_that_is_not_utf8_travels_as_a_binary_patch() {
        let dir = init_repo();
        let root = dir.path();
        fs::write(root.join("latin1.txt"), b"caf\xe9\nna\xefve\n").unwrap();
        commit_all(root, "base");
        fs::write(root.join("latin1.txt"), b"caf\xe9 au lait\nna\xefve\n").unwrap();
        fs::write(root.join("plain.txt"), "plain\n").unwrap();
        let result = diff(root, None, true, true).unwrap();
        assert!(
            result.patch.contains("GIT binary patch"),
            "{}",
            result.patch
        );
        assert!(result.patch.contains("+plain"));
        let other = clone(root);
        let other = other.path().join("clone");
        let applied = apply(&other, &result.patch, false, false).unwrap();
        assert!(applied.applied, "{applied:?}");
        assert_eq!(snapshot(&other), snapshot(root));

        // Without binary sections and untracked files.
        let text_only = diff(root, None, false, false).unwrap();
        assert!(!text_only.patch.contains("plain.txt"));
        assert!(text_only.patch.contains("Binary files"));
    }

    /// One HTTP/1.1 exchange with the agent's router: status and JSON body.
    async fn post_json(
        addr: std::net::SocketAddr,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let body = body.to_string();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nx-orchard-token: tok\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap();
        (status, serde_json::from_slice(&raw[split + 4..]).unwrap())
    }

    #[tokio::test]
    async fn routes_answer_over_http() {
        let addr = crate::test_http::serve().await;
        let (dir, patch) = repo_with_patch();
        let repo = dir.path().display().to_string();

        let (code, body) =
            post_json(addr, "/v1/git/status", serde_json::json!({"repo": repo})).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["clean"], true);
        assert_eq!(body["branch"], "main");

        let (code, body) = post_json(
            addr,
            "/v1/git/apply",
            serde_json::json!({"repo": repo, "patch": patch, "check_only": true}),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["applied"], true);
        let (code, body) = post_json(
            addr,
            "/v1/git/apply",
            serde_json::json!({"repo": repo, "patch": patch}),
        )
        .await;
        assert_eq!((code, &body["applied"]), (200, &serde_json::json!(true)));

        let (code, body) = post_json(addr, "/v1/git/diff", serde_json::json!({"repo": repo})).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["patch"], patch);
        assert_eq!(body["files_changed"], 2);

        let (code, body) = post_json(
            addr,
            "/v1/git/commit",
            serde_json::json!({"repo": repo, "message": "over http"}),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["files_changed"], 2);
        let commit = body["commit"].as_str().unwrap().to_string();
        let author = git_text(dir.path(), &["log", "-1", "--format=%an <%ae>"]);
        assert_eq!(author.trim(), "Orchard Agent <agent@orchard.invalid>");

        let (code, body) = post_json(
            addr,
            "/v1/git/reset",
            serde_json::json!({"repo": repo, "target": "HEAD~1"}),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_ne!(body["head"], commit);

        let (code, body) = post_json(
            addr,
            "/v1/git/status",
            serde_json::json!({"repo": "/nowhere"}),
        )
        .await;
        assert_eq!(code, 404, "{body}");
        assert_eq!(body["code"], "not_found");
        assert_eq!(body["message"], "no git repository at /nowhere");
        let (code, body) = post_json(addr, "/v1/git/status", serde_json::json!({})).await;
        assert_eq!(
            (code, &body["code"]),
            (400, &serde_json::json!("invalid_json"))
        );
        let (code, body) = post_json(
            addr,
            "/v1/git/diff",
            serde_json::json!({"repo": repo, "base": "nope"}),
        )
        .await;
        assert_eq!(
            (code, &body["code"]),
            (400, &serde_json::json!("invalid_argument"))
        );
    }
}
