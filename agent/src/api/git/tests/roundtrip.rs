//! Our diff and apply against the git CLI on random repositories (text, binary,
//! executable, empty and renamed files, nested directories): each side's patch
//! applied by the other reproduces the work tree.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::process::Command;

use super::{clone, commit_all, git_cli, git_text, init_repo, set_exec, snapshot, write};
use crate::api::git::fuzz::split_lines;
use crate::api::git::{apply, diff, diff_patch, status};

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
                let content =
                    if !is_binary(&content) && split_lines(&content).len() > 10 && rng.chance(50) {
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

/// libgit2 refuses repositories owned by another uid unless told otherwise.
#[test]
fn a_repository_owned_by_another_uid_works() {
    orchard_test_support::require_root!("chown to another uid");
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
