//! Helpers shared by the fuzz targets: a per-process scratch directory and a snapshot of
//! a directory tree, to assert what an operation may and may not have changed.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One entry of a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A regular file: mode bits and content.
    File { mode: u32, content: Vec<u8> },
    /// A directory: mode bits.
    Dir { mode: u32 },
    /// A symbolic link: its target.
    Link { target: PathBuf },
    /// Anything else (fifo, device, socket): its file type bits.
    Other { kind: u32 },
}

/// Every entry under a directory, by path relative to it; links are not followed.
pub type Snapshot = BTreeMap<PathBuf, Node>;

/// Snapshots `root` (which must exist).
pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn walk(root: &Path, rel: &Path, out: &mut Snapshot) {
    let dir = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("read_dir entry").file_name())
        .collect();
    entries.sort();
    for name in entries {
        let rel = rel.join(name);
        let path = root.join(&rel);
        let meta =
            fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
        let mode = meta.permissions().mode() & 0o7777;
        let node = if meta.file_type().is_symlink() {
            Node::Link {
                target: fs::read_link(&path).expect("readlink"),
            }
        } else if meta.is_dir() {
            Node::Dir { mode }
        } else if meta.is_file() {
            Node::File {
                mode,
                content: fs::read(&path).expect("read"),
            }
        } else {
            Node::Other {
                kind: meta.mode() & 0o170000,
            }
        };
        let is_dir = matches!(node, Node::Dir { .. });
        out.insert(rel.clone(), node);
        if is_dir {
            walk(root, &rel, out);
        }
    }
}

/// The differences between two snapshots, for an assertion message.
pub fn diff(before: &Snapshot, after: &Snapshot) -> String {
    let mut out = String::new();
    for (path, node) in before {
        match after.get(path) {
            None => out.push_str(&format!("removed {}\n", path.display())),
            Some(n) if n != node => out.push_str(&format!("changed {}\n", path.display())),
            _ => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        out.push_str(&format!("added {}\n", path.display()));
    }
    out
}

/// A directory private to this fuzzing process, made once, emptied by the caller.
pub fn scratch(name: &str) -> PathBuf {
    let base = std::env::temp_dir().join(format!("orchard-fuzz-{name}-{}", std::process::id()));
    if !base.exists() {
        fs::create_dir_all(&base).expect("create scratch dir");
    }
    base
}

/// Removes `path` whatever it is (a missing path is fine), making writable what a
/// fuzzed input made read-only so that it can go.
pub fn remove_all(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o700));
        if let Ok(entries) = fs::read_dir(path) {
            for entry in entries.flatten() {
                remove_all(&entry.path());
            }
        }
        fs::remove_dir(path).unwrap_or_else(|e| panic!("rmdir {}: {e}", path.display()));
    } else {
        fs::remove_file(path).unwrap_or_else(|e| panic!("rm {}: {e}", path.display()));
    }
}

/// Copies a tree (files, directories, links; modes kept).
pub fn copy_tree(from: &Path, to: &Path) {
    let meta = fs::symlink_metadata(from).expect("lstat");
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from).expect("readlink"), to).expect("symlink");
    } else if meta.is_dir() {
        fs::create_dir(to).expect("mkdir");
        for entry in fs::read_dir(from).expect("read_dir").flatten() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
        fs::set_permissions(to, meta.permissions()).expect("chmod");
    } else {
        fs::copy(from, to).expect("copy");
    }
}

/// Asserts that `value` survives a serialize/deserialize round trip unchanged.
pub fn round_trip<T>(value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let text = serde_json::to_string(value).expect("a parsed value serializes");
    let again: T =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text} does not parse back: {e}"));
    assert_eq!(&again, value, "round trip through {text}");
}
