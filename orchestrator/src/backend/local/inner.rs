//! What the local backend's handles share ([`Inner`]): its configuration, root and
//! directories, runc, the table of sandboxes ([`Entry`] by id), the disk pool and the
//! snapshot cache; with the helpers every part uses (each sandbox's [`Paths`], its lock,
//! the table brought in line with a shared root). A leaf below `lifecycle`, `snapshot`
//! and `audit`, which add their methods to [`Inner`] from their own files, and below
//! `mod.rs`, which only wires them into [`super::LocalBackend`].

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::diskpool::DiskPool;
use super::error::LocalError;
use super::lock::SandboxLock;
use super::request::{valid_id, LocalConfig, SandboxInfo};
use super::runc::Runc;
use super::state::{self, SandboxState};
use super::sys::Mounter;
use crate::backend::Liveness;

/// Paths of one sandbox.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    pub(super) dir: PathBuf,
    pub(super) rootfs: PathBuf,
    /// The writable layer's filesystem: a plain directory, or the mount point of the
    /// sandbox's size-limited image (`disk`).
    pub(super) disk: PathBuf,
    pub(super) disk_image: PathBuf,
    pub(super) upper: PathBuf,
    pub(super) work: PathBuf,
    /// The runtime's files (`/etc/hosts` and the like), on the sandbox's disk.
    pub(super) runtime_files: PathBuf,
    pub(super) run: PathBuf,
    pub(super) socket: PathBuf,
    pub(super) state: PathBuf,
    pub(super) config: PathBuf,
    pub(super) log: PathBuf,
    pub(super) slirp_log: PathBuf,
    pub(super) pid_file: PathBuf,
}

pub(super) enum Entry {
    /// Reserved by a create in progress.
    Creating,
    /// Created and healthy (at the time).
    Ready(Box<SandboxState>),
    /// Being deleted.
    Deleting,
}

pub(super) struct Inner {
    pub(super) config: LocalConfig,
    pub(super) root: PathBuf,
    pub(super) tag: String,
    pub(super) runc: Runc,
    pub(super) mounter: Arc<dyn Mounter>,
    pub(super) inject_dir: PathBuf,
    pub(super) empty_layer: PathBuf,
    pub(super) sandboxes_dir: PathBuf,
    pub(super) locks_dir: PathBuf,
    pub(super) cgroup_parents: Vec<PathBuf>,
    pub(super) nofile: u64,
    pub(super) swap_accounting: bool,
    pub(super) table: Mutex<HashMap<String, Entry>>,
    /// Set by a shutdown: creates are refused from then on.
    pub(super) closing: std::sync::atomic::AtomicBool,
    /// Woken whenever a create ends (made or undone), for a shutdown waiting for the
    /// creates in flight.
    pub(super) create_ended: tokio::sync::Notify,
    /// Disk images made ahead, when sandboxes have a disk limit and the pool a size.
    pub(super) disk_pool: Option<DiskPool>,
    /// Snapshot files as parsed, by id, with the file's identity when parsed: a listing
    /// stats every file but parses only new or changed ones (issue 30: every listing
    /// parsed every tenant's snapshots while other calls waited).
    pub(super) snapshot_cache: Mutex<HashMap<String, (FileKey, crate::backend::BackendSnapshot)>>,
    /// Held for the backend's life: the flock on `<root>/lock` (shared when
    /// `config.shared`).
    pub(super) _lock: fs::File,
}

/// A file's identity for the snapshot cache: a rewrite changes the inode (atomic
/// writes rename a new file in) or the size or mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileKey {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileKey {
    pub(super) fn of(meta: &fs::Metadata) -> FileKey {
        use std::os::unix::fs::MetadataExt;
        FileKey {
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

impl Inner {
    /// Refuses creates from now on and waits, up to `limit`, until no create is in
    /// flight. Returns whether none is.
    pub(super) async fn close(&self, limit: std::time::Duration) -> bool {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the table is read, so an end in between still wakes it.
            let ended = self.create_ended.notified();
            if !self
                .lock_table()
                .values()
                .any(|e| matches!(e, Entry::Creating))
            {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                tracing::warn!("creates still in flight at shutdown; deleting what is there");
                return false;
            }
        }
    }

    pub(super) fn lock_table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// On a shared root, brings the table in line with the disk: running sandboxes other
    /// processes created join it, ready ones whose directory is gone (another process
    /// deleted them) leave it. Creates and deletes in progress here keep their entries.
    pub(super) fn sync_shared(&self) {
        if !self.config.shared {
            return;
        }
        let mut found = Vec::new();
        if let Ok(entries) = fs::read_dir(&self.sandboxes_dir) {
            for e in entries.flatten() {
                let Some(id) = e.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if !valid_id(&id) || self.lock_table().contains_key(&id) {
                    continue;
                }
                // A create in flight elsewhere is not `running` yet; one that failed
                // leaves no file.
                if let Ok(s) = state::load(&self.paths(&id).state) {
                    if s.phase == state::Phase::Running && s.id == id {
                        found.push(s);
                    }
                }
            }
        }
        let mut table = self.lock_table();
        table.retain(|id, e| !matches!(e, Entry::Ready(_)) || self.paths(id).dir.exists());
        for s in found {
            // Checked again under the table's lock: a delete here may have finished
            // since the scan.
            if self.paths(&s.id).dir.exists() {
                table
                    .entry(s.id.clone())
                    .or_insert_with(|| Entry::Ready(Box::new(s)));
            }
        }
    }

    /// Takes sandbox `id`'s lock if no other holder has it. `id` must be valid (a file
    /// name).
    pub(super) fn try_lock_sandbox(&self, id: &str) -> Result<Option<SandboxLock>, LocalError> {
        SandboxLock::try_take(&self.locks_dir.join(format!("{id}.lock")))
    }

    /// Takes sandbox `id`'s lock, waiting up to `lock_wait` for another holder.
    pub(super) async fn lock_sandbox(&self, id: &str) -> Result<SandboxLock, LocalError> {
        let path = self.locks_dir.join(format!("{id}.lock"));
        SandboxLock::take(&path, id, self.config.lock_wait).await
    }

    pub(super) fn paths(&self, id: &str) -> Paths {
        let dir = self.sandboxes_dir.join(id);
        let run = dir.join("run");
        Paths {
            rootfs: dir.join("rootfs"),
            disk: dir.join("disk"),
            disk_image: dir.join("disk.img"),
            upper: dir.join("disk/upper"),
            work: dir.join("disk/work"),
            runtime_files: dir.join("disk/etc"),
            socket: run.join("agent.sock"),
            run,
            state: dir.join("state.json"),
            config: dir.join("config.json"),
            // On the sandbox's own filesystem: a chatty agent fills its disk, not ours.
            log: dir.join("disk/agent.log"),
            slirp_log: dir.join("slirp4netns.log"),
            pid_file: dir.join("init.pid"),
            dir,
        }
    }

    pub(super) fn cgroup_prefix(&self) -> String {
        format!("orchard-{}-", self.tag)
    }

    pub(super) fn cgroup_name(&self, id: &str) -> String {
        format!("{}{id}", self.cgroup_prefix())
    }

    pub(super) fn marker(&self, id: &str) -> String {
        format!("{}/{id}", self.tag)
    }

    pub(super) fn info(&self, s: &SandboxState) -> SandboxInfo {
        let paths = self.paths(&s.id);
        SandboxInfo {
            id: s.id.clone(),
            image: s.image.clone(),
            created_at: s.created_at.clone(),
            limits: s.limits,
            network: s.network,
            labels: s.labels.clone(),
            socket: paths.socket,
            token: s.token.clone(),
            init_pid: s.init.map_or(0, |p| p.pid),
            liveness: s.init.map_or(Liveness::Stopped, |p| p.liveness()),
            bundle: paths.dir,
            cgroup_dirs: s.cgroup_dirs.clone(),
        }
    }
}
