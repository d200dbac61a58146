//! libgit2's apply limited to some deltas and hunks of a patch: what `apply` runs
//! whole, `analyze` runs part by part in check mode to find what fails, and `fuzz`
//! runs on the deltas that apply exactly.

use std::cell::Cell;
use std::fs;
use std::path::Path;

use git2::{ApplyLocation, ApplyOptions, Delta, Diff, Repository};

/// Runs libgit2's apply on the work tree for the deltas `deltas` selects and, when
/// given, only the hunks (0-based, per delta) `hunks` selects.
pub(super) fn run_apply(
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
pub(super) fn write_apply(
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
