//! The local backend: sandboxes on this machine, run by runc over overlayfs.
//!
//! ```text
//! <root>/backend.json          this root's tag (names our cgroups, marks our processes)
//! <root>/lock                  flock: one backend per root at a time, or several
//!                              shared ones (`LocalConfig::shared`, held LOCK_SH)
//! <root>/inject.lock          flock: one process (re)injects the agent at a time
//! <root>/locks/<id>.lock       flock of sandbox <id>, held by the process creating or
//!                              deleting it (see `lock`)
//! <root>/runc/                 runc --root: runc's state of our containers only
//! <root>/inject/               the injected volume, mounted read-only at /.orchard:
//!                              bin/orchard-agent, harness/, manifest.json
//! <root>/empty/                the lower layer of an image without layers
//! <root>/diskpool/<pid>/       disk images made ahead by process <pid> (see `diskpool`),
//!                              <n>.img, mounted ahead at mnt/<n>/ (mnt/ a private mount)
//! <root>/sandboxes/<id>/       one bundle per sandbox:
//!     state.json config.json   state (token, pids, phase) and the OCI config
//!     rootfs/ disk/{upper,work}/  the overlay; disk/ is the size-limited image (disk.img)
//!                              when the backend has a disk limit, else a directory
//!     run/agent.sock           the agent's socket, bound here and handed to the agent as fd 3
//!     disk/agent.log slirp4netns.log
//!     disk/etc/{hosts,hostname,resolv.conf}  the runtime's files, bound over the image's
//! ```
//!
//! [`LocalBackend::create`] returns once the agent answers `/v1/health`; on any failure
//! it collects the agent's log into the error and removes everything it made.
//! [`LocalBackend::delete`] kills, unmounts and removes everything. A backend killed with
//! SIGKILL leaves its sandboxes running; a new backend on the same root calls
//! [`LocalBackend::recover`] to adopt the healthy ones and remove the rest, and
//! [`LocalBackend::audit`] lists anything left behind (processes, mounts, cgroups,
//! network namespaces, directories) that no live sandbox accounts for.
//!
//! Shared roots: `orchard serve` replicas over one Redis share one data directory.
//! Each holds the root's lock shared (an exclusive backend refuses to run beside them,
//! and they beside it), `list` and `delete` also reach the running sandboxes the
//! others created (found through their state files), `recover` leaves alone any
//! sandbox whose lock another process holds (a create or delete in flight there), and
//! the service's `shutdown` deletes nothing (the other replicas serve those sandboxes
//! too). `destroy` still removes everything: it is for the root's last user.
//!
//! The backend's process becomes a child subreaper (see [`process`]): container inits
//! are re-parented to it and reaped by it.
//!
//! The agent runs as root (it binds its socket and serves files anywhere); the image's
//! `User` is resolved against its `/etc/passwd` and `/etc/group`, given to the agent as
//! `--user UID:GID,GROUPS` so every command runs as that user, and recorded in the
//! annotations and the state file.
//!
//! Parts:
//! - [`sys`]: mount syscalls behind a trait, with a recording implementation for tests.
//! - [`rootfs`]: the overlay, and paths resolved inside the image (users, workdir).
//! - [`spec`]: the OCI runtime config, built with `oci-spec`.
//! - [`runc`]: runc as a command-line program with our own state directory.
//! - [`network`]: loopback-only by default, slirp4netns egress on request.
//! - [`cgroup`], [`process`]: finding, killing, reaping and removing what a sandbox holds.
//! - [`state`]: the per-sandbox state file recovery reads.
//! - `lifecycle`: create, delete, recover, destroy; [`audit`]: the leak audit.
//! - `lock`: the per-sandbox locks of a shared root.
//! - `inner`: what the backend's handles share (the table of sandboxes, the paths, the
//!   caches), under `lifecycle`, `snapshot` and [`audit`]; `request` and `limits`: what
//!   a caller asks for; `error`: [`LocalError`], over each part's own error.
//!
//! Imports run one way (`scripts/import-cycles.py`): this module only wires the parts
//! into [`LocalBackend`]; none of them imports it but for [`ANNOTATION_PREFIX`].
//! - [`mod@bench`]: the backend's benchmark.

pub mod audit;
mod background;
pub mod cgroup;
pub mod disk;
pub mod diskpool;
pub mod egress;
mod error;
mod inner;
pub mod layer;
mod lifecycle;
mod limits;
mod lock;
mod loopdev;
pub mod network;
pub mod process;
mod request;
pub mod rootfs;
pub mod runc;
pub mod runtime_files;
pub mod seccomp;
mod snapshot;
pub mod spec;
pub mod state;
pub mod sys;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use audit::AuditReport;
pub use error::LocalError;
pub use network::NetworkMode;
pub use request::{
    valid_id, FailPoint, Limits, LocalConfig, RecoverReport, SandboxInfo, SandboxSpec,
    DEFAULT_PATH, HARNESS_BIN,
};
pub use snapshot::valid_snapshot_id;

use inner::{Entry, Inner};
use runc::Runc;
use sys::{Mounter, RealMounter};

/// Prefix of every annotation we write.
pub const ANNOTATION_PREFIX: &str = "org.orchard.";
/// Highest `RLIMIT_NOFILE` given to a sandbox (the host's hard limit caps it: raising a
/// hard limit needs CAP_SYS_RESOURCE, which not every host has).
pub const MAX_NOFILE: u64 = 1 << 20;

/// The local backend. Cheap to clone; clones share the sandboxes.
#[derive(Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("root", &self.inner.root)
            .field("tag", &self.inner.tag)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct BackendFile {
    tag: String,
}

impl LocalBackend {
    /// Opens (creating if needed) a backend on `config.root`: takes its lock, injects the
    /// agent into the shared volume and makes this process a child subreaper. Sandboxes a
    /// previous backend left on the root are untouched until [`LocalBackend::recover`].
    pub fn open(config: LocalConfig) -> Result<LocalBackend, LocalError> {
        Self::open_with_mounter(config, Arc::new(RealMounter))
    }

    /// [`LocalBackend::open`] with another [`Mounter`].
    pub fn open_with_mounter(
        config: LocalConfig,
        mounter: Arc<dyn Mounter>,
    ) -> Result<LocalBackend, LocalError> {
        if let Some(limit) = &config.disk {
            limit.validate()?;
        }
        fs::create_dir_all(&config.root).map_err(root_err(&config.root))?;
        let root = fs::canonicalize(&config.root).map_err(root_err(&config.root))?;
        // It holds tokens.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).map_err(root_err(&root))?;
        let lock = lock_root(&root, &config)?;
        let tag = backend_tag(&root)?;
        let runc_root = root.join("runc");
        let inject_dir = root.join("inject");
        let empty_layer = root.join("empty");
        let sandboxes_dir = root.join("sandboxes");
        let locks_dir = root.join("locks");
        for d in [&runc_root, &empty_layer, &sandboxes_dir, &locks_dir] {
            fs::create_dir_all(d).map_err(root_err(d))?;
        }
        inject(&root, &config, &inject_dir)?;
        // The mount point of /.orchard/run inside the read-only /.orchard.
        let run_point = inject_dir.join("run");
        fs::create_dir_all(&run_point).map_err(root_err(&run_point))?;
        process::become_subreaper()?;
        let cgroup_parents = cgroup::parents()?;
        let swap_accounting = cgroup_parents
            .iter()
            .any(|p| p.join("memory.memsw.limit_in_bytes").exists());
        // No hard limit (infinity) reads as `None`: the cap applies.
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .maximum
            .map_or(MAX_NOFILE, |max| max.min(MAX_NOFILE));
        // Whatever this root's backend, pools of dead processes hold mounts and loop
        // devices.
        diskpool::clear_dead(&root);
        let disk_pool = match config.disk {
            Some(limit) if config.disk_pool > 0 => {
                Some(diskpool::DiskPool::start(&root, limit, config.disk_pool)?)
            }
            _ => None,
        };
        Ok(LocalBackend {
            inner: Arc::new(Inner {
                runc: Runc::new(&config.runc, &runc_root),
                config,
                root,
                tag,
                mounter,
                inject_dir,
                empty_layer,
                sandboxes_dir,
                locks_dir,
                cgroup_parents,
                nofile,
                swap_accounting,
                table: Mutex::new(HashMap::new()),
                closing: std::sync::atomic::AtomicBool::new(false),
                create_ended: tokio::sync::Notify::new(),
                disk_pool,
                snapshot_cache: Mutex::new(HashMap::new()),
                _lock: lock,
            }),
        })
    }

    /// Stops the disk pool, if any: unmounts and removes the images made ahead; and
    /// clears the pools of processes that died on this root (a replica killed with
    /// SIGKILL), which only the next open cleared before: the last replica standing
    /// now leaves none behind.
    async fn stop_pool(&self) -> Result<(), LocalError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(pool) = &inner.disk_pool {
                pool.stop();
            }
            diskpool::clear_dead(&inner.root);
        })
        .await
        .map_err(|e| LocalError::Task(e.to_string()))
    }

    /// The backend's root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The shared injected volume.
    pub fn injection_dir(&self) -> &Path {
        &self.inner.inject_dir
    }

    /// This root's tag (in cgroup names and process markers).
    pub fn tag(&self) -> &str {
        &self.inner.tag
    }

    /// runc's state directory of this backend.
    pub fn runc_root(&self) -> &Path {
        self.inner.runc.root()
    }

    /// Waits until the disk pool holds all its images (or `limit` passed); answers how
    /// many are ready (0 without a pool). For benchmarks and tests, which would
    /// otherwise measure the pool's refilling.
    pub fn wait_disk_pool(&self, limit: std::time::Duration) -> usize {
        self.inner
            .disk_pool
            .as_ref()
            .map_or(0, |p| p.wait_ready(p.size(), limit))
    }

    /// Creates a sandbox and returns once its agent answers. On failure nothing is left.
    /// Runs to completion even if the returned future is dropped.
    pub async fn create(&self, spec: SandboxSpec) -> Result<SandboxInfo, LocalError> {
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.create(spec).await })
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
    }

    /// Kills and removes a sandbox: its processes, slirp4netns, mounts, cgroups and
    /// directory. Runs to completion even if the returned future is dropped.
    pub async fn delete(&self, id: &str) -> Result<(), LocalError> {
        let inner = self.inner.clone();
        let id = id.to_string();
        tokio::spawn(async move { inner.delete(&id).await })
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
    }

    /// The sandboxes of this backend, oldest first; on a shared root also the running
    /// ones other processes created.
    pub fn list(&self) -> Vec<SandboxInfo> {
        self.inner.sync_shared();
        let table = self.inner.lock_table();
        let mut list: Vec<SandboxInfo> = table
            .values()
            .filter_map(|e| match e {
                Entry::Ready(s) => Some(self.inner.info(s)),
                _ => None,
            })
            .collect();
        list.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        list
    }

    /// One sandbox.
    pub fn get(&self, id: &str) -> Option<SandboxInfo> {
        self.inner.sync_shared();
        match self.inner.lock_table().get(id) {
            Some(Entry::Ready(s)) => Some(self.inner.info(s)),
            _ => None,
        }
    }

    /// Finds every sandbox on the root that this backend does not know (left by a
    /// previous backend process), adopts the running ones whose agent answers, and
    /// removes the rest with everything they hold.
    pub async fn recover(&self) -> Result<RecoverReport, LocalError> {
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.recover().await })
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
    }

    /// Freezes a sandbox's processes (`runc pause`).
    pub async fn pause(&self, id: &str) -> Result<(), LocalError> {
        self.inner.pause(id).await
    }

    /// Thaws a paused sandbox.
    pub async fn resume(&self, id: &str) -> Result<(), LocalError> {
        self.inner.resume(id).await
    }

    /// Captures a sandbox's filesystem changes as a snapshot (frozen meanwhile). Runs to
    /// completion even if the returned future is dropped.
    pub async fn snapshot(
        &self,
        spec: crate::backend::SnapshotSpec,
    ) -> Result<crate::backend::BackendSnapshot, LocalError> {
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.snapshot(spec).await })
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
    }

    /// Every snapshot, oldest first.
    pub fn snapshots(&self) -> Result<Vec<crate::backend::BackendSnapshot>, LocalError> {
        self.inner.snapshots()
    }

    /// Deletes a snapshot no sandbox was forked from; answers the bytes freed.
    pub async fn delete_snapshot(&self, id: &str) -> Result<u64, LocalError> {
        self.inner.delete_snapshot(id).await
    }

    /// Lists what is on the host for this backend but belongs to no live sandbox.
    pub async fn audit(&self) -> Result<AuditReport, LocalError> {
        let inner = self.inner.clone();
        tokio::spawn(async move { audit::audit(&inner).await })
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
    }

    /// Deletes every sandbox, removes whatever else is found on the root, then the root
    /// itself. The backend is unusable afterwards.
    pub async fn destroy(&self) -> Result<(), LocalError> {
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.destroy().await })
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
    }
}

/// How long a shutdown waits for the creates in flight to end before it deletes what
/// is there; a create's own limit is longer, but a stopping server cannot wait for it.
const SHUTDOWN_CREATE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl From<LocalError> for crate::backend::BackendError {
    fn from(e: LocalError) -> Self {
        use crate::backend::BackendError as B;
        match e {
            LocalError::NotFound(id) => B::NotFound(id),
            LocalError::AlreadyExists(id) => B::Exists(id),
            LocalError::SnapshotNotFound(id) => B::NotFound(id),
            e @ LocalError::SnapshotInUse { .. } => B::conflict_by(e.to_string(), e),
            e @ (LocalError::InvalidId(_) | LocalError::Invalid(_)) => {
                B::invalid_by(e.to_string(), e)
            }
            e @ LocalError::ShuttingDown => B::unavailable_by(e.to_string(), e),
            e => B::failed_by(e.to_string(), e),
        }
    }
}

fn backend_sandbox(info: SandboxInfo) -> crate::backend::BackendSandbox {
    crate::backend::BackendSandbox {
        id: info.id,
        image: info.image,
        created_at: info.created_at,
        agent: crate::backend::AgentEndpoint::Unix(info.socket),
        token: info.token,
        liveness: info.liveness,
        labels: info.labels,
    }
}

/// Whether `path` is the root of a file system of its own (another device than its
/// parent's): a sandbox's `disk` when its image is mounted there.
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) {
        (Ok(at), Some(Ok(parent))) => at.dev() != parent.dev(),
        _ => false,
    }
}

impl crate::backend::Backend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn create(
        &self,
        spec: crate::backend::CreateSpec,
    ) -> crate::backend::BackendFuture<'_, crate::backend::BackendSandbox> {
        Box::pin(async move {
            let image = match spec.image {
                // A fork runs its snapshot's image, whatever the store holds now.
                _ if spec.snapshot.is_some() => {
                    let sid = spec.snapshot.as_deref().unwrap_or_default();
                    self.inner.snapshot_image(sid)?
                }
                crate::backend::SandboxImage::Local(image) => image,
                crate::backend::SandboxImage::Reference(r) => {
                    return Err(crate::backend::BackendError::invalid(format!(
                        "image {r} is not unpacked: the local backend runs images from the \
                         server's image store"
                    )))
                }
            };
            let mut s = SandboxSpec::new(image);
            s.id = Some(spec.id);
            s.limits.cpus = spec.cpus;
            s.limits.memory_bytes = spec.memory_bytes;
            s.network = if spec.egress {
                NetworkMode::Egress {
                    allow_host_loopback: false,
                }
            } else {
                NetworkMode::None
            };
            s.env = spec.env;
            s.labels = spec.labels;
            s.snapshot = spec.snapshot;
            Ok(backend_sandbox(LocalBackend::create(self, s).await?))
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> crate::backend::BackendFuture<'a, ()> {
        Box::pin(async move { Ok(LocalBackend::delete(self, id).await?) })
    }

    fn list(&self) -> crate::backend::BackendFuture<'_, Vec<crate::backend::BackendSandbox>> {
        Box::pin(async move {
            Ok(LocalBackend::list(self)
                .into_iter()
                .map(backend_sandbox)
                .collect())
        })
    }

    fn disk_room(&self, id: &str) -> Option<crate::backend::DiskRoom> {
        let limit = self.inner.config.disk?;
        if !valid_id(id) {
            return None;
        }
        // The sandbox's image is mounted at its `disk`: what it has free is what the
        // sandbox can still write. Not mounted (gone, or made without a bound by an
        // earlier configuration): the size alone.
        let disk = self.inner.paths(id).disk;
        Some(crate::backend::DiskRoom {
            size: limit.bytes,
            free: is_mount_point(&disk)
                .then(|| crate::diskspace::free(&disk))
                .flatten(),
        })
    }

    fn pause<'a>(&'a self, id: &'a str) -> crate::backend::BackendFuture<'a, ()> {
        Box::pin(async move { Ok(LocalBackend::pause(self, id).await?) })
    }

    fn resume<'a>(&'a self, id: &'a str) -> crate::backend::BackendFuture<'a, ()> {
        Box::pin(async move { Ok(LocalBackend::resume(self, id).await?) })
    }

    fn snapshot(
        &self,
        spec: crate::backend::SnapshotSpec,
    ) -> crate::backend::BackendFuture<'_, crate::backend::BackendSnapshot> {
        Box::pin(async move { Ok(LocalBackend::snapshot(self, spec).await?) })
    }

    fn snapshots(&self) -> crate::backend::BackendFuture<'_, Vec<crate::backend::BackendSnapshot>> {
        Box::pin(async move { Ok(LocalBackend::snapshots(self)?) })
    }

    fn delete_snapshot<'a>(&'a self, id: &'a str) -> crate::backend::BackendFuture<'a, u64> {
        Box::pin(async move { Ok(LocalBackend::delete_snapshot(self, id).await?) })
    }

    fn recover(&self) -> crate::backend::BackendFuture<'_, Vec<String>> {
        Box::pin(async move { Ok(LocalBackend::recover(self).await?.adopted) })
    }

    fn shutdown(&self) -> crate::backend::BackendFuture<'_, ()> {
        Box::pin(async move {
            // Creates in flight finish first (bounded), so that what they make is
            // deleted below: they went on while the process exited, and left running
            // sandboxes and mounts behind (found by a test that stops its server during
            // a burst of creates).
            self.inner.close(SHUTDOWN_CREATE_WAIT).await;
            // On a shared root every listed sandbox is also the other replicas': one
            // replica's exit must not delete them (their records live on in Redis).
            let mut deleted = Ok(());
            if !self.inner.config.shared {
                for s in LocalBackend::list(self) {
                    deleted = LocalBackend::delete(self, &s.id).await;
                    if deleted.is_err() {
                        break;
                    }
                }
            }
            // Whatever the deletes did: the pool is this process's alone.
            self.stop_pool().await?;
            Ok(deleted?)
        })
    }

    /// The sandboxes stay (with Redis, the other replicas' too); the creates in flight
    /// end first, so that theirs are whole, and the disk pool goes: its mounts and loop
    /// devices outlived every kept server before (two per run of the SDK's replica
    /// test, which keeps its sandboxes).
    fn release(&self) -> crate::backend::BackendFuture<'_, ()> {
        Box::pin(async move {
            self.inner.close(SHUTDOWN_CREATE_WAIT).await;
            Ok(self.stop_pool().await?)
        })
    }
}

/// An error about the backend's root, or a file in it, at `path`.
fn root_err(path: &Path) -> impl FnOnce(std::io::Error) -> LocalError {
    let path = path.to_path_buf();
    move |source| LocalError::Root { path, source }
}

/// Opening's step 1: takes the root's lock (shared or exclusive), waiting up to
/// `config.lock_wait` for another process to let it go.
fn lock_root(root: &Path, config: &LocalConfig) -> Result<fs::File, LocalError> {
    let lock_path = root.join("lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(root_err(&lock_path))?;
    // Shared backends coexist; an exclusive one conflicts with any of them.
    let op = if config.shared {
        rustix::fs::FlockOperation::NonBlockingLockShared
    } else {
        rustix::fs::FlockOperation::NonBlockingLockExclusive
    };
    let deadline = std::time::Instant::now() + config.lock_wait;
    let mut said = false;
    while rustix::fs::flock(&lock, op).is_err() {
        if std::time::Instant::now() >= deadline {
            return Err(LocalError::Busy(root.to_path_buf()));
        }
        if !said {
            tracing::warn!(path = %lock_path.display(), wait_s = %config.lock_wait.as_secs(), "another process holds the backend's lock; waiting for it");
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(lock)
}

/// Opening's step 2: the root's tag, read from `backend.json` or made (and written).
fn backend_tag(root: &Path) -> Result<String, LocalError> {
    let backend_file = root.join("backend.json");
    let tag = match fs::read(&backend_file)
        .ok()
        .and_then(|b| serde_json::from_slice::<BackendFile>(&b).ok())
    {
        Some(f) if !f.tag.is_empty() && f.tag.bytes().all(|c| c.is_ascii_hexdigit()) => f.tag,
        _ => {
            let tag = crate::random::hex(4)?;
            let bytes = serde_json::to_vec(&BackendFile { tag: tag.clone() })
                .map_err(|e| LocalError::Task(e.to_string()))?;
            fs::write(&backend_file, bytes).map_err(root_err(&backend_file))?;
            tag
        }
    };
    Ok(tag)
}

/// Opening's step 3: copies the agent (and the harness) into `inject_dir`, one
/// process of a shared root at a time.
fn inject(root: &Path, config: &LocalConfig, inject_dir: &Path) -> Result<(), LocalError> {
    // Backends sharing the root may start together: the injector removes the temporary
    // files it finds (a dead injector's), which would be a live one's here. Held
    // only while injecting, by a live process (the kernel drops a dead one's).
    let inject_lock_path = root.join("inject.lock");
    let inject_lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&inject_lock_path)
        .map_err(root_err(&inject_lock_path))?;
    rustix::fs::flock(&inject_lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
        LocalError::Root {
            path: inject_lock_path.clone(),
            source: e.into(),
        }
    })?;
    orchard_injector::inject(&orchard_injector::InjectRequest {
        agent: config.agent.clone(),
        harness: config.harness.clone(),
        target: inject_dir.to_path_buf(),
    })?;
    drop(inject_lock);
    Ok(())
}
