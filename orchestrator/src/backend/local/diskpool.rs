//! Sandbox disk images made and mounted ahead of the creates that need them.
//!
//! Making a sandbox's ext4 image (`mkfs.ext4` on a sparse file) took 15 to 30 ms of each
//! create, and attaching a loop device and mounting it about 6 ms more; with a disk bound
//! on by default that was too much. A thread of the backend's own keeps
//! [`DiskPool::size`] images ready in `<root>/diskpool/<pid>/`, each mounted at
//! `<pid>/mnt/<n>/` through a self-detaching loop device; a create takes one
//! ([`DiskPool::take`]), moves its mount onto the sandbox's `disk` (`MS_MOVE`, one
//! system call that leaves one mount), renames the image into its directory, and the
//! thread makes the next. A create that finds the pool empty (a burst larger than the
//! pool) makes and mounts its image itself, as before.
//!
//! The pool's `mnt` is a private mount of itself ([`loopdev::private_mount`]): the kernel
//! moves no mount out of a shared parent, and the pool's mounts propagate nowhere. The
//! images stay beside it, outside: rename(2) crosses no mount, even of the same
//! filesystem.
//! Where that or the loop mount is refused (not root, a kernel before 5.8), the pool
//! hands over its images unmounted and the create mounts them.
//!
//! Each process of a shared root has a directory of its own, named by its pid. Mounts
//! outlive their process: a process that opens the root unmounts and removes the
//! directories of processes that are gone ([`clear_dead`]), a graceful shutdown stops
//! the pool, and the leak audit reports what is left of dead pools ([`pool_dirs`]).

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::disk::{self, make_image_blocking, DiskError, DiskLimit};
use super::{loopdev, rootfs, sys};

/// Images kept ready by default: a burst of this many creates pays no `mkfs`.
pub const DEFAULT_SIZE: usize = 4;

/// How long the thread waits after a failed `mkfs` before trying again (a full host
/// disk, say); creates meanwhile make their own images and report the error.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A ready image.
#[derive(Debug)]
pub struct ReadyDisk {
    /// The image file, in the pool's directory: the taker renames it into its own.
    pub image: PathBuf,
    /// Where the pool mounted it, if it could: the taker moves that mount.
    pub mounted: Option<PathBuf>,
}

/// The ready images and the thread's instructions.
#[derive(Default)]
struct State {
    ready: VecDeque<ReadyDisk>,
    next: u64,
    stop: bool,
}

struct Shared {
    dir: PathBuf,
    limit: DiskLimit,
    size: usize,
    /// Whether `dir/mnt` is a private mount, under which images are mounted ahead.
    mounts: bool,
    /// Protects the ready list and the stop flag; held only to read or change them,
    /// never across a `mkfs` or a mount.
    state: Mutex<State>,
    /// Wakes the thread: an image was taken, or it must stop.
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A pool of ready-made, ready-mounted disk images, refilled by a thread of its own.
pub struct DiskPool {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for DiskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskPool")
            .field("dir", &self.shared.dir)
            .field("size", &self.shared.size)
            .field("mounts", &self.shared.mounts)
            .finish_non_exhaustive()
    }
}

/// The pool directories under `<root>/diskpool`, each with whether its process (by the
/// pid it is named after) still runs; `own` (this process) counts as gone, since its
/// live pool is the caller's to know about.
pub fn pool_dirs(root: &Path, own: u32) -> Vec<(PathBuf, bool)> {
    let Ok(entries) = fs::read_dir(root.join("diskpool")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let alive = name
                .parse::<u32>()
                .is_ok_and(|pid| pid != own && Path::new(&format!("/proc/{pid}")).exists());
            (e.path(), alive)
        })
        .collect()
}

/// Unmounts everything at or under `dir` (deepest first; each image's loop device
/// detaches itself), then removes `dir` unless something stayed mounted: removing
/// recursively through a mount would empty the mounted filesystem.
fn clear(dir: &Path) {
    let mut mounts = sys::mounts_under(dir).unwrap_or_default();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mounts {
        if let Err(e) = rootfs::unmount(&sys::RealMounter, &m) {
            tracing::warn!(error = %e, "unmounting a pool disk");
        }
    }
    match sys::mounts_under(dir) {
        Ok(left) if left.is_empty() => {
            let _ = fs::remove_dir_all(dir);
        }
        Ok(left) => tracing::warn!(?left, "not removing a disk pool: still mounted"),
        Err(e) => tracing::warn!(error = %e, "reading the mounts of a disk pool"),
    }
}

/// Unmounts and removes the pools under `<root>/diskpool` of processes that are gone
/// (and this process's, left by one that had its pid): their mounts and loop devices
/// outlived them. Run when a root is opened, whether or not this process has a pool.
pub fn clear_dead(root: &Path) {
    for (dir, alive) in pool_dirs(root, std::process::id()) {
        if !alive {
            clear(&dir);
        }
    }
}

impl DiskPool {
    /// Starts a pool of `size` images of `limit` under `<root>/diskpool/` (after
    /// [`clear_dead`]: the pool's directory is named by the pid).
    pub fn start(root: &Path, limit: DiskLimit, size: usize) -> Result<DiskPool, DiskError> {
        let parent = root.join("diskpool");
        let own = std::process::id();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DiskError::Io { path, source }
        };
        fs::create_dir_all(&parent).map_err(io(&parent))?;
        let dir = parent.join(own.to_string());
        fs::create_dir(&dir).map_err(io(&dir))?;
        let mnt = dir.join("mnt");
        let mounts = match fs::create_dir(&mnt).and_then(|()| loopdev::private_mount(&mnt)) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "the disk pool cannot mount ahead; creates mount");
                false
            }
        };
        let shared = Arc::new(Shared {
            dir,
            limit,
            size,
            mounts,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("orchard-diskpool".into())
            .spawn(move || refill(&worker))
            .map_err(|source| {
                clear(&shared.dir);
                DiskError::Io {
                    path: shared.dir.clone(),
                    source,
                }
            })?;
        Ok(DiskPool {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Images the pool keeps ready.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The pool's directory, `<root>/diskpool/<pid>`.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Whether the pool runs (was not stopped): its directory and mounts are in use.
    pub fn is_running(&self) -> bool {
        !self.shared.lock().stop
    }

    /// Images ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    /// A ready image; `None` when none is ready.
    pub fn take(&self) -> Option<ReadyDisk> {
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

    /// Stops the thread (after the image it is making), unmounts the pool's images
    /// (freeing their loop devices) and removes them.
    pub fn stop(&self) {
        {
            let mut state = self.shared.lock();
            state.stop = true;
            state.ready.clear();
        }
        self.shared.wake.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        clear(&self.shared.dir);
    }
}

impl Drop for DiskPool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes image `n` and, where the pool can, mounts it at `<dir>/mnt/<n>`.
fn make_one(shared: &Shared, n: u64) -> Result<ReadyDisk, DiskError> {
    let image = shared.dir.join(format!("{n}.img"));
    if let Err(e) = make_image_blocking(&image, shared.limit) {
        let _ = fs::remove_file(&image);
        return Err(e);
    }
    let mut mounted = None;
    if shared.mounts {
        let at = shared.dir.join("mnt").join(n.to_string());
        match fs::create_dir(&at).and_then(|()| loopdev::mount_ext4(&image, &at)) {
            Ok(()) => mounted = Some(at),
            Err(e) => {
                // The create mounts it instead (with mount(8) where the calls are missing).
                tracing::debug!(error = %e, "mounting a pool disk ahead failed");
                let _ = fs::remove_dir(&at);
            }
        }
    }
    Ok(ReadyDisk { image, mounted })
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
    // Nor the server's short slice, which lets a waking thread preempt (meant for
    // request threads), nor its share of the disk: mkfs writes its inode tables in the
    // idle I/O class, behind every create's and every sandbox's writes.
    let _ = orchard_sched::set_thread_slice(Duration::ZERO);
    // SAFETY: ioprio_set only changes this thread's I/O priority (IOPRIO_WHO_PROCESS
    // with a thread id; children inherit it).
    unsafe {
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            libc::gettid() as libc::c_long,
            IOPRIO_CLASS_IDLE << 13,
        );
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
        match make_one(shared, n) {
            Ok(ready) => {
                let mut state = shared.lock();
                if state.stop {
                    // `stop` unmounts and removes everything in the directory.
                    return;
                }
                state.ready.push_back(ready);
                // Whoever waits for ready images (tests, benches).
                shared.wake.notify_all();
            }
            Err(e) => {
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

/// Makes `image` (or takes a ready one from `pool`) and mounts it at `mount_point`.
pub async fn make_and_mount(
    image: &Path,
    mount_point: &Path,
    limit: DiskLimit,
    pool: Option<&DiskPool>,
) -> Result<(), DiskError> {
    let io = |source| DiskError::Io {
        path: image.to_path_buf(),
        source,
    };
    let Some(ready) = pool.and_then(|p| p.take()) else {
        disk::make_image(image, limit).await?;
        return disk::mount_image(image, mount_point).await;
    };
    if let Some(at) = &ready.mounted {
        // The mount first: from here the sandbox's teardown unmounts it.
        match loopdev::move_mount(at, mount_point) {
            Ok(()) => {
                std::fs::rename(&ready.image, image).map_err(io)?;
                let _ = std::fs::remove_dir(at);
                return Ok(());
            }
            Err(e) => {
                // A pool stopped under us, say: mount the image here instead.
                tracing::debug!(error = %e, "moving a pool disk's mount failed; mounting it");
                if rustix::mount::unmount(at, rustix::mount::UnmountFlags::empty()).is_err() {
                    // Still mounted: a second mount of it would corrupt it. The pool's
                    // stop unmounts and removes it; this create makes its own.
                    disk::make_image(image, limit).await?;
                    return disk::mount_image(image, mount_point).await;
                }
            }
        }
    }
    std::fs::rename(&ready.image, image).map_err(io)?;
    disk::mount_image(image, mount_point).await
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
        clear_dead(root.path());
        let pool = DiskPool::start(root.path(), limit, 2).unwrap();
        assert!(!stale.exists(), "a dead process's pool is removed");
        assert_eq!(pool.wait_ready(2, Duration::from_secs(60)), 2);
        let taken = root.path().join("disk.img");
        // Its mount, if any, stays in the pool's directory: the pool's stop unmounts it.
        fs::rename(pool.take().expect("a ready image").image, &taken).unwrap();
        assert_eq!(fs::metadata(&taken).unwrap().len(), 32 << 20);
        assert_eq!(pool.wait_ready(2, Duration::from_secs(60)), 2);
        let dir = pool.shared.dir.clone();
        drop(pool);
        assert!(!dir.exists(), "a stopped pool leaves no image");
        assert!(taken.exists(), "a taken image is the taker's");
    }

    /// Backing files of the loop devices attached to files under `dir`.
    fn loops_under(dir: &Path) -> Vec<String> {
        let dir = dir.to_string_lossy().into_owned();
        fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter_map(|e| fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .map(|f| f.trim().to_string())
            .filter(|f| f.starts_with(&dir))
            .collect()
    }

    /// Waits until no loop device is attached to a file under `dir` (an autoclear
    /// device detaches right after its last user goes, not within the unmount).
    fn assert_loops_go(dir: &Path) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !loops_under(dir).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "loop devices stayed: {:?}",
                loops_under(dir)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A pool left mounted by a process that died: a private mount with an image
    /// mounted in it.
    fn dead_pool(root: &Path, limit: DiskLimit) -> PathBuf {
        let stale = root.join("diskpool/999999999");
        fs::create_dir_all(stale.join("mnt")).unwrap();
        loopdev::private_mount(&stale.join("mnt")).unwrap();
        fs::create_dir(stale.join("mnt/1")).unwrap();
        make_image_blocking(&stale.join("1.img"), limit).unwrap();
        loopdev::mount_ext4(&stale.join("1.img"), &stale.join("mnt/1")).unwrap();
        stale
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pool_disks_are_mounted_ahead_moved_by_the_taker_and_leave_no_loop_device() {
        if !rustix::process::geteuid().is_root()
            || !crate::backend::local::disk::tests::mkfs_available()
        {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let limit = DiskLimit {
            bytes: 32 << 20,
            inodes: 2048,
        };
        let stale = dead_pool(root, limit);
        clear_dead(root);
        let pool = DiskPool::start(root, limit, 2).unwrap();
        assert!(!stale.exists(), "a dead process's pool is removed");
        assert_eq!(sys::mounts_under(&stale).unwrap(), Vec::<PathBuf>::new());
        assert_eq!(pool.wait_ready(2, Duration::from_secs(60)), 2);
        assert_loops_go(&stale);
        // The pool's own mount and one per ready image, each on a loop device.
        assert_eq!(sys::mounts_under(pool.dir()).unwrap().len(), 3);
        assert_eq!(loops_under(root).len(), 2);

        let (image, disk) = (root.join("sb/disk.img"), root.join("sb/disk"));
        fs::create_dir_all(&disk).unwrap();
        make_and_mount(&image, &disk, limit, Some(&pool))
            .await
            .unwrap();
        assert_eq!(rustix::fs::statfs(&disk).unwrap().f_type as i64, 0xEF53);
        // Moved, not copied: one mount of it, the sandbox's; the pool's is gone.
        assert_eq!(
            sys::mounts_under(&root.join("sb")).unwrap(),
            vec![disk.clone()]
        );
        assert_eq!(pool.wait_ready(2, Duration::from_secs(60)), 2);
        assert_eq!(sys::mounts_under(pool.dir()).unwrap().len(), 3);
        assert!(loops_under(root).contains(&image.to_string_lossy().into_owned()));

        rustix::mount::unmount(&disk, rustix::mount::UnmountFlags::empty()).unwrap();
        assert_loops_go(&root.join("sb"));
        let dir = pool.dir().to_path_buf();
        drop(pool);
        assert!(!dir.exists(), "a stopped pool leaves no image");
        assert_eq!(sys::mounts_under(root).unwrap(), Vec::<PathBuf>::new());
        assert_loops_go(root);
    }
}
