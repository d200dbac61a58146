//! The store's directories on disk (see the module docs of `store`): paths of layers,
//! blobs and records, work directories under `tmp/` installed by a rename, atomic
//! writes, and the pins that keep gc off content in use.

use std::fs::{self, DirBuilder, File};
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::inner::Inner;
use super::sync::lock;
use crate::digest::{self, of_bytes, verify_bytes};
use crate::ImageError;

/// Longest record file name before it is replaced by a hash of the name.
const MAX_RECORD_NAME: usize = 200;

/// A directory under `ROOT/tmp`, removed on drop unless installed.
pub(crate) struct WorkDir {
    path: PathBuf,
    installed: bool,
}

impl WorkDir {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes it to disk and renames it to `dest`. When `dest` already exists (another
    /// pull or process got there first with the same content) ours is simply dropped.
    pub(crate) fn install(mut self, dest: &Path) -> Result<(), ImageError> {
        syncfs(&self.path).map_err(ImageError::io("cannot flush", &self.path))?;
        match fs::rename(&self.path, dest) {
            Ok(()) => {
                self.installed = true;
                Ok(())
            }
            Err(err) if dest.is_dir() => {
                let _ = err;
                Ok(())
            }
            Err(err) => Err(ImageError::io("cannot install layer", dest)(err)),
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.installed {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Flushes the file system holding `path`: one call instead of an fsync per file of a
/// layer, so a power cut after the rename cannot leave empty files in a "complete" layer.
fn syncfs(path: &Path) -> io::Result<()> {
    let dir = File::open(path)?;
    rustix::fs::syncfs(&dir)?;
    Ok(())
}

/// Content in use by a running pull or import, which gc must leave alone.
pub(crate) struct Pins<'a> {
    inner: &'a Inner,
    keys: Vec<String>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        let mut pins = lock(&self.inner.pins);
        for key in &self.keys {
            if let Some(count) = pins.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    pins.remove(key);
                }
            }
        }
    }
}

impl Inner {
    fn pin(&self, keys: Vec<String>) -> Pins<'_> {
        let mut pins = lock(&self.pins);
        for key in &keys {
            *pins.entry(key.clone()).or_insert(0) += 1;
        }
        Pins { inner: self, keys }
    }

    /// Pins the blobs and layers of an image.
    pub(super) fn pin_image(
        &self,
        blobs: &[&str],
        diff_ids: &[String],
    ) -> Result<Pins<'_>, ImageError> {
        let mut keys = Vec::new();
        for blob in blobs {
            keys.push(format!("blobs/{}", digest::hex_of(blob)?));
        }
        for diff_id in diff_ids {
            keys.push(format!("layers/{}", digest::hex_of(diff_id)?));
        }
        Ok(self.pin(keys))
    }

    pub(super) fn layer_path(&self, diff_id: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("layers").join(digest::hex_of(diff_id)?))
    }

    pub(super) fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("blobs/sha256").join(digest::hex_of(digest)?))
    }

    pub(super) fn record_path(&self, reference: &str) -> PathBuf {
        let mut name = String::new();
        for byte in reference.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
                name.push(byte as char);
            } else {
                name.push_str(&format!("%{byte:02X}"));
            }
        }
        if name.len() > MAX_RECORD_NAME {
            name = format!(
                "h-{}",
                &of_bytes(reference.as_bytes())[digest::SHA256_PREFIX.len()..]
            );
        }
        self.root.join("images").join(format!("{name}.json"))
    }

    /// A fresh directory under `tmp/`.
    pub(super) fn work_dir(&self, what: &str) -> Result<WorkDir, ImageError> {
        let path = self.work_path(what);
        DirBuilder::new()
            .mode(0o755)
            .create(&path)
            .map_err(ImageError::io("cannot create work directory", &path))?;
        Ok(WorkDir {
            path,
            installed: false,
        })
    }

    pub(super) fn work_path(&self, what: &str) -> PathBuf {
        let n = self.work_counter.fetch_add(1, Ordering::SeqCst);
        self.root
            .join("tmp")
            .join(format!("{}.{n}.{what}", std::process::id()))
    }

    /// Writes `bytes` to `dest` through a temporary file and a rename.
    pub(super) fn write_atomic(&self, dest: &Path, bytes: &[u8]) -> Result<(), ImageError> {
        let tmp = self.work_path("file");
        let result = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, dest)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(ImageError::io("cannot write", dest))
    }

    /// Stores a verified blob (manifest or config) unless it is there already.
    pub(super) fn write_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.blob_path(digest)?;
        if path.is_file() {
            return Ok(());
        }
        self.write_atomic(&path, bytes)
    }

    pub(super) fn read_blob(&self, digest: &str) -> Option<Vec<u8>> {
        let bytes = fs::read(self.blob_path(digest).ok()?).ok()?;
        // A blob damaged on disk is fetched again rather than trusted.
        verify_bytes("blob", &bytes, digest).ok()?;
        Some(bytes)
    }

    /// Removes what dead processes left in `tmp/`.
    pub(super) fn clean_tmp(&self) {
        let dir = self.root.join("tmp");
        let Ok(entries) = fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let pid = name
                .split('.')
                .next()
                .and_then(|pid| pid.parse::<u32>().ok());
            let alive = pid.is_some_and(|pid| {
                pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
            });
            if !alive {
                let path = entry.path();
                let _ = fs::remove_dir_all(&path).or_else(|_| fs::remove_file(&path));
            }
        }
    }
}
