//! Patch text rewritten into what libgit2's patch parser reads, without changing its
//! meaning: paths with spaces quoted, extended header lines in git's order, and the
//! `---`/`+++` lines of an empty new or deleted file.

/// Rewrites what libgit2's patch parser cannot read in patches git (and libgit2's own
/// diff) print, without changing their meaning:
///
/// - `diff --git a/x y b/x y`: git leaves names with spaces unquoted there; the parser
///   then cannot split the line and needs `---`/`+++` or rename lines for the paths,
///   which binary, mode-only and empty-file sections lack. The paths get quoted, split
///   by git's own rule: both halves name the same path after their prefix. Rename and
///   copy paths with spaces are quoted too: the parser stops at a space there.
/// - The extended header lines are put in git's order (libgit2 prints a rename's
///   mode change after the rename lines, and then cannot parse it back).
/// - A new or deleted empty file is a header ending in its `index` line; the parser
///   wants more after it, so the `---`/`+++` lines are added.
pub(super) fn normalize_patch(patch: &str) -> String {
    const HEADER: &str = "diff --git ";
    // Extended header lines in the order git prints them.
    const EXTENDED: &[(&str, u8)] = &[
        ("old mode ", 0),
        ("new mode ", 1),
        ("deleted file mode ", 2),
        ("new file mode ", 2),
        ("similarity index ", 3),
        ("dissimilarity index ", 3),
        ("rename from ", 4),
        ("copy from ", 4),
        ("rename to ", 5),
        ("copy to ", 5),
        ("index ", 6),
    ];
    let rank = |line: &str| {
        EXTENDED
            .iter()
            .find(|(key, _)| line.starts_with(key))
            .map(|&(_, rank)| rank)
    };
    let lines: Vec<&str> = patch.split_inclusive('\n').collect();
    let mut out = String::with_capacity(patch.len() + 256);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(rest) = line.strip_prefix(HEADER) else {
            out.push_str(line);
            continue;
        };
        let body = rest.trim_end_matches(['\n', '\r']);
        let paths = split_header_paths(body);
        match &paths {
            Some((left, right)) => {
                out.push_str(HEADER);
                out.push_str(left);
                out.push(' ');
                out.push_str(right);
                out.push_str(&rest[body.len()..]);
            }
            None => out.push_str(line),
        }
        let mut extended: Vec<(u8, String)> = Vec::new();
        while let Some(rank) = lines.get(i).and_then(|l| rank(l)) {
            let mut line = lines[i].to_string();
            i += 1;
            if !line.ends_with('\n') {
                line.push('\n');
            }
            if let Some(key) = ["rename from ", "rename to ", "copy from ", "copy to "]
                .into_iter()
                .find(|key| line.starts_with(key))
            {
                let path = line[key.len()..].trim_end_matches(['\n', '\r']);
                if path.contains(' ') && !path.starts_with('"') {
                    line = format!("{key}{}{}", c_quote(path), &line[key.len() + path.len()..]);
                }
            }
            extended.push((rank, line));
        }
        // Stable: equal ranks keep their order.
        extended.sort_by_key(|(rank, _)| *rank);
        let creates = extended.iter().find_map(|(_, l)| {
            if l.starts_with("new file mode ") {
                Some(true)
            } else if l.starts_with("deleted file mode ") {
                Some(false)
            } else {
                None
            }
        });
        let has_index = extended.iter().any(|(_, l)| l.starts_with("index "));
        for (_, l) in &extended {
            out.push_str(l);
        }
        let section_ends = lines.get(i).is_none_or(|next| next.starts_with(HEADER));
        if let (true, true, Some(creates), Some((left, right))) =
            (section_ends, has_index, creates, &paths)
        {
            let (old, new) = if creates {
                ("/dev/null", right.as_str())
            } else {
                (left.as_str(), "/dev/null")
            };
            out.push_str(&format!("--- {old}\n+++ {new}\n"));
        }
    }
    out
}

/// The two paths of a `diff --git` line (after the prefix), quoted when they hold a
/// space; `None` when the line cannot be split unambiguously.
fn split_header_paths(body: &str) -> Option<(String, String)> {
    if let Some(quoted) = body.strip_prefix('"') {
        // C-quoted by git already: the first token ends at an unescaped quote.
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| {
            let close = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            close.then_some(i)
        })?;
        let left = &body[..end + 2];
        let right = body[end + 2..].strip_prefix(' ')?;
        return Some((left.to_string(), right.to_string()));
    }
    if !body.contains(' ') {
        return None;
    }
    if body.matches(' ').count() == 1 {
        let (left, right) = body.split_once(' ')?;
        return Some((left.to_string(), right.to_string()));
    }
    if body.ends_with('"') {
        // Plain old path, quoted new path.
        let start = body.rfind(" \"")?;
        return Some((body[..start].to_string(), body[start + 1..].to_string()));
    }
    let half = body.len().checked_sub(1)? / 2;
    let (left, right) = (body.get(..half)?, body.get(half + 1..)?);
    let same = body.as_bytes().get(half) == Some(&b' ')
        && left.split_once('/').map(|(_, p)| p) == right.split_once('/').map(|(_, p)| p);
    same.then(|| (c_quote(left), c_quote(right)))
}

/// Quotes a path the way git does for names it must quote (only `"` and `\\` need
/// escaping here: names with control characters arrive quoted already).
fn c_quote(path: &str) -> String {
    format!("\"{}\"", path.replace('\\', "\\\\").replace('"', "\\\""))
}
