//! The static musl `orchard-agent` under test.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's root directory.
fn workspace() -> &'static Path {
    // This crate sits one level below the workspace root.
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The static agent binary under test: `$ORCHARD_AGENT_BIN`, or what `make agent`
/// builds. Fails the test clearly when it does not exist, and warns when a source of
/// the agent is newer than it (its tests would then fail for features the binary does
/// not have yet).
pub fn agent_binary() -> PathBuf {
    let path = std::env::var_os("ORCHARD_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace().join("target/x86_64-unknown-linux-musl/release/orchard-agent")
        });
    assert!(
        path.is_file(),
        "the static agent binary {} does not exist: build it with `make agent` \
         (or point ORCHARD_AGENT_BIN at one)",
        path.display()
    );
    warn_if_stale(&path);
    path
}

/// Warns when a file of the agent's or the protocol's sources is newer than `binary`.
fn warn_if_stale(binary: &Path) {
    let Ok(built) = fs::metadata(binary).and_then(|m| m.modified()) else {
        return;
    };
    let mut newer = Vec::new();
    for dir in ["agent/src", "protocol/src"] {
        newer_files(&workspace().join(dir), built, &mut newer);
    }
    if let Some(first) = newer.first() {
        eprintln!(
            "warning: {} is older than {} of the agent's sources (e.g. {}): rebuild it \
             with `make agent`",
            binary.display(),
            newer.len(),
            first.display()
        );
    }
}

/// Collects the files under `dir` modified after `than`.
fn newer_files(dir: &Path, than: std::time::SystemTime, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_dir() {
            newer_files(&entry.path(), than, out);
        } else if meta.modified().is_ok_and(|t| t > than) {
            out.push(entry.path());
        }
    }
}
