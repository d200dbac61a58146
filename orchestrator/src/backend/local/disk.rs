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
//! The image is made by `mkfs.ext4` (no journal, lazy inode tables, no reserved blocks),
//! and mounted (through a self-detaching loop device, [`super::loopdev`]) ahead of the
//! create by the backend's pool ([`super::diskpool`]), so that a create only moves a
//! ready mount onto its `disk` and renames the image into its directory. Teardown
//! unmounts everything under the sandbox's directory, this mount included, which frees
//! the loop device.

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
    run_tool(name, path, cmd, false).await
}

/// Runs `cmd` (the tool `name`, on `path`), started by [`super::background::command`]
/// when `background`.
async fn run_tool(
    name: &'static str,
    path: &Path,
    cmd: &mut Command,
    background: bool,
) -> Result<(), DiskError> {
    let fail = |reason: String| DiskError::Tool {
        tool: name,
        path: path.to_path_buf(),
        reason,
    };
    cmd.kill_on_drop(true)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let run = async {
        if background {
            super::background::check_runnable(Path::new(name))?;
        }
        let child = cmd.spawn()?;
        if background {
            super::background::lower(child.id()).await;
        }
        child.wait_with_output().await
    };
    let out = tokio::time::timeout(CALL_LIMIT, run)
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

/// `mkfs.ext4` arguments for an image of `limit` (no journal, lazy inode tables, no
/// reserved blocks: a few milliseconds).
fn mkfs_args(limit: DiskLimit, image: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = ["-q", "-F", "-m", "0", "-O", "^has_journal"]
        .iter()
        .map(Into::into)
        .collect();
    args.push("-E".into());
    args.push("lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0".into());
    args.push("-N".into());
    args.push(limit.inodes.to_string().into());
    args.push(image.into());
    args
}

/// Makes the sparse file `image`, `limit.bytes` long.
fn make_sparse(image: &Path, limit: DiskLimit) -> Result<(), DiskError> {
    let io = |source| DiskError::Io {
        path: image.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)
        .map_err(io)?;
    file.set_len(limit.bytes).map_err(io)
}

/// Makes `image` (sparse, `limit.bytes` long, `limit.inodes` inodes).
pub async fn make_image(image: &Path, limit: DiskLimit) -> Result<(), DiskError> {
    make_sparse(image, limit)?;
    // Background work, like runc: in an autogroup of its own (`background.rs`).
    run_tool(
        "mkfs.ext4",
        image,
        super::background::command(Path::new("mkfs.ext4")).args(mkfs_args(limit, image)),
        true,
    )
    .await
}

/// [`make_image`] for a thread of its own (the pool's, off every create's path).
pub fn make_image_blocking(image: &Path, limit: DiskLimit) -> Result<(), DiskError> {
    make_sparse(image, limit)?;
    // Background work, like runc: in an autogroup of its own (`background.rs`).
    let out = super::background::check_runnable(Path::new("mkfs.ext4"))
        .and_then(|()| {
            let child = super::background::std_command(Path::new("mkfs.ext4"))
                .args(mkfs_args(limit, image))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            super::background::lower_blocking(child.id());
            child.wait_with_output()
        })
        .map_err(|e| DiskError::Tool {
            tool: "mkfs.ext4",
            path: image.to_path_buf(),
            reason: format!("cannot run it: {e} (is e2fsprogs installed?)"),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(DiskError::Tool {
        tool: "mkfs.ext4",
        path: image.to_path_buf(),
        reason: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// Mounts the ext4 `image` at `mount_point`, which must exist: with the system calls
/// ([`super::loopdev`], a few milliseconds less than running `mount`), else with
/// `mount -o loop` (util-linux sets the loop device to detach itself when unmounted).
pub async fn mount_image(image: &Path, mount_point: &Path) -> Result<(), DiskError> {
    let (img, at) = (image.to_path_buf(), mount_point.to_path_buf());
    let direct = tokio::task::spawn_blocking(move || super::loopdev::mount_ext4(&img, &at)).await;
    match direct {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "loop mount by system calls failed; using mount(8)")
        }
        Err(e) => tracing::debug!(error = %e, "loop mount task failed; using mount(8)"),
    }
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
pub(crate) mod tests {
    use super::*;

    /// Whether `mkfs.ext4` can be run here (tests that make images skip without it).
    pub(crate) fn mkfs_available() -> bool {
        std::process::Command::new("mkfs.ext4")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    }

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
