//! `apply`: a patch applied to the work tree all or nothing, after the checks
//! libgit2 does not make itself (file modes, missing paths, binary data that does not
//! inflate, targets that exist already or lie beyond a symbolic link). The patch text
//! is first fixed up by `normalize`; when it does not apply, `analyze` names the
//! failing files and hunks and, when asked, `fuzz` places them elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path};

use git2::{Delta, Diff};
use orchard_protocol::git::{GitApplyResult, GitConflict};

use super::analyze::analyze;
use super::fuzz::apply_fuzzy;
use super::normalize::normalize_patch;
use super::partial::{run_apply, write_apply};
use super::repo::{delta_path, git, lossy, open, workdir, GitError, MEMPACK_PRIORITY};

/// Applies `patch` to the work tree of `repo`, all or nothing. A patch that does not
/// apply is answered with `applied: false` and the conflicts, not as an error.
pub fn apply(
    repo: &Path,
    patch: &str,
    check_only: bool,
    fuzzy: bool,
) -> Result<GitApplyResult, GitError> {
    let repo = open(repo)?;
    let root = workdir(&repo)?;
    // libgit2 reads the patch's paths as C strings: a NUL inside a header line cut
    // one short and left a delta with no new path, which its apply then passed to
    // strcmp (a segfault, found by fuzzing). Git never prints a NUL in a patch: text
    // with one is binary and travels as a `GIT binary patch`, in base85.
    if let Some(at) = patch.find('\0') {
        return Err(GitError::BadPatch(format!(
            "it contains a NUL byte (at byte {at}); binary content travels as a GIT binary patch"
        )));
    }
    let patch = normalize_patch(patch);
    let diff = Diff::from_buffer(patch.as_bytes())
        .map_err(|err| GitError::BadPatch(err.message().to_string()))?;
    let count = diff.deltas().len();
    if count == 0 {
        return Err(GitError::BadPatch("it changes no file".into()));
    }
    check_modes(&diff)?;
    check_paths(&diff)?;
    check_binary_data(&diff)?;
    // libgit2 writes every post-image as a blob before checking it out, also in check
    // mode; they stay in memory.
    let odb = repo.odb().map_err(git("apply"))?;
    let _mempack = odb
        .add_new_mempack_backend(MEMPACK_PRIORITY)
        .map_err(git("apply"))?;
    let files: Vec<String> = diff.deltas().map(|d| delta_path(&d)).collect();
    let result = |applied, fuzzed, conflicts| GitApplyResult {
        applied,
        files: files.clone(),
        fuzzed,
        conflicts,
    };

    // libgit2's check mode stops before the checkout, which is where a new file that
    // already exists would be refused; that one is checked here. So are paths beyond
    // a symbolic link, which libgit2 would write through.
    let mut existing = existing_targets(&diff, &root);
    for (i, conflict) in beyond_links(&diff, &root) {
        existing.entry(i).or_insert(conflict);
    }
    let whole_error = if existing.is_empty() {
        let all = |_| true;
        let applied = if check_only {
            run_apply(&repo, &diff, &all, None, true)
        } else {
            write_apply(&repo, &root, &diff, &all)
        };
        match applied {
            Ok(()) => return Ok(result(true, Vec::new(), Vec::new())),
            Err(err) => Some(err),
        }
    } else {
        None
    };

    let analysis = analyze(&repo, &diff, &existing)?;
    if analysis.conflicts.is_empty() {
        // Every part applies on its own and together in check mode, yet the real
        // apply failed: the checkout itself (I/O, a lock), not the patch.
        let message = whole_error.map_or_else(String::new, |e| e.message().to_string());
        return Err(GitError::Git {
            what: "apply",
            message,
        });
    }
    if !fuzzy {
        let conflicts = analysis.conflicts.into_iter().map(|(_, c)| c).collect();
        return Ok(result(false, Vec::new(), conflicts));
    }
    apply_fuzzy(&repo, &root, &diff, analysis, check_only)
        .map(|(applied, fuzzed, conflicts)| result(applied, fuzzed, conflicts))
}

/// Deltas that create a path (new file, rename target) that already exists in the
/// work tree and that no earlier delta of the patch removes, with their conflict.
fn existing_targets(diff: &Diff<'_>, root: &Path) -> BTreeMap<usize, GitConflict> {
    let mut freed = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (i, delta) in diff.deltas().enumerate() {
        let old = delta.old_file().path_bytes().map(lossy);
        let new = delta.new_file().path_bytes().map(lossy);
        if matches!(delta.status(), Delta::Deleted | Delta::Renamed) {
            if let Some(old) = &old {
                freed.insert(old.clone());
            }
        }
        if !matches!(
            delta.status(),
            Delta::Added | Delta::Renamed | Delta::Copied
        ) {
            continue;
        }
        let Some(new) = new else { continue };
        if freed.contains(&new) {
            continue;
        }
        if fs::symlink_metadata(root.join(&new)).is_ok() {
            out.insert(
                i,
                GitConflict {
                    path: new,
                    hunk: None,
                    header: None,
                    reason: "already exists in the working directory".into(),
                },
            );
        }
    }
    out
}

/// Deltas with a path (old or new) that leaves the work tree: through a symbolic link
/// in the work tree, or by a `..` or absolute component. libgit2 writes through a
/// linked parent directory (a new `out/x` with `out -> ../elsewhere` lands in
/// `../elsewhere/x`), so these are conflicts, as `git apply` refuses a path "beyond a
/// symbolic link". The last component may be a link: a patch changes the link itself.
fn beyond_links(diff: &Diff<'_>, root: &Path) -> BTreeMap<usize, GitConflict> {
    let mut out = BTreeMap::new();
    for (i, delta) in diff.deltas().enumerate() {
        for file in [delta.old_file(), delta.new_file()] {
            let Some(path) = file.path() else { continue };
            if let Some(reason) = escape_reason(root, path) {
                out.entry(i).or_insert(GitConflict {
                    path: path.to_string_lossy().into_owned(),
                    hunk: None,
                    header: None,
                    reason,
                });
            }
        }
    }
    out
}

/// Why `rel` leaves the work tree `root`, if it does.
fn escape_reason(root: &Path, rel: &Path) -> Option<String> {
    let parts: Vec<Component<'_>> = rel.components().collect();
    let mut dir = root.to_path_buf();
    for (n, part) in parts.iter().enumerate() {
        let Component::Normal(name) = part else {
            return Some("the path is not inside the working directory".into());
        };
        if n + 1 == parts.len() {
            break;
        }
        dir.push(name);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let shown = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
                return Some(format!("it is beyond a symbolic link ({shown})"));
            }
            Ok(_) => {}
            // Missing: the apply creates it as a directory.
            Err(_) => return None,
        }
    }
    None
}

/// File modes git writes (and `0`: no file on that side).
const KNOWN_MODES: [u32; 7] = [
    0, 0o040000, 0o100644, 0o100664, 0o100755, 0o120000, 0o160000,
];

/// Refuses a patch with a file mode git does not know. libgit2's parser takes any octal
/// number, and git2's `DiffFile::mode` panics on one it does not know (`new file mode
/// 120644` made the apply route answer 500).
fn check_modes(diff: &Diff<'_>) -> Result<(), GitError> {
    for delta in diff.deltas() {
        for file in [delta.old_file(), delta.new_file()] {
            // SAFETY: `raw` points at the `git_diff_file` that `file` borrows from the
            // diff, alive and unchanged while `diff` is.
            let mode = u32::from(unsafe { (*git2::Binding::raw(&file)).mode });
            if !KNOWN_MODES.contains(&mode) {
                return Err(GitError::BadPatch(format!(
                    "{}: unknown file mode {mode:o}",
                    delta_path(&delta)
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a delta without an old or a new path. libgit2's parser gives both to every
/// delta it reads from a well-formed patch (the same path twice for an added or a
/// deleted file), and its apply compares them without checking for none.
///
/// Also refuses a path the filesystem cannot hold (a name over [`MAX_NAME`] bytes or a
/// path over [`MAX_PATH`]): libgit2 applies file by file, so a rename to such a name
/// removed the old file and then failed, leaving the tree half changed (found by
/// fuzzing).
pub(super) fn check_paths(diff: &Diff<'_>) -> Result<(), GitError> {
    for delta in diff.deltas() {
        let (Some(old), Some(new)) = (delta.old_file().path_bytes(), delta.new_file().path_bytes())
        else {
            return Err(GitError::BadPatch(format!(
                "{}: a file header without both paths",
                delta_path(&delta)
            )));
        };
        for path in [old, new] {
            let long_name = path.split(|b| *b == b'/').any(|n| n.len() > MAX_NAME);
            if long_name || path.len() > MAX_PATH {
                return Err(GitError::BadPatch(format!(
                    "{}: a path longer than the filesystem allows ({MAX_NAME} bytes a name, \
                     {MAX_PATH} a path)",
                    delta_path(&delta)
                )));
            }
        }
    }
    Ok(())
}

/// Longest file name Linux filesystems take (`NAME_MAX`).
const MAX_NAME: usize = 255;
/// Longest path the work tree's paths may have (`PATH_MAX` less room for the tree's
/// own location).
const MAX_PATH: usize = 3072;

/// Refuses a binary hunk whose zlib data does not inflate to exactly its stated size.
/// libgit2 (1.9) loops forever, never returning, on zlib data that ends early
/// (libgit2 issue #7342): the data is inflated here first, with a bounded output.
fn check_binary_data(diff: &Diff<'_>) -> Result<(), GitError> {
    let mut problem = None;
    let mut check = |delta: git2::DiffDelta<'_>, binary: git2::DiffBinary<'_>| {
        for (side, file) in [("old", binary.old_file()), ("new", binary.new_file())] {
            if matches!(file.kind(), git2::DiffBinaryKind::None) {
                continue;
            }
            if let Err(reason) = inflate_exactly(file.data(), file.inflated_len()) {
                problem = Some(format!(
                    "the binary {side} data of {}: {reason}",
                    delta_path(&delta)
                ));
                return false;
            }
        }
        true
    };
    let walked = diff.foreach(&mut |_, _| true, Some(&mut check), None, None);
    if let Some(problem) = problem {
        return Err(GitError::BadPatch(problem));
    }
    walked.map_err(|err| GitError::BadPatch(err.message().to_string()))
}

/// Inflates zlib `data` into nothing, failing unless it ends within `data` and makes
/// exactly `len` bytes.
fn inflate_exactly(data: &[u8], len: usize) -> Result<(), String> {
    let mut inflater = flate2::Decompress::new(true);
    let mut sink = vec![0u8; 64 * 1024];
    loop {
        let (read, made) = (inflater.total_in(), inflater.total_out());
        let rest = data.get(read as usize..).unwrap_or_default();
        let status = inflater
            .decompress(rest, &mut sink, flate2::FlushDecompress::Finish)
            .map_err(|err| format!("it is not valid zlib data ({err})"))?;
        if inflater.total_out() > len as u64 {
            return Err(format!("it inflates to more than the stated {len} bytes"));
        }
        match status {
            flate2::Status::StreamEnd => break,
            _ if inflater.total_in() == read && inflater.total_out() == made => {
                return Err("its zlib data ends early".into())
            }
            _ => {}
        }
    }
    if inflater.total_out() != len as u64 {
        return Err(format!(
            "it inflates to {} bytes, not the stated {len}",
            inflater.total_out()
        ));
    }
    Ok(())
}
