//! Tests of the git capability that go through several operations, against real
//! repositories made with the git CLI: this module holds the helpers, `apply` the
//! patch apply (exact and fuzzy), `roundtrip` our diff and apply against the git CLI
//! on random repositories, `worktree` status, commit and reset, and `api` the errors
//! and routes as a client sees them.

use std::collections::BTreeMap;
use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::api::git::diff_patch;

mod api;
mod apply;
mod roundtrip;
mod worktree;

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
