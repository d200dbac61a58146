//! Status, diff, commit and reset of a work tree: unborn branches, staged renames,
//! ignored and untracked files.

use std::fs;

use orchard_protocol::git::GitFileStatus;
use orchard_protocol::ErrorCode;

use super::{commit_all, git_cli, git_text, init_repo, numbered, snapshot, write};
use crate::api::git::{
    commit, diff, diff_patch, reset, status, DEFAULT_AUTHOR_EMAIL, DEFAULT_AUTHOR_NAME,
};
use crate::error::ApiError;

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
