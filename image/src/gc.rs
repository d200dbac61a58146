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

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::reference::Reference;
use crate::store::{GcReport, ImageStore, Sizes, Stored};
use crate::ImageError;

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

impl ImageStore {
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
        let budget_bytes = budget.bytes(self.root());
        let sizes = self.sizes()?;
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
        let evicted = self.forget_chosen(|stored, pinned| {
            choose_evictions(limit, &sizes, &in_use, started, stored, pinned)
        })?;
        let mut removed = self.gc_keeping(&in_use.layers)?;
        removed.images_removed = evicted;
        report.bytes_after = self.sizes()?.total();
        report.removed = removed;
        Ok(report)
    }
}

/// The least recently used images to forget, oldest first, so that what the others,
/// the pinned keys and the layers in use take fits `limit` (or none is left to forget).
/// Kept whatever their age: images live sandboxes name, and those handed out since the
/// pass `started` (their sandbox may not be in `in_use` yet).
fn choose_evictions(
    limit: u64,
    sizes: &Sizes,
    in_use: &InUse,
    started: Instant,
    stored: &[Stored],
    pinned: &HashSet<String>,
) -> Vec<String> {
    let used_names: HashSet<String> = in_use
        .references
        .iter()
        .filter_map(|r| Reference::parse(r).ok())
        .map(|r| r.to_string())
        .collect();
    let mut fixed: HashSet<String> = pinned.clone();
    for path in &in_use.layers {
        if let Some(name) = path.file_name() {
            fixed.insert(format!("layers/{}", name.to_string_lossy()));
        }
    }
    let mut candidates = Vec::new();
    let mut kept = Vec::new();
    for image in stored {
        let recent = image.handed_out.is_some_and(|at| at >= started);
        if used_names.contains(&image.reference) || recent {
            kept.push(image);
        } else {
            candidates.push(image);
        }
    }
    // Oldest first; the name breaks ties so the order is deterministic.
    candidates.sort_by(|a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then(a.reference.cmp(&b.reference))
    });
    let remaining = |left: &[&Stored]| -> u64 {
        let mut named = fixed.clone();
        for image in left {
            named.extend(image.keys.iter().cloned());
        }
        sizes
            .0
            .iter()
            .filter(|(key, _)| named.contains(*key))
            .map(|(_, size)| size)
            .sum()
    };
    let mut evicted = Vec::new();
    let mut left: Vec<&Stored> = kept.iter().chain(candidates.iter()).copied().collect();
    let mut next = 0;
    while remaining(&left) > limit && next < candidates.len() {
        let victim = candidates[next];
        left.retain(|image| image.reference != victim.reference);
        evicted.push(victim.reference.clone());
        next += 1;
    }
    evicted
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
    fn evictions_go_oldest_first_until_the_rest_fits_and_spare_what_is_in_use() {
        let epoch = std::time::SystemTime::UNIX_EPOCH;
        let started = Instant::now();
        let image = |name: &str, age: u64, handed_out: Option<Instant>| Stored {
            reference: format!("docker.io/library/{name}:latest"),
            keys: vec![format!("layers/{name}"), format!("blobs/{name}")],
            last_used: epoch + Duration::from_secs(1000 - age),
            handed_out,
        };
        let sizes = Sizes(
            ["a", "b", "c", "d"]
                .iter()
                .flat_map(|n| [(format!("layers/{n}"), 9), (format!("blobs/{n}"), 1)])
                .collect(),
        );
        // Oldest first: a (300 s), b (200 s), c (100 s); d was handed out during the pass.
        let stored = [
            image("c", 100, None),
            image("a", 300, None),
            image("b", 200, Some(started - Duration::from_secs(1))),
            image("d", 400, Some(started + Duration::from_millis(1))),
        ];
        let none = HashSet::new();
        let name = |n: &str| format!("docker.io/library/{n}:latest");
        // 40 bytes; d is kept whatever: a then b go to fit 25.
        let chosen = choose_evictions(25, &sizes, &InUse::default(), started, &stored, &none);
        assert_eq!(chosen, [name("a"), name("b")]);
        // A sandbox uses a (named as it asked for it): b and c go instead.
        let in_use = InUse {
            references: vec!["a".into()],
            layers: Vec::new(),
        };
        let chosen = choose_evictions(25, &sizes, &in_use, started, &stored, &none);
        assert_eq!(chosen, [name("b"), name("c")]);
        // What is pinned or mounted counts against the limit but is never evicted.
        let pinned: HashSet<String> = ["layers/x".to_string()].into();
        let mut sizes_pinned = sizes.clone();
        sizes_pinned.0.insert("layers/x".into(), 20);
        let chosen = choose_evictions(
            25,
            &sizes_pinned,
            &InUse::default(),
            started,
            &stored,
            &pinned,
        );
        assert_eq!(chosen, [name("a"), name("b"), name("c")]);
        // Under the limit: nothing.
        assert!(
            choose_evictions(40, &sizes, &InUse::default(), started, &stored, &none).is_empty()
        );
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
