//! The agent's patch apply (`POST /v1/git/apply`, and through it the compatible
//! `apply_patch`): `git::apply` of arbitrary patch text, with and without `check_only`
//! and the fuzzy fallback, on a committed repository whose work tree holds links
//! pointing out of it. Invariants: nothing outside the work tree changes (a patch path
//! with `..`, an absolute path or a path through a link does not escape); `.git` is
//! never written; a patch that is refused, does not apply or is only checked changes
//! nothing (all or nothing).
#![no_main]

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use orchard_agent::api::git::{apply, commit};
use orchard_fuzz::{copy_tree, diff, remove_all, scratch, snapshot, Snapshot};

struct Fixture {
    base: PathBuf,
    pristine: Snapshot,
}

fn numbered(prefix: &str, n: usize) -> String {
    (1..=n).map(|i| format!("{prefix} line {i}\n")).collect()
}

fn template(base: &Path) -> PathBuf {
    let outside = base.join("outside");
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("secret"), b"outside\n").unwrap();
    let repo = base.join("template");
    git2::Repository::init(&repo).unwrap();
    fs::write(repo.join("a.txt"), numbered("a", 20)).unwrap();
    fs::create_dir_all(repo.join("dir/deep")).unwrap();
    fs::write(repo.join("dir/b.txt"), numbered("b", 5)).unwrap();
    fs::write(repo.join("dir/deep/c.txt"), "c\n").unwrap();
    fs::write(repo.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(repo.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(repo.join("bin.dat"), [0u8, 1, 2, 0, 255, 10]).unwrap();
    fs::write(repo.join("empty"), b"").unwrap();
    fs::write(repo.join("a file with spaces.txt"), "spaces\n").unwrap();
    symlink("a.txt", repo.join("link")).unwrap();
    // Links out of the work tree, committed as links: writing through them escapes.
    symlink("../outside", repo.join("out")).unwrap();
    symlink(&outside, repo.join("abs")).unwrap();
    symlink("../outside/secret", repo.join("secret-link")).unwrap();
    commit(&repo, "base", "fuzz", "fuzz@orchard.invalid", false).unwrap();
    repo
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let base = scratch("git");
        remove_all(&base);
        fs::create_dir_all(&base).unwrap();
        let template = template(&base);
        copy_tree(&template, &base.join("repo"));
        let pristine = snapshot(&base);
        Fixture { base, pristine }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, patch)) = data.split_first() else {
        return;
    };
    let (check_only, fuzzy) = (flags & 1 != 0, flags & 2 != 0);
    let patch = String::from_utf8_lossy(patch);
    let fx = fixture();
    let repo = fx.base.join("repo");

    let result = apply(&repo, &patch, check_only, fuzzy);
    let after = snapshot(&fx.base);

    let mut changed_outside = Snapshot::new();
    let mut outside_after = Snapshot::new();
    for (path, node) in &fx.pristine {
        if !path.starts_with("repo") || path.starts_with("repo/.git") {
            changed_outside.insert(path.clone(), node.clone());
        }
    }
    for (path, node) in &after {
        if !path.starts_with("repo") || path.starts_with("repo/.git") {
            outside_after.insert(path.clone(), node.clone());
        }
    }
    assert!(
        changed_outside == outside_after,
        "apply changed files outside the work tree or in .git ({result:?}):\n{}",
        diff(&changed_outside, &outside_after)
    );
    let applied = matches!(&result, Ok(r) if r.applied) && !check_only;
    if !applied {
        assert!(
            after == fx.pristine,
            "apply (check_only {check_only}, fuzzy {fuzzy}) answered {result:?} but changed:\n{}",
            diff(&fx.pristine, &after)
        );
    } else if after != fx.pristine {
        remove_all(&repo);
        copy_tree(&fx.base.join("template"), &repo);
    }
});
