//! Per-sandbox locks, `<root>/locks/<id>.lock`: an exclusive flock held by the process
//! creating or deleting sandbox `<id>`. Backends of several processes on one root
//! (`LocalConfig::shared`) thereby never run a create, a delete or a recovery teardown
//! of the same sandbox at once. A flock belongs to the open file description: the
//! kernel drops it with the process (SIGKILL included), and two opens conflict even
//! within one process.
//!
//! The holder removes the file on release, so a taker checks after locking that the
//! file it locked is still the one at the path (else it locked an orphan nobody else
//! will ever see, and tries again).

use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::local::error::io_err;
use crate::backend::local::error::LocalError;

/// How often a waiting delete tries the lock again: flock has no timeout, and a
/// blocking flock on a thread could not be given up at the deadline.
const RETRY: Duration = Duration::from_millis(20);

/// A held per-sandbox lock; released (and its file removed) on drop.
#[derive(Debug)]
pub(super) struct SandboxLock {
    /// Holds the flock; closed after the file is removed (fields drop after `drop`).
    _file: fs::File,
    path: PathBuf,
}

impl SandboxLock {
    /// Takes the lock at `path` without waiting; `None` when another holder has it.
    pub(super) fn try_take(path: &Path) -> Result<Option<SandboxLock>, LocalError> {
        loop {
            let file = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(path)
                .map_err(io_err("opening the sandbox lock", path))?;
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => return Ok(None),
                Err(e) => return Err(io_err("locking", path)(e.into())),
            }
            let held = file
                .metadata()
                .map_err(io_err("reading the sandbox lock", path))?;
            match fs::metadata(path) {
                Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                    return Ok(Some(SandboxLock {
                        _file: file,
                        path: path.to_path_buf(),
                    }))
                }
                // Released and removed between our open and our flock: try the new file.
                _ => continue,
            }
        }
    }

    /// Takes the lock at `path`, waiting up to `wait` for its holder.
    pub(super) async fn take(
        path: &Path,
        id: &str,
        wait: Duration,
    ) -> Result<SandboxLock, LocalError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(lock) = Self::try_take(path)? {
                return Ok(lock);
            }
            if Instant::now() >= deadline {
                return Err(LocalError::SandboxBusy(id.to_string()));
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

impl Drop for SandboxLock {
    fn drop(&mut self) {
        // Removed while still locked: a taker that opened this file before sees, once
        // it gets the flock, that the path no longer names it.
        let _ = fs::remove_file(&self.path);
    }
}
