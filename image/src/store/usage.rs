//! What the store's content occupies and when its images were last handed out: the
//! bookkeeping a budget pass (`crate::gc`) reads through `ImageStore`'s methods.
//!
//! Layer sizes are cached: an installed layer never changes. Sizes are allocated bytes
//! (`st_blocks`), what the disk budget is about, with hard links counted once per layer.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use super::sync::lock;
use crate::digest;
use crate::ImageError;

/// The store's GC bookkeeping.
pub(super) struct GcState {
    /// Allocated bytes per installed layer (`layers/<hex>`), which never changes.
    layer_sizes: Mutex<HashMap<String, u64>>,
    /// When each image name was last handed out by `get`.
    handed_out: Mutex<HashMap<String, Instant>>,
    /// Bumped whenever an image is recorded (pull or import).
    changes: watch::Sender<u64>,
}

impl GcState {
    pub(super) fn new() -> GcState {
        GcState {
            layer_sizes: Mutex::new(HashMap::new()),
            handed_out: Mutex::new(HashMap::new()),
            changes: watch::channel(0).0,
        }
    }

    /// Notes that an image was recorded.
    pub(super) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that changes whenever an image is recorded.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Notes that `reference` was handed out to a sandbox, and marks it recently used.
    pub(super) fn handed_out(&self, reference: &str, record_file: &Path) {
        lock(&self.handed_out).insert(reference.to_string(), Instant::now());
        // Best effort: an unwritable record only makes the LRU order less exact.
        if let Ok(file) = fs::File::options().write(true).open(record_file) {
            let _ = file.set_modified(SystemTime::now());
        }
    }

    /// When `reference` was last handed out by this process, if it was.
    pub(super) fn last_handed_out(&self, reference: &str) -> Option<Instant> {
        lock(&self.handed_out).get(reference).copied()
    }

    /// Sizes of everything in the store at `root`.
    pub(super) fn sizes(&self, root: &Path) -> Result<Sizes, ImageError> {
        let mut out = HashMap::new();
        let layers_dir = root.join("layers");
        let mut cache = lock(&self.layer_sizes);
        let mut seen = HashSet::new();
        for entry in
            fs::read_dir(&layers_dir).map_err(ImageError::io("cannot list", &layers_dir))?
        {
            let entry = entry.map_err(ImageError::io("cannot list", &layers_dir))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if !is_hex_digest(&name) {
                continue;
            }
            let size = *cache
                .entry(name.clone())
                .or_insert_with(|| allocated(&entry.path(), &mut HashSet::new()));
            out.insert(format!("layers/{name}"), size);
            seen.insert(name);
        }
        cache.retain(|name, _| seen.contains(name));
        drop(cache);
        let blobs_dir = root.join("blobs/sha256");
        for entry in fs::read_dir(&blobs_dir).map_err(ImageError::io("cannot list", &blobs_dir))? {
            let entry = entry.map_err(ImageError::io("cannot list", &blobs_dir))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if is_hex_digest(&name) {
                let size = entry.metadata().map_or(0, |m| m.blocks() * 512);
                out.insert(format!("blobs/{name}"), size);
            }
        }
        Ok(Sizes(out))
    }
}

/// Sizes of everything in the store, in allocated bytes, by `layers/<hex>` and
/// `blobs/<hex>` key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Sizes(pub(crate) HashMap<String, u64>);

impl Sizes {
    /// All of it.
    pub(crate) fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

fn is_hex_digest(name: &str) -> bool {
    digest::hex_of(&format!("{}{name}", digest::SHA256_PREFIX)).is_ok()
}

/// Allocated bytes under `path` (not following links), hard links counted once.
pub(super) fn allocated(path: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
        return 0;
    }
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let Ok(entries) = fs::read_dir(path) else {
        return own;
    };
    own + entries
        .flatten()
        .map(|entry| allocated(&entry.path(), seen))
        .sum::<u64>()
}
