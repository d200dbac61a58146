//! `status`: the branch, HEAD and the changed paths of a repository, staged and
//! unstaged, with renames.

use std::path::Path;

use git2::{Status, StatusOptions};
use orchard_protocol::git::{GitFileStatus, GitStatus, GitStatusEntry};

use super::repo::{git, head_commit, lossy, open, GitError};

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
