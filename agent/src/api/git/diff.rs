//! `diff`: the work tree against a base as a patch `git apply` accepts, staged into an
//! in-memory index and object store so nothing is written into `.git` (see the
//! module docs of `git`), with libgit2's deviations from git's output fixed up.

use std::path::Path;

use git2::{Diff, DiffFindOptions, DiffOptions, IndexAddOption, Patch, Repository, Tree};
use orchard_protocol::git::GitDiff;

use super::repo::{base_tree, git, lossy, open, GitError, MEMPACK_PRIORITY};

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
pub(super) fn stage_work_tree(
    index: &mut git2::Index,
    include_untracked: bool,
) -> Result<(), GitError> {
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
