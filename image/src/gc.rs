//! Keeping the store under a disk budget: when unpacked layers and blobs take more than
//! the budget, the least recently used images that no live sandbox uses are forgotten,
//! then every layer and blob nothing names any more is removed, until the store fits.
//!
//! What is in use comes from outside the store ([`InUse`]): the image names of the
//! service's sandboxes (including those still being created) and the layer directories
//! of every overlay mounted on this host ([`mounted_layers`], read from
//! `/proc/self/mountinfo`, so sandboxes adopted from a previous process count too). An
//! image handed out by [`ImageStore::get`] after a pass started is kept by that pass:
//! its sandbox may not be in either list yet.
//!
//! "Recently used" is the record file's mtime, which `get` (every sandbox create)
//! touches, so the order survives restarts. Layer sizes are cached: an installed layer
//! never changes. Sizes are allocated bytes (`st_blocks`), what the disk budget is
//! about, with hard links counted once per layer.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::digest;
use super::reference::Reference;
use super::store::{lock, GcReport, ImageStore, Inner, Record};
use super::ImageError;

/// How much disk the store may use (also the snapshots' host-wide bound and their
/// free-space reserve, which take the same forms).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Budget {
    /// No limit: nothing is collected.
    #[default]
    Off,
    /// At most this many bytes.
    Bytes(u64),
    /// At most this percentage of the file system holding the store.
    Percent(f64),
}

impl Budget {
    /// Parses `0` (off), bytes with an optional unit (`500M`, `20Gi`, `1T`) or a
    /// percentage of the store's file system (`50%`).
    pub fn parse(text: &str) -> Result<Budget, String> {
        Self::parse_setting("image disk budget", text)
    }

    /// [`Budget::parse`] for the setting named `what` (in its error messages).
    pub fn parse_setting(what: &str, text: &str) -> Result<Budget, String> {
        let t = text.trim();
        let bad = || {
            format!(
                "{what} {text:?}: use 0 (off), a size like \"20Gi\" or \"500M\", or a percentage like \"50%\""
            )
        };
        if let Some(percent) = t.strip_suffix('%') {
            let p: f64 = percent.trim().parse().map_err(|_| bad())?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(format!(
                    "{what} {text:?}: a percentage must be above 0 and at most 100"
                ));
            }
            return Ok(Budget::Percent(p));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let n: f64 = number.parse().map_err(|_| bad())?;
        let multiplier: f64 = match unit.trim() {
            "" | "B" => 1.0,
            "k" | "K" | "KB" => 1e3,
            "M" | "MB" => 1e6,
            "G" | "GB" => 1e9,
            "T" | "TB" => 1e12,
            "Ki" | "KiB" => 1024.0,
            "Mi" | "MiB" => 1024.0 * 1024.0,
            "Gi" | "GiB" => 1024.0 * 1024.0 * 1024.0,
            "Ti" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(bad()),
        };
        let bytes = n * multiplier;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(if bytes < 1.0 {
            Budget::Off
        } else {
            Budget::Bytes(bytes as u64)
        })
    }

    /// The budget in bytes for a store at `root`; `None` when off (or when the file
    /// system cannot be asked its size).
    pub fn bytes(&self, root: &Path) -> Option<u64> {
        match *self {
            Budget::Off => None,
            Budget::Bytes(n) => Some(n),
            Budget::Percent(p) => {
                crate::diskspace::size(root).map(|size| (size as f64 * p / 100.0) as u64)
            }
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::Off => f.write_str("off"),
            Budget::Bytes(n) => write!(f, "{n} bytes"),
            Budget::Percent(p) => write!(f, "{p}% of the file system"),
        }
    }
}

/// What live sandboxes use, which a budget pass must keep.
#[derive(Debug, Clone, Default)]
pub struct InUse {
    /// Image names as sandboxes asked for them (normalised here).
    pub references: Vec<String>,
    /// Layer directories mounted as overlay lower dirs.
    pub layers: Vec<PathBuf>,
}

/// What one budget pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetReport {
    /// The budget in bytes (`None`: off, only the size was measured).
    pub budget: Option<u64>,
    /// Store size before the pass.
    pub bytes_before: u64,
    /// Store size after it.
    pub bytes_after: u64,
    /// What was removed.
    pub removed: GcReport,
}

/// The store's GC bookkeeping.
pub(crate) struct GcState {
    /// Allocated bytes per installed layer (`layers/<hex>`), which never changes.
    layer_sizes: Mutex<HashMap<String, u64>>,
    /// When each image name was last handed out by `get`.
    handed_out: Mutex<HashMap<String, Instant>>,
    /// Bumped whenever an image is recorded (pull or import).
    changes: watch::Sender<u64>,
}

impl GcState {
    pub(crate) fn new() -> GcState {
        GcState {
            layer_sizes: Mutex::new(HashMap::new()),
            handed_out: Mutex::new(HashMap::new()),
            changes: watch::channel(0).0,
        }
    }

    /// Notes that an image was recorded.
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Notes that `reference` was handed out to a sandbox, and marks it recently used.
    pub(crate) fn handed_out(&self, reference: &str, record_file: &Path) {
        lock(&self.handed_out).insert(reference.to_string(), Instant::now());
        // Best effort: an unwritable record only makes the LRU order less exact.
        if let Ok(file) = fs::File::options().write(true).open(record_file) {
            let _ = file.set_modified(SystemTime::now());
        }
    }
}

impl ImageStore {
    /// A receiver that changes whenever an image is pulled or imported.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.gc_state.changes.subscribe()
    }

    /// Allocated bytes of the store's layers and blobs.
    pub fn usage(&self) -> Result<u64, ImageError> {
        Ok(self.inner.sizes()?.total())
    }

    /// Brings the store under `budget`: when over it, forgets least recently used images
    /// that `in_use` (called once the pass has started) does not name, then removes the
    /// layers and blobs nothing names, until the store fits or nothing more may go.
    /// Blocking: call it from `spawn_blocking` in async code.
    pub fn enforce_budget(
        &self,
        budget: Budget,
        in_use: impl FnOnce() -> InUse,
    ) -> Result<BudgetReport, ImageError> {
        let started = Instant::now();
        let in_use = in_use();
        let inner = &self.inner;
        let budget_bytes = budget.bytes(&inner.root);
        let sizes = inner.sizes()?;
        let before = sizes.total();
        let mut report = BudgetReport {
            budget: budget_bytes,
            bytes_before: before,
            bytes_after: before,
            removed: GcReport::default(),
        };
        let Some(limit) = budget_bytes.filter(|limit| before > *limit) else {
            return Ok(report);
        };
        let evicted = inner.evict(limit, &sizes, &in_use, started)?;
        let mut removed = self.gc_keeping(&in_use.layers)?;
        removed.images_removed = evicted;
        report.bytes_after = inner.sizes()?.total();
        report.removed = removed;
        Ok(report)
    }
}

/// Sizes of everything in the store, by `layers/<hex>` and `blobs/<hex>` key.
struct Sizes(HashMap<String, u64>);

impl Sizes {
    fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

impl Inner {
    fn sizes(&self) -> Result<Sizes, ImageError> {
        let mut out = HashMap::new();
        let layers_dir = self.root.join("layers");
        let mut cache = lock(&self.gc_state.layer_sizes);
        let mut seen = HashSet::new();
        for entry in
            fs::read_dir(&layers_dir).map_err(ImageError::io("cannot list", &layers_dir))?
        {
            let entry = entry.map_err(ImageError::io("cannot list", &layers_dir))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if !is_hex_digest(&name) {
                continue;
            }
            let size = *cache
                .entry(name.clone())
                .or_insert_with(|| allocated(&entry.path(), &mut HashSet::new()));
            out.insert(format!("layers/{name}"), size);
            seen.insert(name);
        }
        cache.retain(|name, _| seen.contains(name));
        drop(cache);
        let blobs_dir = self.root.join("blobs/sha256");
        for entry in fs::read_dir(&blobs_dir).map_err(ImageError::io("cannot list", &blobs_dir))? {
            let entry = entry.map_err(ImageError::io("cannot list", &blobs_dir))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if is_hex_digest(&name) {
                let size = entry.metadata().map_or(0, |m| m.blocks() * 512);
                out.insert(format!("blobs/{name}"), size);
            }
        }
        Ok(Sizes(out))
    }

    /// Removes the records of least recently used images not in use until what would
    /// be left fits `limit`; returns their names. Layers and blobs go in the sweep after.
    fn evict(
        &self,
        limit: u64,
        sizes: &Sizes,
        in_use: &InUse,
        started: Instant,
    ) -> Result<Vec<String>, ImageError> {
        let _records = lock(&self.records);
        let records = self.read_records(true)?;
        let used_names: HashSet<String> = in_use
            .references
            .iter()
            .filter_map(|r| Reference::parse(r).ok())
            .map(|r| r.to_string())
            .collect();
        let mut fixed: HashSet<String> = lock(&self.pins).keys().cloned().collect();
        for path in &in_use.layers {
            if let Some(name) = path.file_name() {
                fixed.insert(format!("layers/{}", name.to_string_lossy()));
            }
        }
        let handed_out = lock(&self.gc_state.handed_out).clone();
        let mut candidates = Vec::new();
        let mut kept = Vec::new();
        for record in records {
            let recent = handed_out
                .get(&record.reference)
                .is_some_and(|at| *at >= started);
            if used_names.contains(&record.reference) || recent {
                kept.push(record);
            } else {
                let used = self.last_used(&record);
                candidates.push((used, record));
            }
        }
        // Oldest first; the name breaks ties so the order is deterministic.
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.reference.cmp(&b.1.reference)));
        let remaining = |kept: &[&Record]| -> Result<u64, ImageError> {
            let mut named = fixed.clone();
            for record in kept {
                named.extend(keys_of(record)?);
            }
            Ok(sizes
                .0
                .iter()
                .filter(|(key, _)| named.contains(*key))
                .map(|(_, size)| size)
                .sum())
        };
        let mut evicted = Vec::new();
        let mut left: Vec<&Record> = kept
            .iter()
            .chain(candidates.iter().map(|(_, r)| r))
            .collect();
        let mut next = 0;
        while remaining(&left)? > limit && next < candidates.len() {
            let victim = &candidates[next].1;
            left.retain(|r| r.reference != victim.reference);
            evicted.push(victim.reference.clone());
            next += 1;
        }
        for name in &evicted {
            let path = self.record_path(name);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(ImageError::io("cannot remove", &path)(err)),
            }
        }
        Ok(evicted)
    }

    /// When an image was last used: its record's mtime (written at the pull or
    /// import, touched by `get`; nanoseconds, so two pulls in one second are ordered),
    /// else its creation.
    fn last_used(&self, record: &Record) -> SystemTime {
        let created = SystemTime::UNIX_EPOCH + Duration::from_secs(record.created);
        fs::metadata(self.record_path(&record.reference))
            .and_then(|m| m.modified())
            .map_or(created, |mtime| mtime.max(created))
    }
}

/// The `layers/<hex>` and `blobs/<hex>` keys an image record names.
pub(crate) fn keys_of(record: &Record) -> Result<Vec<String>, ImageError> {
    let mut keys = Vec::new();
    for diff_id in &record.diff_ids {
        keys.push(format!("layers/{}", digest::hex_of(diff_id)?));
    }
    for blob in [
        Some(&record.digest),
        Some(&record.config_digest),
        record.index_digest.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        keys.push(format!("blobs/{}", digest::hex_of(blob)?));
    }
    Ok(keys)
}

fn is_hex_digest(name: &str) -> bool {
    digest::hex_of(&format!("{}{name}", digest::SHA256_PREFIX)).is_ok()
}

/// Allocated bytes under `path` (not following links), hard links counted once.
pub(crate) fn allocated(path: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
        return 0;
    }
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let Ok(entries) = fs::read_dir(path) else {
        return own;
    };
    own + entries
        .flatten()
        .map(|entry| allocated(&entry.path(), seen))
        .sum::<u64>()
}

/// The layer directories under `root/layers` that overlay mounts on this host use as
/// lower dirs, from `/proc/self/mountinfo`.
pub fn mounted_layers(root: &Path) -> Vec<PathBuf> {
    match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => layers_in_mountinfo(&text, &root.join("layers")),
        Err(_) => Vec::new(),
    }
}

fn layers_in_mountinfo(text: &str, layers_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in text.lines() {
        // `... - overlay overlay rw,lowerdir=a:b,upperdir=...`
        let Some((_, tail)) = line.split_once(" - ") else {
            continue;
        };
        let mut fields = tail.split(' ');
        if fields.next() != Some("overlay") {
            continue;
        }
        let options = fields.nth(1).unwrap_or("");
        for option in options.split(',') {
            let Some(lower) = option.strip_prefix("lowerdir=") else {
                continue;
            };
            for dir in lower.split(':') {
                // mountinfo escapes spaces and the like as octal (`\040`).
                let dir = PathBuf::from(unescape_octal(dir));
                if dir.parent() == Some(layers_dir) {
                    out.push(dir);
                }
            }
        }
    }
    out
}

fn unescape_octal(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How the serve loop runs passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcPolicy {
    /// The budget.
    pub budget: Budget,
    /// Time between two passes when nothing is pulled or imported.
    pub interval: Duration,
}

/// Runs a pass after every pull or import and every `policy.interval`, forever; calls
/// `report` after each pass that succeeded (to log and count), and logs failures.
pub async fn run<U, R>(store: ImageStore, policy: GcPolicy, in_use: U, report: R)
where
    U: Fn() -> InUse + Send + Sync + Clone + 'static,
    R: Fn(&BudgetReport) + Send + Sync + 'static,
{
    let mut changes = store.changes();
    let mut ticker = tokio::time::interval(policy.interval.max(Duration::from_secs(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let (store, in_use) = (store.clone(), in_use.clone());
        let pass =
            tokio::task::spawn_blocking(move || store.enforce_budget(policy.budget, in_use)).await;
        match pass {
            Ok(Ok(outcome)) => report(&outcome),
            Ok(Err(err)) => tracing::warn!(error = %err, "image gc failed"),
            Err(err) => tracing::warn!(error = %err, "image gc failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse() {
        assert_eq!(Budget::parse("0"), Ok(Budget::Off));
        assert_eq!(Budget::parse("20Gi"), Ok(Budget::Bytes(20 << 30)));
        assert_eq!(Budget::parse("500M"), Ok(Budget::Bytes(500_000_000)));
        assert_eq!(Budget::parse("4096"), Ok(Budget::Bytes(4096)));
        assert_eq!(Budget::parse(" 50% "), Ok(Budget::Percent(50.0)));
        for bad in ["", "lots", "20 gigs", "0%", "101%", "-5", "1e9"] {
            assert!(Budget::parse(bad).is_err(), "{bad}");
        }
        assert!(Budget::Percent(50.0)
            .bytes(Path::new("/"))
            .is_some_and(|b| b > 0));
        assert_eq!(Budget::Off.bytes(Path::new("/")), None);
    }

    #[test]
    fn mountinfo_lower_dirs_under_the_store() {
        let text = "\
36 35 0:40 / /sb/1/rootfs rw,relatime - overlay overlay rw,lowerdir=/s\\040x/layers/bb:/s\\040x/layers/aa,upperdir=/sb/1/upper,workdir=/sb/1/work
37 35 0:41 / /other rw - overlay overlay rw,lowerdir=/elsewhere/cc,upperdir=/u,workdir=/w
38 35 8:1 / / rw - ext4 /dev/sda1 rw,lowerdir=/s\\040x/layers/dd";
        assert_eq!(
            layers_in_mountinfo(text, Path::new("/s x/layers")),
            [
                PathBuf::from("/s x/layers/bb"),
                PathBuf::from("/s x/layers/aa")
            ]
        );
    }
}
