//! A size-limited filesystem per sandbox for its writable layer: a sparse ext4 image
//! (`<sandbox>/disk.img`) loop-mounted at `<sandbox>/disk`, holding the overlay's upper
//! and work directories and the agent's log.
//!
//! Why an image per sandbox: this kernel has no quota support (`CONFIG_QUOTA` and XFS
//! quotas are both off), so project quotas on a shared filesystem, the cheaper way, are
//! not available. A full image is `ENOSPC` inside the sandbox and nothing outside it;
//! its inode count is fixed at `mkfs` time, so an inode flood stops there too. The
//! image is sparse: it takes host disk only for what the sandbox wrote.
//!
//! The image is made by `mkfs.ext4` (no journal, lazy inode tables, no reserved blocks:
//! a few milliseconds) and mounted by `mount -o loop` (util-linux sets the loop device
//! to detach itself when unmounted). Teardown unmounts everything under the sandbox's
//! directory, this mount included.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

/// Longest `mkfs` or `mount` may take on a loaded host.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// Smallest image `mkfs.ext4` makes reliably.
pub const MIN_BYTES: u64 = 16 << 20;

/// The limits of a sandbox's writable layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskLimit {
    /// Bytes the sandbox may write (file data and metadata).
    pub bytes: u64,
    /// Files, directories and links it may make.
    pub inodes: u64,
}

/// A problem making or mounting a sandbox's filesystem.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A tool could not be run or failed.
    #[error("{tool} failed for {path}: {reason}")]
    Tool {
        /// `mkfs.ext4` or `mount`.
        tool: &'static str,
        /// The image or mount point.
        path: PathBuf,
        /// What it said.
        reason: String,
    },
    /// The image file could not be made.
    #[error("creating {path}: {source}")]
    Io {
        /// The image.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A limit no image can have.
    #[error("{0}")]
    Invalid(String),
}

impl DiskLimit {
    /// Checks the limit is one an image can have.
    pub fn validate(&self) -> Result<(), DiskError> {
        if self.bytes < MIN_BYTES {
            return Err(DiskError::Invalid(format!(
                "a sandbox disk of {} bytes is too small: at least {MIN_BYTES}",
                self.bytes
            )));
        }
        if self.inodes < 1024 {
            return Err(DiskError::Invalid(format!(
                "a sandbox disk with {} inodes is too small: at least 1024",
                self.inodes
            )));
        }
        Ok(())
    }
}

async fn tool(name: &'static str, path: &Path, cmd: &mut Command) -> Result<(), DiskError> {
    let fail = |reason: String| DiskError::Tool {
        tool: name,
        path: path.to_path_buf(),
        reason,
    };
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(CALL_LIMIT, cmd.output())
        .await
        .map_err(|_| fail(format!("took longer than {} s", CALL_LIMIT.as_secs())))?
        .map_err(|e| {
            fail(format!(
                "cannot run it: {e} (is e2fsprogs/util-linux installed?)"
            ))
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Makes `image` (sparse, `limit.bytes` long, `limit.inodes` inodes) and mounts it at
/// `mount_point`, which must exist.
pub async fn make_and_mount(
    image: &Path,
    mount_point: &Path,
    limit: DiskLimit,
) -> Result<(), DiskError> {
    let io = |source| DiskError::Io {
        path: image.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)
        .map_err(io)?;
    file.set_len(limit.bytes).map_err(io)?;
    drop(file);
    tool(
        "mkfs.ext4",
        image,
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
            .args([
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
            ])
            .arg("-N")
            .arg(limit.inodes.to_string())
            .arg(image),
    )
    .await?;
    tool(
        "mount",
        mount_point,
        Command::new("mount")
            .args(["-o", "loop,nosuid,nodev,noatime"])
            .arg(image)
            .arg(mount_point),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_an_image_cannot_have_are_refused() {
        assert!(DiskLimit {
            bytes: 1 << 20,
            inodes: 10_000
        }
        .validate()
        .is_err());
        assert!(DiskLimit {
            bytes: 1 << 30,
            inodes: 10
        }
        .validate()
        .is_err());
        assert!(DiskLimit {
            bytes: 1 << 30,
            inodes: 100_000
        }
        .validate()
        .is_ok());
    }
}
