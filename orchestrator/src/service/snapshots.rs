//! Stateful sandboxes: pause and resume, snapshots, forks.
//!
//! - Pause freezes the sandbox in the backend, then marks its record `paused`: from then
//!   on calls that need its agent answer 409 ([`Error::Paused`]) instead of hanging on
//!   a frozen agent; heartbeats and the TTL go on as for any sandbox. Jobs accepted
//!   before the pause wait for the resume. Resume thaws it and clears the mark.
//! - A snapshot asks the agent for each shell session's state (directory, exported
//!   variables, functions), then has the backend capture the filesystem with the
//!   sandbox frozen. Snapshots belong to the key that made them (`orchard.tenant`
//!   label), count against its `snapshot_bytes` quota, and carry what forks need to be
//!   created like their sandbox (image, CPU, memory, network, environment).
//! - Snapshot data lives on the data directory's file system, outside every sandbox's
//!   disk, so it is bounded on the host too: all keys' snapshots together by
//!   `snapshot_bytes_total`, and no snapshot is taken or kept while the file system has
//!   less than `snapshot_min_free` free. Every bound is checked before the capture and
//!   again once the snapshot exists, one check at a time (per key, then for the host);
//!   a snapshot over a bound is deleted again and refused with 429. Deleting snapshots
//!   frees their bytes at once: the totals are counted from the snapshots that exist.
//! - A fork is a create from the snapshot: same settings, the snapshot's filesystem,
//!   and once ready its sessions restored through the agent.
//!
//! Running processes are not captured (no CRIU here); `processes: true` answers 501.

use std::collections::BTreeMap;

use orchard_protocol::session::SessionState;
use orchard_protocol::snapshot::{ForkRequest, SnapshotCreate};

use crate::backend::{BackendError, BackendSandbox, BackendSnapshot, SnapshotSpec};
use crate::state::SandboxRecord;

use super::auth::Tenant;
use super::checks::{validate_env_and_labels, META};
use super::config::CreateRequest;
use super::error::{BadLabel, Error, QuotaExceeded, SnapshotStorage};
use super::handle::Service;

/// Most forks one call may ask for.
pub const MAX_FORKS: u32 = 64;

/// Why process checkpoints are refused.
const NO_PROCESSES: &str = "process checkpoints are not available on this server: CRIU does not \
     work on its kernel. Snapshots capture the filesystem and the shell sessions; forks start \
     with no running process but their sessions";

impl Service {
    /// Freezes a ready sandbox; pausing a paused one is fine.
    pub async fn pause(&self, tenant: &Tenant, id: &str) -> Result<SandboxRecord, Error> {
        let rec = self.get(tenant, id).await?;
        if rec.paused {
            return Ok(rec);
        }
        self.agent_of(&rec)?;
        self.backend().pause(id).await.map_err(Error::Backend)?;
        self.update(Some(tenant), id, Some(&rec.uid), |r| r.paused = true)
            .await
    }

    /// Thaws a paused sandbox; resuming a running one is fine.
    pub async fn resume(&self, tenant: &Tenant, id: &str) -> Result<SandboxRecord, Error> {
        let rec = self.get(tenant, id).await?;
        self.agent_of(&rec)?;
        self.backend().resume(id).await.map_err(Error::Backend)?;
        self.update(Some(tenant), id, Some(&rec.uid), |r| r.paused = false)
            .await
    }

    /// The caller's snapshots, oldest first.
    pub async fn snapshots(&self, tenant: &Tenant) -> Result<Vec<BackendSnapshot>, Error> {
        Ok(self
            .all_snapshots()
            .await?
            .into_iter()
            .filter(|s| owned_by(s, tenant))
            .collect())
    }

    /// Every key's snapshots (for the host-wide bound only: never answered).
    async fn all_snapshots(&self) -> Result<Vec<BackendSnapshot>, Error> {
        self.backend().snapshots().await.map_err(Error::Backend)
    }

    /// The bounds a new snapshot is held to, in bytes, now (a percentage follows the
    /// data directory's file system).
    fn snapshot_bounds(&self) -> Bounds {
        let quotas = &self.inner.config.quotas;
        let dir = &self.inner.config.data_dir;
        Bounds {
            per_key: quotas.snapshot_bytes,
            total: quotas.snapshot_bytes_total.bytes(dir),
            min_free: quotas.snapshot_min_free.bytes(dir),
        }
    }

    /// The refusal when the data directory's file system has less than `reserve` free.
    /// A file system that cannot be asked refuses nothing: the reserve guards against a
    /// full disk, and a failed `statvfs` is no evidence of one.
    fn low_space(&self, reserve: u64) -> Option<Error> {
        let free = crate::diskspace::free(&self.inner.config.data_dir)?;
        (free < reserve).then(|| SnapshotStorage::LowSpace { free, reserve }.into())
    }

    /// [`Service::low_space`] as a result.
    fn check_free_space(&self, reserve: u64) -> Result<(), Error> {
        self.low_space(reserve).map_or(Ok(()), Err)
    }

    /// One of the caller's snapshots.
    pub async fn snapshot_of(&self, tenant: &Tenant, sid: &str) -> Result<BackendSnapshot, Error> {
        self.snapshots(tenant)
            .await?
            .into_iter()
            .find(|s| s.id == sid)
            .ok_or_else(|| Error::NoSnapshot(sid.to_string()))
    }

    /// Deletes one of the caller's snapshots (409 while forks of it exist); answers the
    /// bytes freed.
    pub async fn delete_snapshot(&self, tenant: &Tenant, sid: &str) -> Result<u64, Error> {
        self.snapshot_of(tenant, sid).await?;
        self.backend()
            .delete_snapshot(sid)
            .await
            .map_err(|e| match e {
                BackendError::NotFound(_) => Error::NoSnapshot(sid.to_string()),
                e => Error::Backend(e),
            })
    }

    /// Takes a snapshot of a ready, running sandbox.
    pub async fn snapshot(
        &self,
        tenant: &Tenant,
        id: &str,
        req: SnapshotCreate,
    ) -> Result<BackendSnapshot, Error> {
        if req.processes {
            return Err(Error::Backend(BackendError::Unsupported(
                NO_PROCESSES.into(),
            )));
        }
        validate_env_and_labels(&BTreeMap::new(), &req.labels)?;
        reject_reserved(&req.labels)?;
        let rec = self.get(tenant, id).await?;
        let live = self.live_of(&rec)?;
        let bounds = self.snapshot_bounds();
        if let Some(reserve) = bounds.min_free {
            self.check_free_space(reserve)?;
        }
        let all = if bounds.counts() {
            self.all_snapshots().await?
        } else {
            Vec::new()
        };
        let held: Vec<&BackendSnapshot> = all.iter().filter(|s| owned_by(s, tenant)).collect();
        let used: u64 = held.iter().map(|s| s.size_bytes).sum();
        let limit = bounds.per_key;
        if limit > 0 && used >= limit {
            return Err(QuotaExceeded::SnapshotBytes { used, limit }.into());
        }
        if let Some(limit) = bounds.total {
            let used: u64 = all.iter().map(|s| s.size_bytes).sum();
            if used >= limit {
                return Err(SnapshotStorage::Full { used, limit }.into());
            }
        }
        let sessions = self.session_states(&live.agent).await?;
        let mut labels = req.labels;
        labels.insert(format!("{META}tenant"), tenant.0.clone());
        let spec = SnapshotSpec {
            sandbox_id: id.to_string(),
            labels,
            config: fork_config(&rec),
            sessions,
        };
        let snap = self
            .backend()
            .snapshot(spec)
            .await
            .map_err(Error::Backend)?;
        // The same state again is a snapshot the key holds already: nothing new.
        let new = !held.iter().any(|s| s.id == snap.id);
        if bounds.counts() && new {
            // Counted again now that it exists, with every snapshot that finished
            // meanwhile (issue 30: parallel snapshots each checked the total from before
            // any of them and together kept 360 MiB under 100 MiB). One check at a time
            // per key, and one at a time on the host for the host's bounds, so of two
            // that together pass a bound one stays; across replicas both may go, never
            // both stay.
            let _check = self.inner.snapshot_checks.lock(&tenant.0).await;
            let _host = if bounds.total.is_some() || bounds.min_free.is_some() {
                Some(self.inner.snapshot_host_check.lock().await)
            } else {
                None
            };
            let now = self.all_snapshots().await?;
            let refused = over_bounds(&now, tenant, &bounds)
                .or_else(|| bounds.min_free.and_then(|r| self.low_space(r)));
            if let Some(e) = refused {
                // Taken, but over a bound: it goes again.
                let _ = self.backend().delete_snapshot(&snap.id).await;
                return Err(e);
            }
        }
        tracing::info!(sandbox_id = %id, snapshot_id = %snap.id, bytes = %snap.size_bytes, frozen_ms = %snap.frozen_ms, "snapshot taken");
        Ok(snap)
    }

    /// The state of every live shell session of a sandbox, asked of its agent.
    async fn session_states(
        &self,
        agent: &orchard_client::AgentClient,
    ) -> Result<Vec<SessionState>, Error> {
        let list = agent.list_sessions().await?;
        let mut out = Vec::new();
        for s in list.sessions.into_iter().filter(|s| s.alive) {
            match agent.session_state(&s.id).await {
                Ok(state) => out.push(state),
                // Ended between the list and the capture: nothing to bring back.
                Err(orchard_client::ClientError::Api { status, .. })
                    if status.as_u16() == 404 || status.as_u16() == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Brings back a fork's sessions once its agent answers.
    pub(super) async fn restore_sessions(
        &self,
        sb: &BackendSandbox,
        sessions: &[SessionState],
    ) -> Result<(), String> {
        if sessions.is_empty() {
            return Ok(());
        }
        let agent = orchard_client::AgentClient::with_pool(
            self.inner.runtime.pool().clone(),
            sb.agent.client(),
            sb.token.clone(),
        );
        for state in sessions {
            let mut state = state.clone();
            // A directory that is gone (removed under the shell) cannot be entered
            // again: the session comes back in `/` rather than failing the fork.
            let is_dir = matches!(agent.stat(&state.cwd).await,
                Ok(s) if s.kind == orchard_protocol::files::FileKind::Directory);
            if !is_dir {
                tracing::warn!(session = %state.id, cwd = %state.cwd, "a session's directory is gone; restored in /");
                state.cwd = "/".into();
            }
            let req = orchard_protocol::session::SessionCreate {
                restore: Some(state.clone()),
                ..Default::default()
            };
            agent
                .create_session(&req)
                .await
                .map_err(|e| format!("restoring session {}: {e}", state.id))?;
        }
        Ok(())
    }

    /// Starts `req.count` sandboxes from one of the caller's snapshots; answers their
    /// records (pending; the caller waits for them).
    pub async fn fork(
        &self,
        tenant: &Tenant,
        sid: &str,
        req: &ForkRequest,
    ) -> Result<Vec<SandboxRecord>, Error> {
        if req.count == 0 || req.count > MAX_FORKS {
            return Err(Error::BadRequest(format!(
                "count {}: fork 1 to {MAX_FORKS} sandboxes per call",
                req.count
            )));
        }
        validate_env_and_labels(&BTreeMap::new(), &req.labels)?;
        reject_reserved(&req.labels)?;
        let snap = self.snapshot_of(tenant, sid).await?;
        let config = |k: &str| snap.config.get(k).cloned();
        let env = snap
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let create = CreateRequest {
            image: snap.image.clone(),
            id: None,
            cpu: config("cpu"),
            memory: config("memory"),
            block_network: config("block_network").as_deref() != Some("false"),
            ready_timeout_s: req.ready_timeout_s,
            ttl_s: req.ttl_s,
            env,
            labels: req.labels.clone(),
            snapshot: Some(snap.id.clone()),
            sessions: snap.sessions.clone(),
        };
        let parent_host = hostname_of(&snap.sandbox_id);
        let mut made = Vec::new();
        for _ in 0..req.count {
            let mut create = create.clone();
            let id = format!("sb-{}", crate::random::hex(6)?);
            // The sessions' environment is the parent's, exactly, but for the
            // variable that names the machine: a fork is another one.
            for session in &mut create.sessions {
                if let Some(host) = session.env.get_mut("HOSTNAME") {
                    if *host == parent_host {
                        *host = hostname_of(&id);
                    }
                }
            }
            create.id = Some(id);
            match self.create(tenant, create).await {
                Ok(rec) => made.push(rec),
                Err(e) => {
                    // All or nothing: the forks made so far go.
                    for rec in &made {
                        let _ = self.delete(tenant, &rec.id).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }
}

/// The hostname a sandbox of id `id` gets (the local backend's rule; a sandbox's
/// `HOSTNAME`).
fn hostname_of(id: &str) -> String {
    id.replace(['_', '.'], "-")
}

/// The bounds of snapshot storage, resolved to bytes for one snapshot.
struct Bounds {
    /// The key's quota; 0 for none.
    per_key: u64,
    /// All keys' snapshots together.
    total: Option<u64>,
    /// Free space the data directory's file system keeps.
    min_free: Option<u64>,
}

impl Bounds {
    /// Whether snapshots must be counted (a quota or the host-wide bound is on).
    fn counts(&self) -> bool {
        self.per_key > 0 || self.total.is_some() || self.min_free.is_some()
    }
}

/// The refusal when the snapshots in `all` pass `tenant`'s quota or the host-wide
/// bound.
fn over_bounds(all: &[BackendSnapshot], tenant: &Tenant, bounds: &Bounds) -> Option<Error> {
    let limit = bounds.per_key;
    let used: u64 = all
        .iter()
        .filter(|s| owned_by(s, tenant))
        .map(|s| s.size_bytes)
        .sum();
    if limit > 0 && used > limit {
        return Some(QuotaExceeded::SnapshotBytes { used, limit }.into());
    }
    let used: u64 = all.iter().map(|s| s.size_bytes).sum();
    match bounds.total {
        Some(limit) if used > limit => Some(SnapshotStorage::Full { used, limit }.into()),
        _ => None,
    }
}

/// Whether `tenant` made snapshot `s`.
fn owned_by(s: &BackendSnapshot, tenant: &Tenant) -> bool {
    s.labels.get(&format!("{META}tenant")) == Some(&tenant.0)
}

/// The server's own label prefix is not the caller's to set.
fn reject_reserved(labels: &BTreeMap<String, String>) -> Result<(), Error> {
    match labels.keys().find(|k| k.starts_with(META)) {
        Some(k) => Err(BadLabel::Reserved {
            key: k.clone(),
            prefix: META,
        }
        .into()),
        None => Ok(()),
    }
}

/// What forks of `rec` are created with.
fn fork_config(rec: &SandboxRecord) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("image".to_string(), rec.image.clone()),
        ("cpu".to_string(), rec.cpu.clone()),
        ("memory".to_string(), rec.memory.clone()),
        ("block_network".to_string(), rec.block_network.to_string()),
    ])
}
