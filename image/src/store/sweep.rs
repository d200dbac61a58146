//! The sweep of `ImageStore::gc`, and its [`GcReport`]: layers and blobs that no image
//! record names, no running pull or import has pinned and no running sandbox uses are
//! moved out of sight, then removed.

use std::collections::HashSet;
use std::fs;
use std::path::PathBuf;

use super::inner::Inner;
use super::sync::lock;
use super::usage::allocated;
use crate::digest;
use crate::ImageError;

/// What [`crate::ImageStore::gc`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Unpacked layer directories removed.
    pub layers_removed: usize,
    /// Blobs (manifests, configs) removed.
    pub blobs_removed: usize,
    /// Bytes freed (allocated blocks).
    pub bytes_freed: u64,
    /// Images forgotten to meet the disk budget, least recently used first.
    pub images_removed: Vec<String>,
}
impl Inner {
    pub(super) fn gc(&self, in_use: &[PathBuf]) -> Result<GcReport, ImageError> {
        let mut doomed = Vec::new();
        let mut report = GcReport::default();
        {
            let _records = lock(&self.records);
            let records = self.read_records(true)?;
            let mut keep: HashSet<String> = HashSet::new();
            for record in &records {
                keep.extend(record.keys()?);
            }
            for path in in_use {
                if let Some(name) = path.file_name() {
                    keep.insert(format!("layers/{}", name.to_string_lossy()));
                }
            }
            let pins = lock(&self.pins);
            for (kind, dir) in [
                ("layers", self.root.join("layers")),
                ("blobs", self.root.join("blobs/sha256")),
            ] {
                for entry in fs::read_dir(&dir).map_err(ImageError::io("cannot list", &dir))? {
                    let entry = entry.map_err(ImageError::io("cannot list", &dir))?;
                    let name = entry.file_name().to_string_lossy().to_string();
                    if digest::hex_of(&format!("{}{name}", digest::SHA256_PREFIX)).is_err() {
                        continue; // not ours
                    }
                    let key = format!("{kind}/{name}");
                    if keep.contains(&key) || pins.contains_key(&key) {
                        continue;
                    }
                    // Out of sight first (atomic), deleted later outside the locks: a
                    // crash midway leaves junk in tmp/, never a half layer in layers/.
                    let grave = self.work_path("gc");
                    fs::rename(entry.path(), &grave)
                        .map_err(ImageError::io("cannot remove", &entry.path()))?;
                    if kind == "layers" {
                        report.layers_removed += 1;
                    } else {
                        report.blobs_removed += 1;
                    }
                    doomed.push(grave);
                }
            }
        }
        for path in doomed {
            report.bytes_freed += allocated(&path, &mut HashSet::new());
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(ImageError::io("cannot remove", &path))?;
        }
        self.clean_tmp();
        Ok(report)
    }
}
