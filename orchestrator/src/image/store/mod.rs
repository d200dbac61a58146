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

use std::collections::{HashMap, HashSet};
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use super::digest::{self, of_bytes, verify_bytes};
use super::gc::GcState;
use super::manifest::{
    check_config_type, check_layer_type, parse_manifest, select_platform, ConfigFile, Descriptor,
    Manifest, ManifestDoc,
};
use super::reference::Reference;
use super::registry::{self, Endpoint, RegistryClient};
use super::unpack;
use super::{Image, ImageConfig, ImageError};

/// Largest image config read into memory.
pub(crate) const MAX_CONFIG: usize = 32 << 20;
/// Layers downloaded at once, across all pulls, by default.
const DEFAULT_PARALLEL_LAYERS: usize = 3;
/// Chunks queued between a download and its unpacking thread.
const QUEUE: usize = 16;
/// Bytes between two progress reports of one layer.
const PROGRESS_STEP: u64 = 256 << 10;
/// Longest record file name before it is replaced by a hash of the name.
const MAX_RECORD_NAME: usize = 200;

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

/// What `ROOT/images/<name>.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) reference: String,
    /// The platform manifest's digest.
    pub(crate) digest: String,
    /// The index's digest, when the name pointed at one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) index_digest: Option<String>,
    pub(crate) config_digest: String,
    pub(crate) diff_ids: Vec<String>,
    config: ImageConfig,
    /// Unix seconds of the pull or import.
    pub(crate) created: u64,
}

type Listener = Arc<dyn Fn(Progress) + Send + Sync>;
type Outcome<T> = Option<Result<T, ImageError>>;

/// Runs of some work keyed by name, so concurrent requests for the same thing share one.
struct Flights<T> {
    map: Arc<Mutex<HashMap<String, FlightEntry<T>>>>,
}

struct FlightEntry<T> {
    outcome: watch::Receiver<Outcome<T>>,
    listeners: Arc<Mutex<Vec<Listener>>>,
}

enum Role<T> {
    /// Do the work, then [`Flight::finish`].
    Leader(Flight<T>),
    /// Wait for the leader's outcome.
    Follower(watch::Receiver<Outcome<T>>),
}

/// The leader's handle. Dropping it without finishing (the leader was cancelled) wakes
/// the followers with a closed channel, and one of them takes over.
struct Flight<T> {
    map: Arc<Mutex<HashMap<String, FlightEntry<T>>>>,
    key: String,
    outcome: watch::Sender<Outcome<T>>,
    listeners: Arc<Mutex<Vec<Listener>>>,
    finished: bool,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not make the store unusable: the guarded data (maps of
    // in-flight work, pins) stays consistent at every step.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T: Clone> Flights<T> {
    fn new() -> Self {
        Flights {
            map: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn join(&self, key: &str, listener: Option<Listener>) -> Role<T> {
        let mut map = lock(&self.map);
        if let Some(entry) = map.get(key) {
            if let Some(listener) = listener {
                lock(&entry.listeners).push(listener);
            }
            return Role::Follower(entry.outcome.clone());
        }
        let (sender, receiver) = watch::channel(None);
        let listeners = Arc::new(Mutex::new(listener.into_iter().collect()));
        map.insert(
            key.to_string(),
            FlightEntry {
                outcome: receiver,
                listeners: listeners.clone(),
            },
        );
        Role::Leader(Flight {
            map: self.map.clone(),
            key: key.to_string(),
            outcome: sender,
            listeners,
            finished: false,
        })
    }
}

/// Waits for a leader; `None` when it was cancelled without an outcome.
async fn follow<T: Clone>(
    mut outcome: watch::Receiver<Outcome<T>>,
) -> Option<Result<T, ImageError>> {
    let value = outcome.wait_for(Option::is_some).await.ok()?;
    value.clone()
}

impl<T: Clone> Flight<T> {
    fn finish(mut self, result: Result<T, ImageError>) -> Result<T, ImageError> {
        // Removing the entry first means a request arriving now starts afresh instead of
        // joining a finished run.
        lock(&self.map).remove(&self.key);
        self.finished = true;
        let _ = self.outcome.send(Some(result.clone()));
        result
    }

    /// Calls every listener (the leader's and the followers') with `progress`.
    fn broadcaster(&self) -> Listener {
        let listeners = self.listeners.clone();
        Arc::new(move |progress: Progress| {
            let current: Vec<Listener> = lock(&listeners).clone();
            for listener in current {
                listener(progress.clone());
            }
        })
    }
}

impl<T> Drop for Flight<T> {
    fn drop(&mut self) {
        // After finish() a new leader may own the key; before, the entry is ours.
        if !self.finished {
            lock(&self.map).remove(&self.key);
        }
    }
}

/// Counts layers of one pull and fans its progress out.
#[derive(Clone)]
struct Reporter {
    reference: String,
    total: usize,
    done: Arc<AtomicUsize>,
    listener: Listener,
}

impl Reporter {
    fn bytes(&self, layer: &str, done: u64, total: u64) {
        (self.listener)(Progress {
            reference: self.reference.clone(),
            layer: layer.to_string(),
            layer_bytes_done: done,
            layer_bytes_total: total,
            layers_done: self.done.load(Ordering::SeqCst),
            layers_total: self.total,
        });
    }

    fn layer_done(&self, layer: &str, size: u64) {
        let done = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        (self.listener)(Progress {
            reference: self.reference.clone(),
            layer: layer.to_string(),
            layer_bytes_done: size,
            layer_bytes_total: size,
            layers_done: done.min(self.total),
            layers_total: self.total,
        });
    }
}

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
    // SAFETY: the descriptor is valid for the duration of the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
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

/// Feeds downloaded chunks to a blocking reader (the unpacking thread).
struct ChannelReader {
    chunks: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
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

impl Inner {
    fn pin(&self, keys: Vec<String>) -> Pins<'_> {
        let mut pins = lock(&self.pins);
        for key in &keys {
            *pins.entry(key.clone()).or_insert(0) += 1;
        }
        Pins { inner: self, keys }
    }

    /// Pins the blobs and layers of an image.
    pub(crate) fn pin_image(
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

    pub(crate) fn layer_path(&self, diff_id: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("layers").join(digest::hex_of(diff_id)?))
    }

    pub(crate) fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("blobs/sha256").join(digest::hex_of(digest)?))
    }

    pub(crate) fn record_path(&self, reference: &str) -> PathBuf {
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
    pub(crate) fn work_dir(&self, what: &str) -> Result<WorkDir, ImageError> {
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

    pub(crate) fn work_path(&self, what: &str) -> PathBuf {
        let n = self.work_counter.fetch_add(1, Ordering::SeqCst);
        self.root
            .join("tmp")
            .join(format!("{}.{n}.{what}", std::process::id()))
    }

    /// Writes `bytes` to `dest` through a temporary file and a rename.
    fn write_atomic(&self, dest: &Path, bytes: &[u8]) -> Result<(), ImageError> {
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
    pub(crate) fn write_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.blob_path(digest)?;
        if path.is_file() {
            return Ok(());
        }
        self.write_atomic(&path, bytes)
    }

    fn read_blob(&self, digest: &str) -> Option<Vec<u8>> {
        let bytes = fs::read(self.blob_path(digest).ok()?).ok()?;
        // A blob damaged on disk is fetched again rather than trusted.
        verify_bytes("blob", &bytes, digest).ok()?;
        Some(bytes)
    }

    /// Records an image under its name and returns it.
    pub(crate) fn record(
        &self,
        reference: &str,
        digest: &str,
        index_digest: Option<String>,
        config_digest: &str,
        config: &ConfigFile,
    ) -> Result<Image, ImageError> {
        let record = Record {
            reference: reference.to_string(),
            digest: digest.to_string(),
            index_digest,
            config_digest: config_digest.to_string(),
            diff_ids: config.diff_ids().to_vec(),
            config: config.image_config(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let json = serde_json::to_vec_pretty(&record)
            .map_err(|err| ImageError::invalid("image record", err.to_string()))?;
        let path = self.record_path(reference);
        {
            let _records = lock(&self.records);
            self.write_atomic(&path, &json)?;
        }
        self.gc_state.changed();
        self.image_of(&record)
    }

    fn read_record(&self, reference: &str) -> Result<Option<Record>, ImageError> {
        let path = self.record_path(reference);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(ImageError::io("cannot read", &path)(err)),
        };
        let record: Record = serde_json::from_slice(&bytes).map_err(|err| {
            ImageError::invalid(format!("image record {}", path.display()), err.to_string())
        })?;
        // A hashed file name could in theory collide: the record says whose it is.
        Ok((record.reference == reference).then_some(record))
    }

    /// All records. With `strict`, an unreadable record is an error (gc must not
    /// delete the layers of an image it could not read); without, it is skipped.
    pub(crate) fn read_records(&self, strict: bool) -> Result<Vec<Record>, ImageError> {
        let dir = self.root.join("images");
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).map_err(ImageError::io("cannot list", &dir))? {
            let entry = entry.map_err(ImageError::io("cannot list", &dir))?;
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "json") {
                let parsed = fs::read(&path)
                    .map_err(ImageError::io("cannot read", &path))
                    .and_then(|bytes| {
                        serde_json::from_slice::<Record>(&bytes).map_err(|err| {
                            ImageError::invalid(
                                format!("image record {}", path.display()),
                                err.to_string(),
                            )
                        })
                    });
                match parsed {
                    Ok(record) => records.push(record),
                    Err(err) if strict => return Err(err),
                    Err(_) => {}
                }
            }
        }
        Ok(records)
    }

    fn image_of(&self, record: &Record) -> Result<Image, ImageError> {
        Ok(Image {
            reference: record.reference.clone(),
            digest: record.digest.clone(),
            layers: record
                .diff_ids
                .iter()
                .map(|diff_id| self.layer_path(diff_id))
                .collect::<Result<_, _>>()?,
            config: record.config.clone(),
        })
    }

    /// Removes what dead processes left in `tmp/`.
    fn clean_tmp(&self) {
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

    async fn pull_now(
        self: Arc<Self>,
        reference: Reference,
        report: Listener,
    ) -> Result<Image, ImageError> {
        let name = reference.to_string();
        let endpoints = Arc::new(registry::endpoints(&self.config, &reference));
        let fetched = self
            .registry
            .manifest(&endpoints, &reference, reference.manifest_ref(), 0)
            .await?;
        let first = fetched.endpoint;
        let what = format!("manifest of {name}");
        let top_digest = of_bytes(&fetched.bytes);
        if let Some(pinned) = &reference.digest {
            verify_bytes(&what, &fetched.bytes, pinned)?;
        }
        if let Some(header) = fetched
            .digest_header
            .as_deref()
            .filter(|h| h.starts_with(digest::SHA256_PREFIX))
        {
            verify_bytes(&what, &fetched.bytes, header)?;
        }
        // (manifest, its digest, the index and its digest when the name points at one)
        let (manifest_bytes, manifest_digest, index, manifest) =
            match parse_manifest(&fetched.bytes, fetched.content_type.as_deref(), &what)? {
                ManifestDoc::Manifest(manifest) => (fetched.bytes, top_digest, None, manifest),
                ManifestDoc::Index(index) => {
                    let chosen = select_platform(&index, &name)?.digest.clone();
                    digest::hex_of(&chosen)?;
                    let child = self
                        .registry
                        .manifest(&endpoints, &reference, &chosen, first)
                        .await?;
                    let child_what = format!("manifest {chosen} of {name}");
                    verify_bytes(&child_what, &child.bytes, &chosen)?;
                    match parse_manifest(&child.bytes, child.content_type.as_deref(), &child_what)?
                    {
                        ManifestDoc::Manifest(manifest) => (
                            child.bytes,
                            chosen,
                            Some((fetched.bytes, top_digest)),
                            manifest,
                        ),
                        ManifestDoc::Index(_) => {
                            return Err(ImageError::invalid(
                                child_what,
                                "an index inside an index",
                            ));
                        }
                    }
                }
            };
        check_manifest(&manifest, &name)?;
        let config_digest = manifest.config.digest.clone();
        let config_bytes = match self.read_blob(&config_digest) {
            Some(bytes) => bytes,
            None => {
                let bytes = self
                    .registry
                    .small_blob(&endpoints, &reference, &config_digest, first, MAX_CONFIG)
                    .await?;
                verify_bytes(
                    &format!("config {config_digest} of {name}"),
                    &bytes,
                    &config_digest,
                )?;
                bytes
            }
        };
        let config = ConfigFile::parse(
            &config_bytes,
            &format!("config of {name}"),
            manifest.layers.len(),
        )?;
        let mut blobs = vec![manifest_digest.as_str(), config_digest.as_str()];
        blobs.extend(index.as_ref().map(|(_, digest)| digest.as_str()));
        let _pins = self.pin_image(&blobs, config.diff_ids())?;
        self.write_blob(&manifest_digest, &manifest_bytes)?;
        self.write_blob(&config_digest, &config_bytes)?;
        if let Some((bytes, digest)) = &index {
            self.write_blob(digest, bytes)?;
        }

        let reporter = Reporter {
            reference: name.clone(),
            total: manifest.layers.len(),
            done: Arc::new(AtomicUsize::new(0)),
            listener: report,
        };
        let mut tasks = JoinSet::new();
        for (descriptor, diff_id) in manifest.layers.iter().zip(config.diff_ids()) {
            let task = LayerTask {
                reference: reference.clone(),
                endpoints: endpoints.clone(),
                first,
                descriptor: descriptor.clone(),
                diff_id: diff_id.clone(),
                reporter: reporter.clone(),
            };
            tasks.spawn(self.clone().ensure_layer(task));
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                // Returning drops the JoinSet, which aborts the other layers.
                Ok(Err(err)) => return Err(err),
                Err(err) => {
                    return Err(ImageError::invalid(
                        format!("layers of {name}"),
                        format!("download task failed: {err}"),
                    ))
                }
            }
        }
        let index_digest = index.map(|(_, digest)| digest);
        self.record(
            &name,
            &manifest_digest,
            index_digest,
            &config_digest,
            &config,
        )
    }

    /// Makes sure a layer is unpacked, downloading it unless it is there or another
    /// pull is already fetching it.
    async fn ensure_layer(self: Arc<Self>, task: LayerTask) -> Result<(), ImageError> {
        let dest = self.layer_path(&task.diff_id)?;
        let key = digest::hex_of(&task.diff_id)?.to_string();
        loop {
            if dest.is_dir() {
                task.reporter
                    .layer_done(&task.descriptor.digest, task.descriptor.size);
                return Ok(());
            }
            match self.layers.join(&key, None) {
                Role::Leader(flight) => {
                    let result = flight.finish(self.clone().download_layer(&task, &dest).await);
                    if result.is_ok() {
                        task.reporter
                            .layer_done(&task.descriptor.digest, task.descriptor.size);
                    }
                    return result;
                }
                Role::Follower(outcome) => match follow(outcome).await {
                    Some(Ok(())) => {
                        task.reporter
                            .layer_done(&task.descriptor.digest, task.descriptor.size);
                        return Ok(());
                    }
                    Some(Err(err)) => return Err(err),
                    None => continue,
                },
            }
        }
    }

    /// Streams a layer blob into an unpacking thread, then installs the layer.
    async fn download_layer(
        self: Arc<Self>,
        task: &LayerTask,
        dest: &Path,
    ) -> Result<(), ImageError> {
        let _permit = self
            .downloads
            .acquire()
            .await
            .map_err(|_| ImageError::invalid("image store", "shutting down"))?;
        if dest.is_dir() {
            return Ok(());
        }
        let descriptor = &task.descriptor;
        let what = format!("layer {} of {}", descriptor.digest, task.reference);
        let mut response = self
            .registry
            .blob(
                &task.endpoints,
                &task.reference,
                &descriptor.digest,
                task.first,
            )
            .await?;
        let source = response.url().to_string();
        let total = if descriptor.size > 0 {
            descriptor.size
        } else {
            response.content_length().unwrap_or(0)
        };
        let work = self.work_dir("layer")?;
        let (sender, receiver) = mpsc::channel::<Bytes>(QUEUE);
        // The work directory goes with the thread: if this task is cancelled, the thread
        // still sees the end of the stream, finishes, and its drop removes the directory
        // (not before, while it is still being written).
        let unpacking = {
            let blob = descriptor.digest.clone();
            let diff_id = task.diff_id.clone();
            let what = what.clone();
            tokio::task::spawn_blocking(move || {
                let reader = ChannelReader {
                    chunks: receiver,
                    current: Bytes::new(),
                };
                let result =
                    unpack::unpack_verified(reader, work.path(), Some(&blob), &diff_id, &what);
                (work, result)
            })
        };
        let mut received = 0u64;
        let mut reported = 0u64;
        let mut failure = None;
        task.reporter.bytes(&descriptor.digest, 0, total);
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    received += chunk.len() as u64;
                    if descriptor.size > 0 && received > descriptor.size {
                        failure = Some(ImageError::invalid(
                            &what,
                            format!(
                                "{source} sent more than the {} bytes the manifest declares",
                                descriptor.size
                            ),
                        ));
                        break;
                    }
                    if sender.send(chunk).await.is_err() {
                        break;
                    }
                    if received - reported >= PROGRESS_STEP {
                        reported = received;
                        task.reporter.bytes(&descriptor.digest, received, total);
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    failure = Some(ImageError::Unreachable {
                        reference: task.reference.to_string(),
                        tried: vec![format!(
                            "{source}: download interrupted: {}",
                            super::error::chain(&err)
                        )],
                    });
                    break;
                }
            }
        }
        drop(sender);
        let (work, outcome) = unpacking
            .await
            .map_err(|err| ImageError::invalid(&what, format!("unpacking thread failed: {err}")))?;
        // A broken download explains whatever the unpacker then saw.
        if let Some(failure) = failure {
            return Err(failure);
        }
        outcome?;
        task.reporter.bytes(&descriptor.digest, received, total);
        // Flushing a large layer takes a while: off the async threads.
        let dest = dest.to_path_buf();
        tokio::task::spawn_blocking(move || work.install(&dest))
            .await
            .map_err(|err| ImageError::invalid(&what, format!("install thread failed: {err}")))?
    }

    fn gc(&self, in_use: &[PathBuf]) -> Result<GcReport, ImageError> {
        let mut doomed = Vec::new();
        let mut report = GcReport::default();
        {
            let _records = lock(&self.records);
            let records = self.read_records(true)?;
            let mut keep: HashSet<String> = HashSet::new();
            for record in &records {
                for diff_id in &record.diff_ids {
                    keep.insert(format!("layers/{}", digest::hex_of(diff_id)?));
                }
                for blob in [
                    Some(&record.digest),
                    Some(&record.config_digest),
                    record.index_digest.as_ref(),
                ]
                .into_iter()
                .flatten()
                {
                    keep.insert(format!("blobs/{}", digest::hex_of(blob)?));
                }
            }
            for path in in_use {
                if let Some(name) = path.file_name() {
                    keep.insert(format!("layers/{}", name.to_string_lossy()));
                }
            }
            let pins = lock(&self.pins);
            for (kind, dir) in [
                ("layers", self.root.join("layers")),
                ("blobs", self.root.join("blobs/sha256")),
            ] {
                for entry in fs::read_dir(&dir).map_err(ImageError::io("cannot list", &dir))? {
                    let entry = entry.map_err(ImageError::io("cannot list", &dir))?;
                    let name = entry.file_name().to_string_lossy().to_string();
                    if digest::hex_of(&format!("{}{name}", digest::SHA256_PREFIX)).is_err() {
                        continue; // not ours
                    }
                    let key = format!("{kind}/{name}");
                    if keep.contains(&key) || pins.contains_key(&key) {
                        continue;
                    }
                    // Out of sight first (atomic), deleted later outside the locks: a
                    // crash midway leaves junk in tmp/, never a half layer in layers/.
                    let grave = self.work_path("gc");
                    fs::rename(entry.path(), &grave)
                        .map_err(ImageError::io("cannot remove", &entry.path()))?;
                    if kind == "layers" {
                        report.layers_removed += 1;
                    } else {
                        report.blobs_removed += 1;
                    }
                    doomed.push(grave);
                }
            }
        }
        for path in doomed {
            report.bytes_freed += super::gc::allocated(&path, &mut HashSet::new());
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(ImageError::io("cannot remove", &path))?;
        }
        self.clean_tmp();
        Ok(report)
    }
}

/// What a layer download needs, owned so it can run as its own task.
struct LayerTask {
    reference: Reference,
    endpoints: Arc<Vec<Endpoint>>,
    first: usize,
    descriptor: Descriptor,
    diff_id: String,
    reporter: Reporter,
}

/// Checks media types and digests of a manifest before anything is fetched.
pub fn check_manifest(manifest: &Manifest, name: &str) -> Result<(), ImageError> {
    check_config_type(&manifest.config, name)?;
    digest::hex_of(&manifest.config.digest)?;
    for layer in &manifest.layers {
        check_layer_type(layer, name)?;
        digest::hex_of(&layer.digest)?;
    }
    Ok(())
}
