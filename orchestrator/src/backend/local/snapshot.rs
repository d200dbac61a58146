//! Pause, resume, snapshots and forks on the local backend.
//!
//! ```text
//! <root>/layers/<sha256 hex>/     a captured layer (see `layer`), read-only to forks
//! <root>/layers/.tmp-*/           a capture in progress
//! <root>/snapshots/<id>.json      a snapshot: its layer chain, image, environment, sessions
//! <root>/locks/.snapshots.lock    flock: snapshot files and layers change under it
//! ```
//!
//! - Pause is `runc pause` (the freezer cgroup): processes keep their memory and get no
//!   CPU. Delete thaws after SIGKILL, so a paused sandbox is deleted as fast as another.
//! - A snapshot freezes the sandbox, copies its overlay upper directory into a
//!   content-addressed layer, and thaws it: the sandbox goes on unchanged, processes
//!   included, and the copy is consistent (nothing in the sandbox runs meanwhile).
//!   A sandbox that is itself a fork adds its layer above its snapshot's: the chain is
//!   the parent's layers plus its own.
//! - A fork is a create whose overlay lower layers are the image's plus the snapshot's,
//!   over an empty upper: its cost and disk do not depend on the snapshot's size.
//! - A snapshot some sandbox was forked from cannot be deleted (`Conflict`): a fork
//!   names its snapshot in its state file before it checks that the snapshot still
//!   exists, and the delete looks for forks and removes the snapshot under one lock,
//!   so one of them always sees the other. Deleting removes every layer no remaining
//!   snapshot names (layers are shared along chains and between equal captures).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::local::error::io_err;
use crate::backend::local::error::LocalError;
use crate::backend::local::inner::{Entry, FileKey, Inner, Paths};
use crate::backend::local::state::{self, Phase, SandboxState};
use crate::backend::local::{layer, lock};
use crate::backend::{BackendSnapshot, SnapshotSpec};
use crate::image::Image;

/// Version of the snapshot file format.
const SNAPSHOT_VERSION: u32 = 1;

/// The contents of `snapshots/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotFile {
    version: u32,
    /// The image forks run, layers and config included (the image store keeps them).
    run_image: Image,
    #[serde(flatten)]
    snapshot: BackendSnapshot,
}

fn sha(hex: &str) -> String {
    format!("sha256:{hex}")
}

fn unsha(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

impl Inner {
    pub(super) fn layers_dir(&self) -> PathBuf {
        self.root.join("layers")
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    fn snapshot_path(&self, id: &str) -> Option<PathBuf> {
        valid_snapshot_id(id).then(|| self.snapshots_dir().join(format!("{id}.json")))
    }

    async fn snapshots_lock(&self) -> Result<lock::SandboxLock, LocalError> {
        lock::SandboxLock::take(
            &self.locks_dir.join(".snapshots.lock"),
            "snapshots",
            self.config.lock_wait,
        )
        .await
    }

    /// The running sandbox `id`'s state: the table's, or on a shared root its file.
    fn running_state(&self, id: &str) -> Result<SandboxState, LocalError> {
        self.sync_shared();
        match self.lock_table().get(id) {
            Some(Entry::Ready(s)) => Ok((**s).clone()),
            _ => Err(LocalError::NotFound(id.to_string())),
        }
    }

    /// Freezes sandbox `id`. Under the sandbox's lock, as captures are: a pause during a
    /// capture would otherwise find it frozen, do nothing, and be undone by the
    /// capture's thaw.
    pub(super) async fn pause(&self, id: &str) -> Result<(), LocalError> {
        let s = self.running_state(id)?;
        let _lock = self.lock_sandbox(id).await?;
        if s.cgroup_dirs.iter().any(|d| super::cgroup::frozen(d)) {
            return Ok(());
        }
        Ok(self.runc.pause(id).await?)
    }

    /// Thaws sandbox `id`; one not paused is fine.
    pub(super) async fn resume(&self, id: &str) -> Result<(), LocalError> {
        let s = self.running_state(id)?;
        let _lock = self.lock_sandbox(id).await?;
        if !s.cgroup_dirs.iter().any(|d| super::cgroup::frozen(d)) {
            return Ok(());
        }
        Ok(self.runc.resume(id).await?)
    }

    /// The layers (hex, bottom first) a fork of `sid` mounts; `NotFound` when the
    /// snapshot is gone, `Invalid` when its files are damaged.
    pub(super) async fn fork_layers(&self, sid: &str) -> Result<Vec<String>, LocalError> {
        let _lock = self.snapshots_lock().await?;
        let file = self.load_snapshot(sid)?;
        let hexes: Vec<String> = file
            .snapshot
            .layers
            .iter()
            .map(|d| unsha(d).to_string())
            .collect();
        for hex in &hexes {
            if !self.layers_dir().join(hex).is_dir() {
                return Err(LocalError::Invalid(format!(
                    "snapshot {sid} is damaged: its layer {hex} is missing"
                )));
            }
        }
        Ok(hexes)
    }

    fn load_snapshot(&self, sid: &str) -> Result<SnapshotFile, LocalError> {
        let not_found = || LocalError::SnapshotNotFound(sid.to_string());
        let path = self.snapshot_path(sid).ok_or_else(not_found)?;
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
            Err(e) => return Err(io_err("reading", &path)(e)),
        };
        let file: SnapshotFile = serde_json::from_slice(&bytes)
            .map_err(|e| LocalError::Invalid(format!("snapshot {sid} is unreadable: {e}")))?;
        if file.version != SNAPSHOT_VERSION {
            return Err(LocalError::Invalid(format!(
                "snapshot {sid} has format {} (expected {SNAPSHOT_VERSION})",
                file.version
            )));
        }
        Ok(file)
    }

    /// The image a fork of `sid` runs.
    pub(super) fn snapshot_image(&self, sid: &str) -> Result<Image, LocalError> {
        Ok(self.load_snapshot(sid)?.run_image)
    }

    /// Every sandbox state on the root (any phase): who uses which snapshot.
    fn all_states(&self) -> Vec<SandboxState> {
        let Ok(entries) = fs::read_dir(&self.sandboxes_dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| state::load(&e.path().join("state.json")).ok())
            .collect()
    }

    /// Sandboxes forked from `sid` that exist.
    fn forks_of(&self, sid: &str, states: &[SandboxState]) -> Vec<String> {
        let mut forks: Vec<String> = states
            .iter()
            .filter(|s| s.snapshot.as_deref() == Some(sid) && s.phase != Phase::Deleting)
            .map(|s| s.id.clone())
            .collect();
        forks.sort();
        forks
    }

    /// Every snapshot, oldest first, with its forks. A file unchanged since it was last
    /// parsed (same inode, size and mtime) is taken from the cache.
    pub(super) fn snapshots(&self) -> Result<Vec<BackendSnapshot>, LocalError> {
        let dir = self.snapshots_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("listing", &dir)(e)),
        };
        let states = self.all_states();
        let mut seen = HashMap::new();
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(sid) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let Ok(meta) = e.metadata() else { continue };
            let key = FileKey::of(&meta);
            let cached = self
                .snapshot_cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(sid)
                .filter(|(k, _)| *k == key)
                .map(|(_, s)| s.clone());
            let snapshot = match cached {
                Some(s) => s,
                // A damaged file is skipped here and named when asked for by id.
                None => match self.load_snapshot(sid) {
                    Ok(f) => f.snapshot,
                    Err(_) => continue,
                },
            };
            seen.insert(sid.to_string(), (key, snapshot));
        }
        let mut out: Vec<BackendSnapshot> = seen
            .iter()
            .map(|(sid, (_, s))| {
                let mut s = s.clone();
                s.forks = self.forks_of(sid, &states);
                s
            })
            .collect();
        // What is not on disk any more leaves the cache with this listing.
        *self
            .snapshot_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = seen;
        out.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Captures sandbox `spec.sandbox_id`.
    pub(super) async fn snapshot(
        self: &Arc<Self>,
        spec: SnapshotSpec,
    ) -> Result<BackendSnapshot, LocalError> {
        let id = spec.sandbox_id.clone();
        let st = self.running_state(&id)?;
        // No delete of the sandbox while its upper directory is being read.
        let _lock = self.lock_sandbox(&id).await?;
        let paths = self.paths(&id);
        if !paths.dir.exists() {
            return Err(LocalError::NotFound(id));
        }
        let (captured, tmp, frozen_ms) = self.capture(&id, &st, &paths).await?;
        let tmp_layer = tmp.as_ref().map(|t| sha(&t.hex));
        let tmp_bytes = tmp.as_ref().map_or(0, |t| t.bytes);
        let mut layers: Vec<String> = st.snapshot_layers.iter().map(|h| sha(h)).collect();
        layers.push(sha(&captured.hex));
        let image = Image {
            reference: st.image.clone(),
            digest: st.image_digest.clone(),
            layers: st.image_layers.clone(),
            config: st.image_config.clone(),
        };
        // The digest names everything a fork gets, nothing about when or from where.
        let identity = serde_json::json!({
            "layers": layers,
            "image": image.digest,
            "env": st.env,
            "sessions": spec.sessions,
            "labels": spec.labels,
            "config": spec.config,
            "tmp": tmp_layer,
        });
        let digest = layer::hex(&Sha256::digest(identity.to_string().as_bytes()));
        let sid = format!("snap-{}", &digest[..20]);
        let _snapshots = self.snapshots_lock().await?;
        layer::install(&captured, &self.layers_dir())
            .map_err(|e| LocalError::Invalid(e.to_string()))?;
        if let Some(t) = &tmp {
            layer::install(t, &self.layers_dir())
                .map_err(|e| LocalError::Invalid(e.to_string()))?;
        }
        if let Ok(existing) = self.load_snapshot(&sid) {
            // The same content, environment and labels: the same snapshot.
            return Ok(existing.snapshot);
        }
        let parent_total: u64 = st
            .snapshot_layers
            .iter()
            .map(|h| layer::content_bytes(&self.layers_dir().join(h)))
            .sum();
        let created_ms = state::now_unix_ms();
        let snapshot = BackendSnapshot {
            id: sid.clone(),
            digest: sha(&digest),
            sandbox_id: id,
            parent: st.snapshot.clone(),
            image: st.image.clone(),
            created_ms,
            size_bytes: captured.bytes + tmp_bytes,
            total_bytes: parent_total + captured.bytes + tmp_bytes,
            layers,
            labels: spec.labels,
            config: spec.config,
            sessions: spec.sessions,
            env: st.env.clone(),
            frozen_ms,
            forks: Vec::new(),
            image_layers: st.image_layers.clone(),
            tmp_layer,
            tmp_bytes,
        };
        let file = SnapshotFile {
            version: SNAPSHOT_VERSION,
            run_image: image,
            snapshot: snapshot.clone(),
        };
        self.write_snapshot(&sid, &file)?;
        Ok(snapshot)
    }

    /// The snapshot's capture step: pauses the sandbox (unless it was frozen), copies
    /// its upper directory and its /tmp into new layers, resumes it; answers the
    /// layers and how long the sandbox was frozen (ms).
    async fn capture(
        &self,
        id: &str,
        st: &SandboxState,
        paths: &Paths,
    ) -> Result<(layer::Captured, Option<layer::Captured>, f64), LocalError> {
        let was_frozen = st.cgroup_dirs.iter().any(|d| super::cgroup::frozen(d));
        let frozen_at = Instant::now();
        if !was_frozen {
            self.runc.pause(id).await?;
        }
        let tmp_name = format!("{}-{}", std::process::id(), crate::random::hex(6)?);
        let (upper, layers_dir) = (paths.upper.clone(), self.layers_dir());
        // The runtime's files are mounted over these paths: the upper holds only their
        // mount points, which are not the sandbox's content (a fork makes its own).
        let skip = st.runtime_files.clone();
        // The tmpfs /tmp as the sandbox sees it (its mount namespace, through its
        // init's root), read while nothing in the sandbox runs.
        let tmpfs = st
            .init
            .map(|p| PathBuf::from(format!("/proc/{}/root/tmp", p.pid)));
        let copied = tokio::task::spawn_blocking(move || {
            let rootfs = layer::copy(&upper, &layers_dir, &tmp_name, &skip)?;
            let tmp = match tmpfs.filter(|t| has_entries(t)) {
                Some(t) => match layer::copy(&t, &layers_dir, &format!("{tmp_name}-tmp"), &[]) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        let _ = layer::remove(&rootfs.dir);
                        return Err(e);
                    }
                },
                None => None,
            };
            Ok((rootfs, tmp))
        })
        .await
        .map_err(|e| LocalError::Task(e.to_string()));
        let thawed = if was_frozen {
            Ok(())
        } else {
            self.runc.resume(id).await
        };
        let frozen_ms = frozen_at.elapsed().as_secs_f64() * 1000.0;
        let (captured, tmp) = copied?.map_err(|e| LocalError::Invalid(e.to_string()))?;
        if let Err(e) = thawed {
            let _ = layer::remove(&captured.dir);
            if let Some(t) = &tmp {
                let _ = layer::remove(&t.dir);
            }
            return Err(e.into());
        }
        Ok((captured, tmp, frozen_ms))
    }

    /// The snapshot's last step: its file, written atomically (mode 0600).
    fn write_snapshot(&self, sid: &str, file: &SnapshotFile) -> Result<(), LocalError> {
        let dir = self.snapshots_dir();
        fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        let bytes = serde_json::to_vec_pretty(file).map_err(|e| LocalError::Task(e.to_string()))?;
        let path = dir.join(format!("{sid}.json"));
        crate::atomic_file::write_private(&path, &bytes).map_err(io_err("writing", &path))?;
        Ok(())
    }

    /// Deletes snapshot `sid` unless a sandbox was forked from it; removes the layers
    /// no other snapshot names. Answers the bytes freed.
    pub(super) async fn delete_snapshot(&self, sid: &str) -> Result<u64, LocalError> {
        let _lock = self.snapshots_lock().await?;
        self.load_snapshot(sid)?;
        let forks = self.forks_of(sid, &self.all_states());
        if !forks.is_empty() {
            return Err(LocalError::SnapshotInUse {
                id: sid.to_string(),
                forks,
            });
        }
        if let Some(path) = self.snapshot_path(sid) {
            fs::remove_file(&path).map_err(io_err("removing", &path))?;
        }
        self.collect_layers()
    }

    /// Removes every layer no snapshot and no sandbox names; answers the bytes freed.
    /// Called under the snapshots lock.
    fn collect_layers(&self) -> Result<u64, LocalError> {
        let mut used: BTreeSet<String> = BTreeSet::new();
        if let Ok(entries) = fs::read_dir(self.snapshots_dir()) {
            for e in entries.flatten() {
                if let Ok(bytes) = fs::read(e.path()) {
                    if let Ok(f) = serde_json::from_slice::<SnapshotFile>(&bytes) {
                        used.extend(f.snapshot.layers.iter().map(|d| unsha(d).to_string()));
                        used.extend(f.snapshot.tmp_layer.iter().map(|d| unsha(d).to_string()));
                    } else {
                        // A file we cannot read might name anything: keep every layer.
                        return Ok(0);
                    }
                }
            }
        }
        for s in self.all_states() {
            used.extend(s.snapshot_layers);
        }
        let mut freed = 0;
        let dir = self.layers_dir();
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(0);
        };
        for e in entries.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // Captures in progress hold no lock on their temporary copy; they remove it
            // themselves on failure.
            if name.starts_with(layer::TMP_PREFIX) || used.contains(&name) {
                continue;
            }
            freed += layer::remove(&e.path()).map_err(|e| LocalError::Invalid(e.to_string()))?;
        }
        Ok(freed)
    }
}

impl Inner {
    /// Copies of captures whose process is gone (killed mid-capture): named
    /// `.tmp-<pid>-<random>` so that a live capture of another process is never taken
    /// for one.
    pub(super) fn stale_captures(&self) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(self.layers_dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let Some(rest) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(layer::TMP_PREFIX))
                else {
                    return false;
                };
                let pid: i32 = rest
                    .split('-')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists()
            })
            .map(|e| e.path())
            .collect()
    }
}

/// Whether directory `dir` has anything in it.
fn has_entries(dir: &std::path::Path) -> bool {
    // A real directory only: an image may ship `/tmp` as a symlink, which the sandbox
    // could point at anything, resolved here against the host's root.
    dir.symlink_metadata().is_ok_and(|m| m.is_dir())
        && fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

impl Inner {
    /// Fills a fork's fresh `/tmp` with its snapshot's, before anyone has its token.
    pub(super) async fn fill_tmp(&self, sid: &str, init_pid: i32) -> Result<(), LocalError> {
        let Some(tmp) = self.load_snapshot(sid)?.snapshot.tmp_layer else {
            return Ok(());
        };
        let src = self.layers_dir().join(unsha(&tmp));
        let dst = PathBuf::from(format!("/proc/{init_pid}/root/tmp"));
        if !dst.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            return Err(LocalError::Invalid(format!(
                "the fork of snapshot {sid} has no /tmp directory to restore into"
            )));
        }
        tokio::task::spawn_blocking(move || layer::fill(&src, &dst))
            .await
            .map_err(|e| LocalError::Task(e.to_string()))?
            .map(drop)
            .map_err(|e| LocalError::Invalid(format!("restoring /tmp of snapshot {sid}: {e}")))
    }
}

/// `snap-` and 20 lowercase hex digits.
pub fn valid_snapshot_id(id: &str) -> bool {
    id.strip_prefix("snap-").is_some_and(|h| {
        h.len() == 20
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
