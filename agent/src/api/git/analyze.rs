//! Why a patch does not apply: deltas that share a path are checked together, then
//! the deltas of a failing group alone, then each hunk of a failing delta alone, all
//! in libgit2's check mode, to name the failing files and hunks.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use git2::{Diff, Patch, Repository};
use orchard_protocol::git::GitConflict;

use super::partial::run_apply;
use super::repo::{delta_path, git, GitError};

/// Why a patch does not apply.
pub(super) struct Analysis {
    /// Conflicts with the index of the delta each belongs to, in patch order.
    pub(super) conflicts: Vec<(usize, GitConflict)>,
    /// Deltas that fail, alone or with the others touching the same paths.
    pub(super) failing: BTreeSet<usize>,
    /// Deltas that share a path with another delta.
    pub(super) grouped: BTreeSet<usize>,
}

/// Finds the files and hunks of a patch that do not apply. Deltas that touch the same
/// path (a type change is a deletion plus an addition) are checked together, then
/// the deltas of a failing group alone, then each hunk of a failing delta alone.
pub(super) fn analyze(
    repo: &Repository,
    diff: &Diff<'_>,
    existing: &BTreeMap<usize, GitConflict>,
) -> Result<Analysis, GitError> {
    let groups = path_groups(diff);
    let mut analysis = Analysis {
        conflicts: Vec::new(),
        failing: BTreeSet::new(),
        grouped: groups
            .iter()
            .filter(|g| g.len() > 1)
            .flatten()
            .copied()
            .collect(),
    };
    for group in groups {
        let mut group_conflicts = Vec::new();
        for &d in &group {
            if let Some(conflict) = existing.get(&d) {
                group_conflicts.push((d, conflict.clone()));
            }
        }
        let in_group = |i: usize| group.contains(&i) && !existing.contains_key(&i);
        let Err(group_error) = run_apply(repo, diff, &in_group, None, true) else {
            if !group_conflicts.is_empty() {
                analysis.failing.extend(group.iter().copied());
                analysis.conflicts.extend(group_conflicts);
            }
            continue;
        };
        for &d in group.iter().filter(|d| !existing.contains_key(d)) {
            group_conflicts.extend(delta_conflicts(repo, diff, d)?);
        }
        if group_conflicts.is_empty() {
            let path = diff.get_delta(group[0]).map(|d| delta_path(&d));
            group_conflicts.push((
                group[0],
                GitConflict {
                    path: path.unwrap_or_default(),
                    hunk: None,
                    header: None,
                    reason: group_error.message().to_string(),
                },
            ));
        }
        analysis.failing.extend(group.iter().copied());
        analysis.conflicts.extend(group_conflicts);
    }
    analysis.conflicts.sort_by_key(|(d, c)| (*d, c.hunk));
    Ok(analysis)
}

/// Deltas grouped by shared paths (old or new), each group in patch order.
fn path_groups(diff: &Diff<'_>) -> Vec<Vec<usize>> {
    let count = diff.deltas().len();
    let mut parent: Vec<usize> = (0..count).collect();
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut owner: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, delta) in diff.deltas().enumerate() {
        for file in [delta.old_file(), delta.new_file()] {
            let Some(path) = file.path_bytes() else {
                continue;
            };
            match owner.get(path) {
                Some(&j) => {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    parent[a] = b;
                }
                None => {
                    owner.insert(path.to_vec(), i);
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..count {
        let root = find(&mut parent, i);
        groups.entry(root).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    groups.sort_by_key(|g| g[0]);
    groups
}

/// The conflicts of delta `d` checked alone: the file itself, else each hunk alone.
fn delta_conflicts(
    repo: &Repository,
    diff: &Diff<'_>,
    d: usize,
) -> Result<Vec<(usize, GitConflict)>, GitError> {
    let Some(delta) = diff.get_delta(d) else {
        return Ok(Vec::new());
    };
    let path = delta_path(&delta);
    let only = |i: usize| i == d;
    let conflict = |hunk: Option<(u32, String)>, reason: &str| {
        let (hunk, header) = hunk.unzip();
        (
            d,
            GitConflict {
                path: path.clone(),
                hunk,
                header,
                reason: reason.to_string(),
            },
        )
    };
    // With every hunk skipped only the file itself is checked: that it exists, and
    // binary patches (which have no hunks).
    if let Err(err) = run_apply(repo, diff, &only, Some(&|_| false), true) {
        return Ok(vec![conflict(None, err.message())]);
    }
    let patch = Patch::from_diff(diff, d).map_err(git("apply"))?;
    let mut out = Vec::new();
    let hunks = patch.as_ref().map_or(0, Patch::num_hunks);
    for h in 0..hunks {
        let one = |i: usize| i == h;
        if let Err(err) = run_apply(repo, diff, &only, Some(&one), true) {
            let header = patch
                .as_ref()
                .and_then(|p| p.hunk(h).ok())
                .map(|(hunk, _)| hunk_header(&hunk))
                .unwrap_or_default();
            out.push(conflict(Some((h as u32 + 1, header)), err.message()));
        }
    }
    if out.is_empty() {
        // Each hunk applies alone but not all of them together (they overlap).
        if let Err(err) = run_apply(repo, diff, &only, None, true) {
            out.push(conflict(None, err.message()));
        }
    }
    Ok(out)
}

pub(super) fn hunk_header(hunk: &git2::DiffHunk<'_>) -> String {
    format!(
        "@@ -{},{} +{},{} @@",
        hunk.old_start(),
        hunk.old_lines(),
        hunk.new_start(),
        hunk.new_lines()
    )
}
