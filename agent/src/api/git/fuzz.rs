//! The opt-in fuzzy fallback of `apply`: text hunks that fail exactly are placed at
//! another offset and with up to [`MAX_FUZZ`] mismatching context lines at each end,
//! like `patch` does. Every new content is computed in memory and staged beside its
//! target before anything is written.

use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use git2::{Delta, Diff, Patch, Repository};
use orchard_protocol::git::GitConflict;

use super::analyze::{hunk_header, Analysis};
use super::partial::{run_apply, write_apply};
use super::repo::{delta_path, git, io_error, prune_empty_dirs, GitError};

/// Most context lines the fuzzy fallback may ignore at each end of a hunk.
pub const MAX_FUZZ: usize = 2;

/// Prefix of the temporary files the fuzzy fallback writes before renaming them.
pub(super) const TEMP_PREFIX: &str = ".orchard-git-";

/// A text file's new content computed by the fuzzy fallback.
struct Fuzzed {
    /// Path the content goes to (the new path of a rename).
    target: PathBuf,
    /// Path to remove afterwards (the old path of a rename).
    remove: Option<PathBuf>,
    /// The content.
    content: Vec<u8>,
    /// Permission bits of the written file.
    mode: u32,
    /// Path as shown in the answer.
    shown: String,
}

/// The fuzzy fallback: deltas that fail exactly and are plain text changes of one
/// existing file are re-applied here in memory; the rest goes through libgit2. Only
/// when every part succeeds is anything written. Answers (applied, fuzzed, conflicts).
pub(super) fn apply_fuzzy(
    repo: &Repository,
    root: &Path,
    diff: &Diff<'_>,
    analysis: Analysis,
    check_only: bool,
) -> Result<(bool, Vec<String>, Vec<GitConflict>), GitError> {
    let mut fuzzed = Vec::new();
    let mut conflicts = Vec::new();
    for &d in &analysis.failing {
        let exact: Vec<GitConflict> = analysis
            .conflicts
            .iter()
            .filter(|(i, _)| *i == d)
            .map(|(_, c)| c.clone())
            .collect();
        // Only hunks are re-placed: a file that is missing, or a target that already
        // exists, stays a conflict.
        if exact.iter().any(|c| c.hunk.is_none()) {
            conflicts.extend(exact);
            continue;
        }
        match fuzz_delta(root, diff, d, analysis.grouped.contains(&d))? {
            Ok(Some(result)) => fuzzed.push(result),
            // Not a plain text change: its exact conflicts stand.
            Ok(None) => conflicts.extend(exact),
            Err(failed) => conflicts.extend(failed),
        }
    }
    if !conflicts.is_empty() {
        return Ok((false, Vec::new(), conflicts));
    }
    let exact_part = |i: usize| !analysis.failing.contains(&i);
    let any_exact = (0..diff.deltas().len()).any(exact_part);
    if any_exact {
        if let Err(err) = run_apply(repo, diff, &exact_part, None, true) {
            conflicts.push(GitConflict {
                path: String::new(),
                hunk: None,
                header: None,
                reason: err.message().to_string(),
            });
            return Ok((false, Vec::new(), conflicts));
        }
    }
    let shown: Vec<String> = fuzzed.iter().map(|f| f.shown.clone()).collect();
    if check_only {
        return Ok((true, shown, Vec::new()));
    }
    // New contents are first written beside their targets, so the only steps left
    // after libgit2 wrote its part are renames.
    let mut staged = Staged::default();
    for f in &fuzzed {
        staged.write(&f.target, &f.content, f.mode)?;
    }
    if any_exact {
        write_apply(repo, root, diff, &exact_part).map_err(git("apply"))?;
    }
    staged.commit()?;
    for f in &fuzzed {
        if let Some(old) = &f.remove {
            fs::remove_file(old).map_err(io_error("remove", old))?;
            prune_empty_dirs(root, old);
        }
    }
    Ok((true, shown, Vec::new()))
}

/// Fuzzy-applies delta `d`. `Ok(None)` when the delta is not a text change of one
/// existing file (binary, new, deleted, or sharing its path with another delta);
/// `Err` with a conflict per hunk that does not fit anywhere.
#[allow(clippy::type_complexity)]
fn fuzz_delta(
    root: &Path,
    diff: &Diff<'_>,
    d: usize,
    grouped: bool,
) -> Result<Result<Option<Fuzzed>, Vec<GitConflict>>, GitError> {
    let Some(delta) = diff.get_delta(d) else {
        return Ok(Ok(None));
    };
    let fuzzable = matches!(delta.status(), Delta::Modified | Delta::Renamed)
        && !delta.flags().is_binary()
        && !grouped;
    let (Some(old), Some(new)) = (delta.old_file().path(), delta.new_file().path()) else {
        return Ok(Ok(None));
    };
    let Some(patch) = Patch::from_diff(diff, d).map_err(git("apply"))? else {
        return Ok(Ok(None));
    };
    if !fuzzable || patch.num_hunks() == 0 {
        return Ok(Ok(None));
    }
    let old_path = root.join(old);
    let meta = match fs::symlink_metadata(&old_path) {
        Ok(meta) if meta.is_file() => meta,
        _ => return Ok(Ok(None)),
    };
    let content = fs::read(&old_path).map_err(io_error("read", &old_path))?;
    let hunks = hunk_specs(&patch).map_err(git("apply"))?;
    let shown = delta_path(&delta);
    match fuzz_apply(&content, &hunks) {
        Ok(new_content) => {
            let (old_mode, new_mode) = (
                u32::from(delta.old_file().mode()),
                u32::from(delta.new_file().mode()),
            );
            // Keep the file's own permissions unless the patch changes the mode.
            let mode = if old_mode != 0 && new_mode != 0 && old_mode != new_mode {
                if new_mode & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                }
            } else {
                meta.permissions().mode() & 0o7777
            };
            let renamed = old != new;
            Ok(Ok(Some(Fuzzed {
                target: root.join(new),
                remove: renamed.then_some(old_path),
                content: new_content,
                mode,
                shown,
            })))
        }
        Err(failed) => Ok(Err(failed
            .into_iter()
            .map(|h| GitConflict {
                path: shown.clone(),
                hunk: Some(h as u32 + 1),
                header: hunks.get(h).map(|s| s.header.clone()),
                reason: format!(
                    "the hunk's context is nowhere in the file, also not at another \
                     offset with up to {MAX_FUZZ} context lines ignored at each end"
                ),
            })
            .collect())),
    }
}

/// One text hunk as lines, each with its newline (none on a last line without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkSpec {
    /// First line of the hunk in the new file, from 1 (0 for an empty new file).
    pub new_start: usize,
    /// Lines the hunk expects: context and removed lines.
    pub pre: Vec<Vec<u8>>,
    /// Lines it leaves: context and added lines.
    pub post: Vec<Vec<u8>>,
    /// Context lines before the first change.
    pub lead: usize,
    /// Context lines after the last change.
    pub trail: usize,
    /// `@@ -a,b +c,d @@`.
    pub header: String,
}

/// The hunks of a parsed patch as [`HunkSpec`]s.
fn hunk_specs(patch: &Patch<'_>) -> Result<Vec<HunkSpec>, git2::Error> {
    let mut specs = Vec::new();
    for h in 0..patch.num_hunks() {
        let (hunk, count) = patch.hunk(h)?;
        let header = hunk_header(&hunk);
        let new_start = hunk.new_start() as usize;
        let mut lines: Vec<(char, Vec<u8>)> = Vec::new();
        for l in 0..count {
            let line = patch.line_in_hunk(h, l)?;
            match line.origin() {
                c @ (' ' | '+' | '-') => lines.push((c, line.content().to_vec())),
                // "\ No newline at end of file": the line before it has none. (libgit2
                // strips it itself while applying, so it may be gone already.)
                '=' | '>' | '<' => {
                    if let Some((_, last)) = lines.last_mut() {
                        if last.ends_with(b"\n") {
                            last.pop();
                        }
                    }
                }
                _ => {}
            }
        }
        let lead = lines.iter().take_while(|(c, _)| *c == ' ').count();
        let trail = if lead == lines.len() {
            0
        } else {
            lines.iter().rev().take_while(|(c, _)| *c == ' ').count()
        };
        let pre = lines
            .iter()
            .filter(|(c, _)| *c != '+')
            .map(|(_, l)| l.clone())
            .collect();
        let post = lines
            .iter()
            .filter(|(c, _)| *c != '-')
            .map(|(_, l)| l.clone())
            .collect();
        specs.push(HunkSpec {
            new_start,
            pre,
            post,
            lead,
            trail,
            header,
        });
    }
    Ok(specs)
}

/// Splits `content` into lines that keep their newline.
pub(super) fn split_lines(content: &[u8]) -> Vec<Vec<u8>> {
    content
        .split_inclusive(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

/// Applies text hunks to `content` like `patch` does: each hunk is looked for nearest
/// to where it is expected (carrying the offset of the hunk before), first exactly,
/// then ignoring 1, then 2 context lines at each end. Hunks must stay in order and
/// not overlap. Answers the new content, or the 0-based indices of hunks that fit
/// nowhere.
pub fn fuzz_apply(content: &[u8], hunks: &[HunkSpec]) -> Result<Vec<u8>, Vec<usize>> {
    let mut image = split_lines(content);
    let mut failed = Vec::new();
    // Offset at which the previous hunk was found, relative to where it was expected.
    let mut offset: isize = 0;
    // Line count difference of hunks that failed: later `new_start`s assumed them.
    let mut skipped: isize = 0;
    // First line a hunk may start at: after the previous one.
    let mut floor = 0usize;
    for (h, hunk) in hunks.iter().enumerate() {
        if hunk.lead + hunk.trail > hunk.pre.len().min(hunk.post.len()) {
            // Inconsistent counts (not from `hunk_specs`): nothing sensible to place.
            failed.push(h);
            continue;
        }
        let expected = hunk.new_start.saturating_sub(1) as isize + offset - skipped;
        let mut found = None;
        let mut tried = Vec::new();
        for fuzz in 0..=MAX_FUZZ {
            let (lead, trail) = (fuzz.min(hunk.lead), fuzz.min(hunk.trail));
            if tried.contains(&(lead, trail)) {
                // The hunk has no more context to ignore than at the previous level.
                continue;
            }
            tried.push((lead, trail));
            let pre = &hunk.pre[lead..hunk.pre.len() - trail];
            if pre.is_empty() && !hunk.pre.is_empty() {
                // Without any context the hunk would fit anywhere.
                continue;
            }
            let want = expected + lead as isize;
            if let Some(at) = find_lines(&image, pre, want, floor) {
                found = Some((at, want, lead, trail));
                break;
            }
        }
        match found {
            Some((at, want, lead, trail)) => {
                let pre_len = hunk.pre.len() - lead - trail;
                let post = &hunk.post[lead..hunk.post.len() - trail];
                image.splice(at..at + pre_len, post.iter().cloned());
                offset = at as isize - want;
                floor = at + post.len();
            }
            None => {
                failed.push(h);
                skipped += hunk.post.len() as isize - hunk.pre.len() as isize;
            }
        }
    }
    if failed.is_empty() {
        Ok(image.concat())
    } else {
        Err(failed)
    }
}

/// The start of `needle` in `image` at or after `floor`, nearest to `want`.
fn find_lines(image: &[Vec<u8>], needle: &[Vec<u8>], want: isize, floor: usize) -> Option<usize> {
    let last = image.len().checked_sub(needle.len())?;
    if floor > last {
        return None;
    }
    let want = want.clamp(floor as isize, last as isize) as usize;
    let fits = |at: usize| image[at..at + needle.len()] == *needle;
    for distance in 0..=last.max(want) {
        if let Some(at) = want.checked_add(distance).filter(|&at| at <= last) {
            if fits(at) {
                return Some(at);
            }
        }
        if let Some(at) = want.checked_sub(distance).filter(|&at| at >= floor) {
            if distance > 0 && fits(at) {
                return Some(at);
            }
        }
        if want + distance > last && want.saturating_sub(distance) <= floor {
            break;
        }
    }
    None
}

/// Files written next to their targets, renamed over them on `commit`, removed if
/// dropped before.
#[derive(Default)]
struct Staged {
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    fn write(&mut self, target: &Path, content: &[u8], mode: u32) -> Result<(), GitError> {
        let dir = target.parent().unwrap_or(Path::new("/"));
        fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        let temp = dir.join(format!("{TEMP_PREFIX}{}", crate::sys::unique_suffix()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(io_error("write", target))?;
        self.files.push((temp.clone(), target.to_path_buf()));
        file.write_all(content).map_err(io_error("write", target))?;
        drop(file);
        fs::set_permissions(&temp, Permissions::from_mode(mode)).map_err(io_error("write", target))
    }

    fn commit(mut self) -> Result<(), GitError> {
        while let Some((temp, target)) = self.files.pop() {
            if let Err(err) = fs::rename(&temp, &target) {
                let _ = fs::remove_file(&temp);
                return Err(io_error("write", &target)(err));
            }
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (temp, _) in self.files.drain(..) {
            let _ = fs::remove_file(temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_apply_handles_offsets_fuzz_and_missing_final_newlines() {
        let spec = |new_start, pre: &[&str], post: &[&str], lead, trail| HunkSpec {
            new_start,
            pre: pre.iter().map(|l| l.as_bytes().to_vec()).collect(),
            post: post.iter().map(|l| l.as_bytes().to_vec()).collect(),
            lead,
            trail,
            header: String::new(),
        };
        // Found 2 lines further down than expected.
        let hunk = spec(1, &["a\n", "b\n", "c\n"], &["a\n", "B\n", "c\n"], 1, 1);
        assert_eq!(
            fuzz_apply(b"x\ny\na\nb\nc\n", std::slice::from_ref(&hunk)).unwrap(),
            b"x\ny\na\nB\nc\n"
        );
        // The outer context differs: fuzz 1.
        assert_eq!(
            fuzz_apply(b"A\nb\nC\n", std::slice::from_ref(&hunk)).unwrap(),
            b"A\nB\nC\n"
        );
        // A last line without newline.
        let eof = spec(2, &["b\n", "c"], &["b\n", "c\n", "d"], 2, 0);
        assert_eq!(fuzz_apply(b"a\nb\nc", &[eof]).unwrap(), b"a\nb\nc\nd");
        // Nowhere to be found.
        assert_eq!(fuzz_apply(b"p\nq\n", &[hunk]).unwrap_err(), vec![0]);
        // Into an empty file.
        let add = spec(1, &[], &["new\n"], 0, 0);
        assert_eq!(fuzz_apply(b"", &[add]).unwrap(), b"new\n");
    }
}
