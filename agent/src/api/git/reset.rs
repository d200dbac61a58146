//! `reset`: `git reset --hard` (also on a branch without commits), plus `git clean
//! -fd` (or `-fdx`).

use std::fs;
use std::io;
use std::path::Path;

use git2::{Repository, ResetType, Status, StatusOptions};
use orchard_protocol::git::GitResetResult;

use super::repo::{
    git, head_commit, io_error, lossy, open, prune_empty_dirs, resolve_commit, workdir, GitError,
};

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
