//! The patch apply: all or nothing, conflicts named by file and hunk, the checks
//! before libgit2 (bad modes, NUL bytes, truncated binary data, paths beyond a
//! symbolic link), and the fuzzy fallback.

use std::fs;
use std::os::unix::fs::symlink;

use git2::Diff;

use super::{commit_all, git_cli, git_text, init_repo, numbered, repo_with_patch, snapshot};
use crate::api::git::apply::check_paths;
use crate::api::git::fuzz::TEMP_PREFIX;
use crate::api::git::normalize::normalize_patch;
use crate::api::git::{apply, diff_patch, GitError};

#[test]
fn regression_a_binary_patch_with_truncated_zlib_data_is_refused_not_applied_forever() {
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
fn regression_an_unknown_file_mode_in_a_patch_is_a_bad_patch_not_a_panic() {
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

/// Found by `make fuzz` (git_apply): a rename to a name longer than 255 bytes removed
/// the old file, then failed on the new one, and answered "not applied" with the tree
/// half changed.
#[test]
fn regression_a_rename_to_a_name_too_long_changes_nothing() {
    let dir = init_repo();
    let root = dir.path();
    fs::write(root.join("run.sh"), "echo hi\n").unwrap();
    commit_all(root, "base");
    let long = format!("{}renamed.sh", "\u{fffd}".repeat(100));
    let patch = format!(
        "diff --git a/run.sh b/{long}\nsimilarity index 100%\nrename from run.sh\nrename to {long}\n"
    );
    for (check_only, fuzzy) in [(false, false), (true, false), (false, true)] {
        let err = apply(root, &patch, check_only, fuzzy).unwrap_err();
        assert!(matches!(err, GitError::BadPatch(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("longer than the filesystem allows"),
            "{err}"
        );
    }
    assert_eq!(fs::read(root.join("run.sh")).unwrap(), b"echo hi\n");
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
fn regression_patch_paths_beyond_a_symbolic_link_are_conflicts_not_written_outside() {
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
