//! Sandbox disk images made ahead of the creates that need them.
//!
//! Making a sandbox's ext4 image (`mkfs.ext4` on a sparse file) took 15 to 30 ms of each
//! create; with a disk bound on by default that was too much. A thread of the backend's
//! own keeps [`DiskPool::size`] images ready in `<root>/diskpool/<pid>/`; a create takes
//! one ([`DiskPool::take`], a rename into its directory) and the thread makes the next.
//! A create that finds the pool empty (a burst larger than the pool) makes its image
//! itself, as before.
//!
//! Each process of a shared root has a directory of its own, named by its pid; a
//! process that opens the root removes the directories of processes that are gone
//! (a pool dies with its process: the images are plain files, never mounted).

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::disk::{make_image_blocking, DiskError, DiskLimit};

/// Images kept ready by default: a burst of this many creates pays no `mkfs`.
pub const DEFAULT_SIZE: usize = 4;

/// How long the thread waits after a failed `mkfs` before trying again (a full host
/// disk, say); creates meanwhile make their own images and report the error.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The ready images and the thread's instructions.
#[derive(Default)]
struct State {
    ready: VecDeque<PathBuf>,
    next: u64,
    stop: bool,
}

struct Shared {
    dir: PathBuf,
    limit: DiskLimit,
    size: usize,
    /// Protects the ready list and the stop flag; held only to read or change them,
    /// never across a `mkfs`.
    state: Mutex<State>,
    /// Wakes the thread: an image was taken, or it must stop.
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A pool of ready-made disk images, refilled by a thread of its own.
pub struct DiskPool {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for DiskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskPool")
            .field("dir", &self.shared.dir)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

/// Removes the pool directories under `parent` whose process is gone.
fn remove_stale(parent: &Path, own: u32) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let alive = name
            .parse::<u32>()
            .is_ok_and(|pid| pid != own && Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

impl DiskPool {
    /// Starts a pool of `size` images of `limit` under `<root>/diskpool/`.
    pub fn start(root: &Path, limit: DiskLimit, size: usize) -> Result<DiskPool, DiskError> {
        let parent = root.join("diskpool");
        let own = std::process::id();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DiskError::Io { path, source }
        };
        fs::create_dir_all(&parent).map_err(io(&parent))?;
        remove_stale(&parent, own);
        let dir = parent.join(own.to_string());
        fs::create_dir(&dir).map_err(io(&dir))?;
        let shared = Arc::new(Shared {
            dir,
            limit,
            size,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("orchard-diskpool".into())
            .spawn(move || refill(&worker))
            .map_err(io(&shared.dir))?;
        Ok(DiskPool {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Images the pool keeps ready.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Images ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    /// A ready image, to rename into a sandbox's directory; `None` when none is ready.
    pub fn take(&self) -> Option<PathBuf> {
        let image = self.shared.lock().ready.pop_front();
        // All: a waiter of `wait_ready` shares the condition variable with the thread.
        self.shared.wake.notify_all();
        image
    }

    /// Waits until `n` images are ready (or `limit` passed); answers how many are.
    pub fn wait_ready(&self, n: usize, limit: Duration) -> usize {
        let deadline = std::time::Instant::now() + limit;
        let mut state = self.shared.lock();
        while state.ready.len() < n && !state.stop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = match self.shared.wake.wait_timeout(state, left) {
                Ok((s, _)) => s,
                Err(p) => p.into_inner().0,
            };
        }
        state.ready.len()
    }

    /// Stops the thread (after the image it is making) and removes the pool's images.
    pub fn stop(&self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        let _ = fs::remove_dir_all(&self.shared.dir);
    }
}

impl Drop for DiskPool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The pool's thread: makes images while fewer than `size` are ready.
fn refill(shared: &Shared) {
    // The lowest priority, inherited by every mkfs: making the next image must not take
    // CPU from the create that just took one (on 2 cores it cost creates 13 % at the
    // median at normal priority, see docs/sandbox-disk.md). Best effort.
    // SAFETY: setpriority only changes this thread's nice value (Linux keeps one per
    // thread, which the thread's children inherit).
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
    }
    loop {
        let n = {
            let mut state = shared.lock();
            while !state.stop && state.ready.len() >= shared.size {
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            state.next += 1;
            state.next
        };
        let image = shared.dir.join(format!("{n}.img"));
        match make_image_blocking(&image, shared.limit) {
            Ok(()) => {
                let mut state = shared.lock();
                if state.stop {
                    let _ = fs::remove_file(&image);
                    return;
                }
                state.ready.push_back(image);
                // Whoever waits for ready images (tests, benches).
                shared.wake.notify_all();
            }
            Err(e) => {
                let _ = fs::remove_file(&image);
                tracing::warn!(error = %e, "making a sandbox disk image ahead failed");
                let state = shared.lock();
                if state.stop {
                    return;
                }
                let _ = shared.wake.wait_timeout(state, RETRY_AFTER);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_keeps_its_images_ready_and_removes_them_when_stopped() {
        if !crate::backend::local::disk::tests::mkfs_available() {
            eprintln!("skipped: no mkfs.ext4");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let limit = DiskLimit {
            bytes: 32 << 20,
            inodes: 2048,
        };
        // A directory of a process that is gone, left by a crash.
        let stale = root.path().join("diskpool/999999999");
        fs::create_dir_all(&stale).unwrap();
        let pool = DiskPool::start(root.path(), limit, 2).unwrap();
        assert!(!stale.exists(), "a dead process's pool is removed");
        assert_eq!(pool.wait_ready(2, Duration::from_secs(60)), 2);
        let taken = root.path().join("disk.img");
        fs::rename(pool.take().expect("a ready image"), &taken).unwrap();
        assert_eq!(fs::metadata(&taken).unwrap().len(), 32 << 20);
        assert_eq!(pool.wait_ready(2, Duration::from_secs(60)), 2);
        let dir = pool.shared.dir.clone();
        drop(pool);
        assert!(!dir.exists(), "a stopped pool leaves no image");
        assert!(taken.exists(), "a taken image is the taker's");
    }
}
