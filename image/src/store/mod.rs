//! The store itself: pulls, lookups, removal and garbage collection over a
//! content-addressed directory tree. Imports (`crate::import`) and disk budgets
//! (`crate::gc`) sit on top of it and use only [`ImageStore`]'s methods.
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
//! One file per part, imports running down this list: `pull` (manifests, configs and
//! layers from a registry), `records` (the image records), `sweep` (removing what
//! nothing names), `layout` (paths, work directories, atomic writes and pins),
//! `inner` (the state every clone shares), `flight` (concurrent requests sharing one
//! run), `usage` (sizes and last uses, for budgets) and `sync`. This module holds
//! [`ImageStore`] and its methods: the public ones, and those `import` and `gc` use.

use std::collections::{HashMap, HashSet};
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{watch, Semaphore};

use crate::config::StoreConfig;
use crate::manifest::ConfigFile;
use crate::reference::Reference;
use crate::registry::RegistryClient;
use crate::{Image, ImageError};

use self::flight::{follow, Flights, Listener, Role};
use self::inner::Inner;
use self::layout::{Pins, WorkDir};
use self::sync::lock;
use self::usage::GcState;

mod flight;
mod inner;
mod layout;
mod pull;
mod records;
mod sweep;
mod sync;
mod usage;

pub use self::flight::Progress;
pub use self::pull::check_manifest;
pub(crate) use self::pull::MAX_CONFIG;
pub use self::sweep::GcReport;
pub(crate) use self::usage::Sizes;

/// The image store. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

/// A stored image as a budget pass weighs it ([`ImageStore::forget_chosen`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Its normalised name.
    pub(crate) reference: String,
    /// The `layers/<hex>` and `blobs/<hex>` keys its record names.
    pub(crate) keys: Vec<String>,
    /// When it was last used: its record's mtime (written at the pull or import,
    /// touched by `get`; nanoseconds, so two pulls in one second are ordered), else its
    /// creation.
    pub(crate) last_used: SystemTime,
    /// When this process last handed it out (`get`), if it did.
    pub(crate) handed_out: Option<Instant>,
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

    /// A receiver that changes whenever an image is pulled or imported.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.gc_state.subscribe()
    }

    /// Allocated bytes of the store's layers and blobs.
    pub fn usage(&self) -> Result<u64, ImageError> {
        Ok(self.sizes()?.total())
    }
}

/// What `import` writes with: pins, work directories, blobs and records.
impl ImageStore {
    /// Pins the blobs and layers of an image until the guard drops: gc leaves them.
    pub(crate) fn pin_image(
        &self,
        blobs: &[&str],
        diff_ids: &[String],
    ) -> Result<Pins<'_>, ImageError> {
        self.inner.pin_image(blobs, diff_ids)
    }

    /// Where the unpacked layer `diff_id` lives, complete once it exists.
    pub(crate) fn layer_path(&self, diff_id: &str) -> Result<PathBuf, ImageError> {
        self.inner.layer_path(diff_id)
    }

    /// A fresh directory under `tmp/`, removed on drop unless installed.
    pub(crate) fn work_dir(&self, what: &str) -> Result<WorkDir, ImageError> {
        self.inner.work_dir(what)
    }

    /// A fresh path under `tmp/` (nothing is created), which the store removes at its
    /// next start if this process dies.
    pub(crate) fn work_path(&self, what: &str) -> PathBuf {
        self.inner.work_path(what)
    }

    /// Stores a verified blob (manifest or config) unless it is there already.
    pub(crate) fn write_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
        self.inner.write_blob(digest, bytes)
    }

    /// Records an image under its name (its blobs and layers already stored) and
    /// returns it.
    pub(crate) fn record(
        &self,
        reference: &str,
        digest: &str,
        index_digest: Option<String>,
        config_digest: &str,
        config: &ConfigFile,
    ) -> Result<Image, ImageError> {
        self.inner
            .record(reference, digest, index_digest, config_digest, config)
    }
}

/// What `gc` measures and forgets with.
impl ImageStore {
    /// Sizes of everything in the store, by `layers/<hex>` and `blobs/<hex>` key.
    pub(crate) fn sizes(&self) -> Result<Sizes, ImageError> {
        self.inner.gc_state.sizes(&self.inner.root)
    }

    /// Forgets the images `choose` names and answers their names; their layers and
    /// blobs stay until the next sweep. `choose` is called with the records lock held,
    /// with every stored image (an unreadable record fails the call: gc must not delete
    /// the layers of an image it could not read) and the keys running pulls and imports
    /// have pinned, so no image is recorded or removed between the choice and the
    /// removal.
    pub(crate) fn forget_chosen(
        &self,
        choose: impl FnOnce(&[Stored], &HashSet<String>) -> Vec<String>,
    ) -> Result<Vec<String>, ImageError> {
        let inner = &self.inner;
        let _records = lock(&inner.records);
        let mut stored = Vec::new();
        for record in inner.read_records(true)? {
            let created = SystemTime::UNIX_EPOCH + Duration::from_secs(record.created);
            let last_used = fs::metadata(inner.record_path(&record.reference))
                .and_then(|m| m.modified())
                .map_or(created, |mtime| mtime.max(created));
            stored.push(Stored {
                keys: record.keys()?,
                last_used,
                handed_out: inner.gc_state.last_handed_out(&record.reference),
                reference: record.reference,
            });
        }
        let pinned: HashSet<String> = lock(&inner.pins).keys().cloned().collect();
        let chosen = choose(&stored, &pinned);
        for name in &chosen {
            let path = inner.record_path(name);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(ImageError::io("cannot remove", &path)(err)),
            }
        }
        Ok(chosen)
    }
}
