//! The store itself: pulls, imports, lookups, removal and garbage collection over a
//! content-addressed directory tree.
//!
//! ```text
//! ROOT/blobs/sha256/<hex>     manifests and configs of stored images, as fetched
//! ROOT/layers/<hex>/          one unpacked layer per uncompressed digest (diff_id):
//!                             an overlayfs lower dir, complete once it exists
//! ROOT/images/<name>.json     one record per image name (see `Record`)
//! ROOT/tmp/<pid>.<n>.<what>   work in progress; what a dead process left is removed
//! ```
//!
//! Layers are keyed by diff_id so one layer is unpacked once whatever compression it
//! came in and whichever image it belongs to. A layer is unpacked into `tmp/` and renamed
//! into `layers/` only once both its digests checked out, so `layers/<hex>` existing
//! means complete, even after a crash. Compressed layer blobs are not kept: they are
//! unpacked as they stream in.
//!
//! Concurrency inside one process: pulls of the same name share one run (the others wait
//! on a watch channel and get its outcome and progress), and so do downloads of the same
//! layer by different images. Garbage collection never removes what a running pull or
//! import has pinned, nor what an image record names. One process owns a root: two
//! processes on one root are safe for pulls (renames are atomic) but not for `gc`.
//!
//! One file per part: `pull` (manifests, configs and layers from a registry),
//! `records` (the image records), `layout` (paths, work directories, atomic writes
//! and pins), `flight` (concurrent requests sharing one run) and `sweep` (removing what
//! nothing names). This module holds the public types and [`ImageStore`]'s methods.

use std::collections::HashMap;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Semaphore;

use super::gc::GcState;
use super::reference::Reference;
use super::registry::RegistryClient;
use super::{Image, ImageError};

use self::flight::{follow, Flights, Listener, Role};

mod flight;
mod layout;
mod pull;
mod records;
mod sweep;

pub use self::pull::check_manifest;
pub(crate) use self::records::Record;

/// Largest image config read into memory.
pub(crate) const MAX_CONFIG: usize = 32 << 20;
/// Layers downloaded at once, across all pulls, by default.
const DEFAULT_PARALLEL_LAYERS: usize = 3;

/// User name and password for a registry (basic auth, or to obtain a token).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or access token.
    pub password: String,
    /// An OAuth2 refresh token (Docker's `identitytoken`), traded at the token server
    /// for access tokens instead of sending the user name and password.
    pub identity_token: Option<String>,
}

impl Credentials {
    /// A user name and password.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            password: password.into(),
            identity_token: None,
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password, not even in debug logs.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field(
                "identity_token",
                &self.identity_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// How the store reaches registries.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Registry host (`docker.io`, `ghcr.io`, `127.0.0.1:5000`) to mirror endpoints
    /// (`http://127.0.0.1:5000`, `mirror.example.com`), tried in order before the
    /// registry itself. A mirror without a scheme gets HTTPS unless it is loopback or
    /// listed in `insecure_registries`.
    pub mirrors: HashMap<String, Vec<String>>,
    /// Hosts (`host` or `host:port`) reached over plain HTTP. Loopback always is.
    pub insecure_registries: Vec<String>,
    /// Credentials per registry host or mirror host (`host` or `host:port`).
    pub credentials: HashMap<String, Credentials>,
    /// Layers downloaded at once across all pulls.
    pub parallel_layers: usize,
    /// Which hosts pulls may reach (unrestricted by default; `orchard serve` restricts).
    pub targets: super::targets::TargetPolicy,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            mirrors: HashMap::new(),
            insecure_registries: Vec::new(),
            credentials: HashMap::new(),
            parallel_layers: DEFAULT_PARALLEL_LAYERS,
            targets: super::targets::TargetPolicy::default(),
        }
    }
}

/// Where a pull is, for a progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The normalised reference being pulled.
    pub reference: String,
    /// Digest of the layer blob this report is about.
    pub layer: String,
    /// Bytes of that layer received so far.
    pub layer_bytes_done: u64,
    /// Size of that layer blob.
    pub layer_bytes_total: u64,
    /// Layers complete (downloaded and unpacked, or already present).
    pub layers_done: usize,
    /// Layers in the image.
    pub layers_total: usize,
}

/// What [`ImageStore::gc`] removed.
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

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not make the store unusable: the guarded data (maps of
    // in-flight work, pins) stays consistent at every step.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The image store. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct ImageStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) root: PathBuf,
    config: StoreConfig,
    registry: RegistryClient,
    /// Held while image records are written or removed, and through a gc scan.
    pub(crate) records: Mutex<()>,
    /// Pin counts of `layers/<hex>` and `blobs/<hex>` keys.
    pub(crate) pins: Mutex<HashMap<String, usize>>,
    /// Disk budget bookkeeping.
    pub(crate) gc_state: GcState,
    pulls: Flights<Image>,
    layers: Flights<()>,
    downloads: Semaphore,
    work_counter: AtomicU64,
}

impl ImageStore {
    /// Opens (creating it if needed) the store at `root`, removing work directories that
    /// dead processes left behind.
    pub fn open(root: impl Into<PathBuf>, config: StoreConfig) -> Result<ImageStore, ImageError> {
        let root = root.into();
        for dir in ["blobs/sha256", "layers", "images", "tmp"] {
            let path = root.join(dir);
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(ImageError::io("cannot create store directory", &path))?;
        }
        let root = root
            .canonicalize()
            .map_err(ImageError::io("cannot resolve", &root))?;
        let registry = RegistryClient::new(config.targets.clone())?;
        let inner = Inner {
            root,
            downloads: Semaphore::new(config.parallel_layers.max(1)),
            config,
            registry,
            records: Mutex::new(()),
            pins: Mutex::new(HashMap::new()),
            pulls: Flights::new(),
            layers: Flights::new(),
            work_counter: AtomicU64::new(0),
            gc_state: GcState::new(),
        };
        inner.clean_tmp();
        Ok(ImageStore {
            inner: Arc::new(inner),
        })
    }

    /// The store's root directory (absolute).
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Pulls `reference` from its registry (through its mirrors first), resolving an
    /// index to linux/amd64, and records it under its normalised name. Layers already in
    /// the store are not downloaded again. `progress` is called as bytes arrive and as
    /// layers complete. A pull of a name already being pulled waits for that pull and
    /// shares its outcome (and its progress from then on).
    pub async fn pull<F>(&self, reference: &str, progress: F) -> Result<Image, ImageError>
    where
        F: Fn(Progress) + Send + Sync + 'static,
    {
        let reference = Reference::parse(reference)?;
        let key = reference.to_string();
        let listener: Listener = Arc::new(progress);
        loop {
            match self.inner.pulls.join(&key, Some(listener.clone())) {
                Role::Leader(flight) => {
                    let report = flight.broadcaster();
                    let result = self.inner.clone().pull_now(reference.clone(), report).await;
                    return flight.finish(result);
                }
                Role::Follower(outcome) => {
                    if let Some(result) = follow(outcome).await {
                        return result;
                    }
                    // The leader was cancelled: try again, maybe as the leader.
                }
            }
        }
    }

    /// The image if the store has it, else pulls it.
    pub async fn ensure<F>(&self, reference: &str, progress: F) -> Result<Image, ImageError>
    where
        F: Fn(Progress) + Send + Sync + 'static,
    {
        match self.get(reference)? {
            Some(image) => Ok(image),
            None => self.pull(reference, progress).await,
        }
    }

    /// Imports a `docker save` archive (tar, optionally gzip or zstd compressed, or its
    /// extracted directory) or an OCI image layout (directory or tar). Images are named by
    /// `name` when given (the archive must then hold exactly one image, or one whose
    /// `org.opencontainers.image.ref.name` is `name`'s tag), else by the names the archive
    /// carries (`RepoTags`, or `io.containerd.image.name` / a full reference in
    /// `org.opencontainers.image.ref.name`). Blocking: call it from `spawn_blocking` in
    /// async code.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<Vec<Image>, ImageError> {
        super::import::import(&self.inner, path, name)
    }

    /// The image stored under `reference` (normalised), if it is there and complete.
    pub fn get(&self, reference: &str) -> Result<Option<Image>, ImageError> {
        let reference = Reference::parse(reference)?;
        let Some(record) = self.inner.read_record(&reference.to_string())? else {
            return Ok(None);
        };
        let image = self.inner.image_of(&record)?;
        let complete = image.layers.iter().all(|layer| layer.is_dir());
        if complete {
            // A budget pass running now must not take it from under the caller.
            self.inner.gc_state.handed_out(
                &record.reference,
                &self.inner.record_path(&record.reference),
            );
        }
        Ok(complete.then_some(image))
    }

    /// Every stored image, sorted by name.
    pub fn list(&self) -> Result<Vec<Image>, ImageError> {
        let mut images = Vec::new();
        for record in self.inner.read_records(false)? {
            images.push(self.inner.image_of(&record)?);
        }
        images.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(images)
    }

    /// Forgets the image named `reference`. Its layers stay until [`ImageStore::gc`].
    pub fn remove(&self, reference: &str) -> Result<(), ImageError> {
        let reference = Reference::parse(reference)?.to_string();
        let path = self.inner.record_path(&reference);
        let _records = lock(&self.inner.records);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Err(ImageError::UnknownImage {
                reference,
                tried: Vec::new(),
            }),
            Err(err) => Err(ImageError::io("cannot remove", &path)(err)),
        }
    }

    /// Removes layers and blobs no image record names and no pull or import is using.
    pub fn gc(&self) -> Result<GcReport, ImageError> {
        self.gc_keeping(&[])
    }

    /// Like [`ImageStore::gc`], also keeping the layer directories in `in_use` (those of
    /// running sandboxes whose image was removed: an overlayfs lower dir must not change
    /// under a mount).
    pub fn gc_keeping(&self, in_use: &[PathBuf]) -> Result<GcReport, ImageError> {
        self.inner.gc(in_use)
    }
}
