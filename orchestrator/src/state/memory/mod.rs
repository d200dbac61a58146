//! The in-memory [`StateStore`]: one process's maps behind one lock, plus a journal
//! that keeps the jobs across a restart.
//!
//! Sandbox records are not journaled: a restarted server rebuilds them from the
//! backend's labels (the backend is the truth of what exists). Jobs are: each is appended
//! as one JSON line to `<dir>/jobs.ndjson` when it is inserted and again when it
//! finishes, before either is answered, so a server killed mid-job and restarted reports
//! the job `failed` with an error instead of forgetting it or leaving it `running`
//! forever. One append to one open file costs microseconds, where a file per job cost a
//! new inode (0.2 to 0.4 ms on ext4) on every compatible exec. On open the journal is
//! replayed (the last line of a job wins; a torn last line is skipped) and rewritten
//! compacted; it is compacted again whenever it holds twice the live jobs.
//!
//! Output is bounded across jobs by a budget ([`DEFAULT_OUTPUT_BUDGET`]): past it the
//! output of finished jobs is dropped (their status, exit code and times stay, and
//! their stdout says what happened), **the oldest of the tenant holding the most
//! first**: one tenant's big jobs never evict the output of a tenant holding less
//! (issue 30: tenant A's jobs evicted tenant B's finished output). The journal is
//! compacted when it holds twice what it held after its last compaction (by lines or
//! by bytes), so it holds at most about twice the budget, and a restart replays it
//! line by line in bounded time and memory.
//!
//! Notifications are a `watch` counter per topic, made on the first subscription and
//! dropped once no subscriber is left; leases and rate windows use this process's
//! monotonic clock.
//!
//! Parts: `maps` (what the lock guards, and the output budget), `journal` (the
//! journal's lines, replay and compaction); this module is the store over them.

mod journal;
mod maps;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orchard_protocol::compat::JobStatus;
use tokio::sync::watch;

use crate::state::error::StoreError;
use crate::state::record::{
    JobRecord, JobView, Lease, OutputFile, SandboxRecord, Topic, Version, Versioned,
};
use crate::state::spill;
use crate::state::store::{StateStore, StoreFuture, Subscription};
use journal::{Journal, Line};
use maps::{output_len, Maps, Spilled};

/// The note a dropped output leaves; kept here too, where it always was.
pub use crate::state::record::DROPPED_NOTE;

/// Error of a job that was queued or running when the server stopped.
pub const RESTART_ERROR: &str =
    "the orchestrator restarted before this job finished; the command may have run in part";

/// Default of the output budget across all jobs: 1 GiB.
pub const DEFAULT_OUTPUT_BUDGET: u64 = 1 << 30;

/// The in-memory store.
pub struct MemoryStore {
    maps: Mutex<Maps>,
    dir: PathBuf,
    journal: Mutex<Journal>,
    budget: u64,
}

fn ready<'a, T: Send + 'a>(v: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

impl MemoryStore {
    /// Opens the store with its job journal in `dir`, loading the jobs a previous
    /// process left: those that had not finished become `failed` with
    /// [`RESTART_ERROR`]. `budget` bounds the output all finished jobs hold.
    pub fn open(dir: PathBuf, budget: u64) -> Result<MemoryStore, StoreError> {
        let failed = |e: std::io::Error| {
            StoreError::unavailable(format!("the job journal in {}: {e}", dir.display()), e)
        };
        // Every tenant's commands and output: readable by the server's user only.
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(failed)?;
        let store = MemoryStore {
            maps: Mutex::new(Maps::default()),
            dir: dir.clone(),
            journal: Mutex::new(Journal::closed()),
            budget,
        };
        let last = journal::replay(&dir);
        // Output files of jobs no longer live (or never journaled) go.
        let keep = last
            .iter()
            .filter(|(_, (_, s))| s.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        spill::sweep(&dir, &keep);
        {
            let now = crate::time::now_ms();
            let mut maps = store.lock();
            for (id, (mut rec, spilled)) in last {
                if let Some(s) = spilled {
                    maps.spilled.insert(id.clone(), s);
                }
                if !rec.job.status.is_finished() {
                    rec.job.status = JobStatus::Failed;
                    rec.job.error = Some(RESTART_ERROR.into());
                    rec.job.completed_at = Some(crate::time::now_secs());
                }
                rec.finished_ms.get_or_insert(now);
                maps.hold(&rec);
                maps.jobs.insert(id, rec);
            }
            maps.enforce_budget(store.budget, &store.dir);
        }
        let mut journal = store.journal();
        store.compact(&mut journal).map_err(failed)?;
        drop(journal);
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of output held by finished jobs.
    pub fn held_output(&self) -> u64 {
        self.lock().held
    }

    /// Jobs held.
    pub fn job_count(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Rewrites the journal with one line per live job and reopens it for appending.
    fn compact(&self, journal: &mut Journal) -> std::io::Result<()> {
        let lines: Vec<Line> = {
            let maps = self.lock();
            maps.jobs
                .values()
                .map(|job| match maps.spilled.get(&job.job.job_id) {
                    Some(s) => journal::spilled_line(job, s),
                    None => Line::Job(Box::new(job.clone())),
                })
                .collect()
        };
        journal.rewrite(&journal::path(&self.dir), &lines)
    }

    /// Writes a finished job's big output to its own file and answers the journal line
    /// naming it; `None` (journal the whole record) for small output, or when the file
    /// cannot be written or the output was dropped meanwhile.
    fn spill(&self, job: &JobRecord) -> Option<Line> {
        if output_len(job) <= spill::SPILL_ABOVE {
            return None;
        }
        let id = &job.job.job_id;
        let (stdout_len, stderr_len) =
            spill::write(&self.dir, id, &job.job.stdout, &job.job.stderr).ok()?;
        let s = Spilled {
            stdout_len,
            stderr_len,
            in_memory: true,
        };
        let mut maps = self.lock();
        // Emptied for the budget (or purged) between the finish and this write.
        let still = maps.jobs.get(id).is_some_and(|j| {
            j.job.stdout.len() as u64 == stdout_len && j.job.stderr.len() as u64 == stderr_len
        });
        if !still {
            drop(maps);
            spill::remove(&self.dir, id);
            return None;
        }
        // The file holds it now: the record keeps none (reads stream the file), so the
        // memory of a big job is freed at its finish, not at its eviction.
        let s = Spilled {
            in_memory: false,
            ..s
        };
        if let Some(j) = maps.jobs.get_mut(id) {
            j.job.stdout = String::new();
            j.job.stderr = String::new();
        }
        maps.spilled.insert(id.clone(), s);
        Some(journal::spilled_line(job, &s))
    }

    /// Appends lines; compacts when the journal holds twice the live jobs.
    fn append(&self, lines: &[Line]) {
        let live = self.lock().jobs.len();
        let mut journal = self.journal();
        if journal.append(lines, live) {
            let _ = self.compact(&mut journal);
        }
    }
}

impl StateStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn insert_sandbox(&self, record: SandboxRecord) -> StoreFuture<'_, Version> {
        let mut maps = self.lock();
        if maps.sandboxes.contains_key(&record.id) {
            return ready(Err(StoreError::Exists(format!("sandbox {}", record.id))));
        }
        let version = maps.version();
        let topic = Topic::Sandbox(record.id.clone());
        maps.sandboxes.insert(
            record.id.clone(),
            Versioned {
                value: record,
                version,
            },
        );
        maps.publish(&topic);
        ready(Ok(version))
    }

    fn sandbox<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Versioned<SandboxRecord>>> {
        ready(Ok(self.lock().sandboxes.get(id).cloned()))
    }

    fn sandboxes(&self) -> StoreFuture<'_, Vec<Versioned<SandboxRecord>>> {
        ready(Ok(self.lock().sandboxes.values().cloned().collect()))
    }

    fn phase_counts(&self) -> StoreFuture<'_, std::collections::BTreeMap<&'static str, u64>> {
        let mut counts = std::collections::BTreeMap::new();
        for r in self.lock().sandboxes.values() {
            *counts.entry(r.value.phase.name()).or_default() += 1;
        }
        ready(Ok(counts))
    }

    fn update_sandbox(&self, record: SandboxRecord, expected: Version) -> StoreFuture<'_, Version> {
        let mut maps = self.lock();
        let version = maps.next_version + 1;
        let Some(current) = maps.sandboxes.get_mut(&record.id) else {
            return ready(Err(StoreError::NotFound(format!("sandbox {}", record.id))));
        };
        if current.version != expected || current.value.uid != record.uid {
            return ready(Err(StoreError::Conflict(format!("sandbox {}", record.id))));
        }
        let topic = Topic::Sandbox(record.id.clone());
        *current = Versioned {
            value: record,
            version,
        };
        maps.next_version = version;
        maps.publish(&topic);
        ready(Ok(version))
    }

    fn remove_sandbox<'a>(
        &'a self,
        id: &'a str,
        uid: &'a str,
    ) -> StoreFuture<'a, Option<SandboxRecord>> {
        let mut maps = self.lock();
        if maps.sandboxes.get(id).is_none_or(|r| r.value.uid != uid) {
            return ready(Ok(None));
        }
        let removed = maps.sandboxes.remove(id).map(|r| r.value);
        maps.publish(&Topic::Sandbox(id.to_string()));
        // The worker waiting on the queue learns the sandbox is gone.
        maps.publish(&Topic::Queue(id.to_string()));
        ready(Ok(removed))
    }

    fn insert_job<'a>(&'a self, job: JobRecord, sandbox_uid: &'a str) -> StoreFuture<'a, ()> {
        let id = job.job.job_id.clone();
        let sandbox = job.job.sandbox_id.clone();
        {
            let mut maps = self.lock();
            if maps
                .sandboxes
                .get(&sandbox)
                .is_none_or(|r| r.value.uid != sandbox_uid)
            {
                return ready(Err(StoreError::NotFound(format!("sandbox {sandbox}"))));
            }
            if maps.jobs.contains_key(&id) {
                return ready(Err(StoreError::Exists(format!("job {id}"))));
            }
            // In the table first: a compaction triggered by this very line keeps it.
            maps.jobs.insert(id.clone(), job.clone());
            maps.queues
                .entry(sandbox.clone())
                .or_default()
                .push_back(id);
        }
        self.append(&[Line::Job(Box::new(job))]);
        self.lock().publish(&Topic::Queue(sandbox));
        ready(Ok(()))
    }

    fn job<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>> {
        Box::pin(async move {
            match self.job_view(id).await? {
                Some(view) if view.output.is_some() => {
                    // A file read of up to the output cap: off the server's threads
                    // (inline outside a runtime, as the store's other calls work).
                    let Ok(rt) = tokio::runtime::Handle::try_current() else {
                        return Ok(Some(view.into_record()));
                    };
                    let record = rt
                        .spawn_blocking(move || view.into_record())
                        .await
                        .map_err(|e| StoreError::unavailable(format!("reading a job: {e}"), e))?;
                    Ok(Some(record))
                }
                view => Ok(view.map(|v| v.record)),
            }
        })
    }

    fn job_view<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobView>> {
        let (record, on_disk) = {
            let maps = self.lock();
            let on_disk = maps.spilled.get(id).filter(|s| !s.in_memory).copied();
            // Cheap: a job whose output has its file holds none in its record.
            (maps.jobs.get(id).cloned(), on_disk)
        };
        let view = record.map(|mut record| {
            let output = on_disk.map(|s| (spill::open(&self.dir, id), s));
            let output = match output {
                None => None,
                Some((Ok(file), s)) => Some(OutputFile {
                    file,
                    stdout_len: s.stdout_len,
                    stderr_len: s.stderr_len,
                }),
                Some((Err(e), _)) => {
                    tracing::warn!(job_id = %id, error = %e, "a job's spilled output is unreadable");
                    record.job.stdout = DROPPED_NOTE.to_string();
                    record.job.output_truncated = true;
                    None
                }
            };
            JobView { record, output }
        });
        ready(Ok(view))
    }

    fn take_job<'a>(
        &'a self,
        sandbox: &'a str,
        lease: &'a Lease,
    ) -> StoreFuture<'a, Option<JobRecord>> {
        let mut maps = self.lock();
        if !maps.fenced_ok(lease) {
            return ready(Err(StoreError::Conflict(format!("lease {}", lease.name))));
        }
        loop {
            let Some(id) = maps.queues.get_mut(sandbox).and_then(|q| q.pop_front()) else {
                maps.queues.remove(sandbox);
                return ready(Ok(None));
            };
            let Some(job) = maps.jobs.get_mut(&id) else {
                continue;
            };
            if job.job.status != JobStatus::Queued {
                continue;
            }
            job.job.status = JobStatus::Running;
            job.job.started_at = Some(crate::time::now_secs());
            job.fence = Some(lease.fence);
            let job = job.clone();
            maps.publish(&Topic::Job(id));
            return ready(Ok(Some(job)));
        }
    }

    fn running_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>> {
        let maps = self.lock();
        let running = maps
            .jobs
            .values()
            .filter(|j| j.job.sandbox_id == sandbox && j.job.status == JobStatus::Running)
            .cloned()
            .collect();
        ready(Ok(running))
    }

    fn unattended_sandboxes<'a>(&'a self, lease_prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        let maps = self.lock();
        let now = Instant::now();
        let mut busy: BTreeSet<&str> = maps
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(id, _)| id.as_str())
            .collect();
        busy.extend(
            maps.jobs
                .values()
                .filter(|j| j.job.status == JobStatus::Running)
                .map(|j| j.job.sandbox_id.as_str()),
        );
        let unattended = busy
            .into_iter()
            .filter(|id| {
                maps.leases
                    .get(&format!("{lease_prefix}{id}"))
                    .is_none_or(|(_, expires)| *expires <= now)
            })
            .map(str::to_string)
            .collect();
        ready(Ok(unattended))
    }

    fn queued_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>> {
        let mut maps = self.lock();
        maps.prune_queue(sandbox);
        let jobs = maps
            .queues
            .get(sandbox)
            .into_iter()
            .flatten()
            .filter_map(|id| maps.jobs.get(id))
            .cloned()
            .collect();
        ready(Ok(jobs))
    }

    fn finish_job<'a>(&'a self, job: JobRecord, lease: Option<&'a Lease>) -> StoreFuture<'a, bool> {
        let id = job.job.job_id.clone();
        let emptied = {
            let mut maps = self.lock();
            if lease.is_some_and(|l| !maps.fenced_ok(l)) {
                return ready(Err(StoreError::Conflict(format!("job {id}"))));
            }
            let was_queued = match maps.jobs.get(&id) {
                None => return ready(Ok(false)),
                Some(j) if j.job.status.is_finished() => return ready(Ok(false)),
                // Never taken (read from the queue), and taken since: its worker ends it.
                Some(j) if job.fence.is_none() && j.job.status != JobStatus::Queued => {
                    return ready(Ok(false))
                }
                Some(j) => j.job.status == JobStatus::Queued,
            };
            maps.hold(&job);
            maps.next_finish += 1;
            let seq = maps.next_finish;
            maps.finish_seq.insert(id.clone(), seq);
            maps.jobs.insert(id.clone(), job.clone());
            if was_queued {
                maps.prune_queue(&job.job.sandbox_id);
            }
            maps.enforce_budget(self.budget, &self.dir)
        };
        let first = self.spill(&job).unwrap_or_else(|| Line::Job(Box::new(job)));
        let mut lines = vec![first];
        lines.extend(emptied.into_iter().map(|j| Line::Job(Box::new(j))));
        self.append(&lines);
        self.lock().publish(&Topic::Job(id));
        ready(Ok(true))
    }

    fn purge_jobs(&self, before_ms: u64) -> StoreFuture<'_, usize> {
        let expired: Vec<String> = {
            let mut maps = self.lock();
            let expired: Vec<String> = maps
                .jobs
                .values()
                .filter(|j| j.finished_ms.is_some_and(|t| t <= before_ms))
                .map(|j| j.job.job_id.clone())
                .collect();
            for id in &expired {
                maps.finish_seq.remove(id);
                if let Some(j) = maps.jobs.remove(id) {
                    let n = maps.len_of(&j);
                    maps.release(&j.tenant, n);
                }
                if maps.spilled.remove(id).is_some() {
                    spill::remove(&self.dir, id);
                }
            }
            // Topics whose subscribers all left.
            maps.topics.retain(|_, tx| tx.receiver_count() > 0);
            expired
        };
        let lines: Vec<Line> = expired
            .iter()
            .map(|id| Line::Purged { purged: id.clone() })
            .collect();
        self.append(&lines);
        ready(Ok(expired.len()))
    }

    fn acquire_slot<'a>(&'a self, counter: &'a str, limit: u64) -> StoreFuture<'a, bool> {
        let mut maps = self.lock();
        let n = maps.counters.entry(counter.to_string()).or_default();
        if limit > 0 && *n >= limit {
            return ready(Ok(false));
        }
        *n += 1;
        ready(Ok(true))
    }

    fn release_slot<'a>(&'a self, counter: &'a str) -> StoreFuture<'a, ()> {
        let mut maps = self.lock();
        if let Some(n) = maps.counters.get_mut(counter) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                maps.counters.remove(counter);
            }
        }
        ready(Ok(()))
    }

    fn hit_rate<'a>(&'a self, key: &'a str, window: Duration, limit: u64) -> StoreFuture<'a, bool> {
        let mut maps = self.lock();
        let hits = maps.rates.entry(key.to_string()).or_default();
        let now = Instant::now();
        while hits
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            hits.pop_front();
        }
        if limit > 0 && hits.len() as u64 >= limit {
            return ready(Ok(false));
        }
        hits.push_back(now);
        ready(Ok(true))
    }

    fn acquire_lease<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<Lease>> {
        let mut maps = self.lock();
        let now = Instant::now();
        if let Some((lease, expires)) = maps.leases.get_mut(name) {
            if lease.holder == holder {
                *expires = now + ttl;
                return ready(Ok(Some(lease.clone())));
            }
            if *expires > now {
                return ready(Ok(None));
            }
        }
        maps.next_fence += 1;
        let lease = Lease {
            name: name.to_string(),
            holder: holder.to_string(),
            fence: maps.next_fence,
        };
        maps.leases
            .insert(name.to_string(), (lease.clone(), now + ttl));
        ready(Ok(Some(lease)))
    }

    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, bool> {
        let mut maps = self.lock();
        match maps.leases.get_mut(&lease.name) {
            Some((held, expires)) if held == lease => {
                *expires = Instant::now() + ttl;
                ready(Ok(true))
            }
            _ => ready(Ok(false)),
        }
    }

    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        let mut maps = self.lock();
        if maps
            .leases
            .get(&lease.name)
            .is_some_and(|(held, _)| held == lease)
        {
            maps.leases.remove(&lease.name);
        }
        ready(Ok(()))
    }

    fn subscribe(&self, topic: Topic) -> Subscription {
        let mut maps = self.lock();
        let tx = maps
            .topics
            .entry(topic)
            .or_insert_with(|| watch::Sender::new(0));
        Subscription::new(tx.subscribe())
    }
}
