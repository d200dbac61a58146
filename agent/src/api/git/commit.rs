//! `commit`: `git add -A` plus a commit on HEAD, with the other heads of a merge in
//! progress as parents.

use std::path::Path;

use git2::{RepositoryState, Signature};
use orchard_protocol::git::GitCommitResult;

use super::diff::stage_work_tree;
use super::repo::{git, head_commit, open, GitError};

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
