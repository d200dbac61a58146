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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orchard_protocol::compat::JobStatus;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    JobRecord, JobView, Lease, OutputFile, SandboxRecord, StateStore, StoreError, StoreFuture,
    Subscription, Topic, Version, Versioned,
};

/// Error of a job that was queued or running when the server stopped.
pub const RESTART_ERROR: &str =
    "the orchestrator restarted before this job finished; the command may have run in part";

/// Default of the output budget across all jobs: 1 GiB.
pub const DEFAULT_OUTPUT_BUDGET: u64 = 1 << 30;

/// What a job's stdout says once its output was dropped for the budget.
pub const DROPPED_NOTE: &str =
    "[orchard: this job's output was dropped: the server's job output budget was full]\n";

/// One line of the journal.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    /// A job whose output is in its own file ([`super::spill`]); the record's own
    /// stdout and stderr are empty.
    Spilled {
        spilled: Box<JobRecord>,
        stdout_len: u64,
        stderr_len: u64,
    },
    Job(Box<JobRecord>),
    Purged {
        purged: String,
    },
}

/// Where a job's output is when it is not (only) in its record.
#[derive(Debug, Clone, Copy)]
struct Spilled {
    stdout_len: u64,
    stderr_len: u64,
    /// Also in the record (finished in this process); else only in the file (read
    /// from it when the job is asked for).
    in_memory: bool,
}

/// The open journal and how many lines it holds.
struct Journal {
    file: Option<File>,
    lines: usize,
    /// Bytes in the file.
    bytes: u64,
    /// Bytes it held after its last compaction (what the live jobs take).
    compacted_bytes: u64,
}

/// Bytes a journal may grow by past twice its compacted size before it is compacted
/// (so a journal of small jobs is not rewritten at every other append).
const JOURNAL_SLACK_BYTES: u64 = 16 << 20;

#[derive(Default)]
struct Maps {
    sandboxes: HashMap<String, Versioned<SandboxRecord>>,
    jobs: HashMap<String, JobRecord>,
    /// Queued job ids per sandbox, oldest first.
    queues: HashMap<String, VecDeque<String>>,
    counters: HashMap<String, u64>,
    rates: HashMap<String, VecDeque<Instant>>,
    leases: HashMap<String, (Lease, Instant)>,
    topics: HashMap<Topic, watch::Sender<u64>>,
    next_version: Version,
    next_fence: u64,
    /// Bytes of output held by finished jobs.
    held: u64,
    /// The same by tenant (entries of zero removed).
    held_by: HashMap<String, u64>,
    /// Jobs whose output has its own file.
    spilled: HashMap<String, Spilled>,
    /// The order jobs finished in, in this process (ties of `finished_ms`).
    finish_seq: HashMap<String, u64>,
    next_finish: u64,
}

impl Maps {
    fn publish(&mut self, topic: &Topic) {
        if let Some(tx) = self.topics.get(topic) {
            if tx.receiver_count() == 0 {
                self.topics.remove(topic);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Counts `job`'s output as held.
    fn hold(&mut self, job: &JobRecord) {
        let n = self.len_of(job);
        self.held += n;
        *self.held_by.entry(job.tenant.clone()).or_default() += n;
    }

    /// Output `job` holds, in its record or in its file.
    fn len_of(&self, job: &JobRecord) -> u64 {
        match self.spilled.get(&job.job.job_id) {
            Some(s) if !s.in_memory => s.stdout_len + s.stderr_len,
            _ => output_len(job),
        }
    }

    /// Counts `n` bytes of `tenant`'s output as no longer held.
    fn release(&mut self, tenant: &str, n: u64) {
        self.held -= n.min(self.held);
        if let Some(t) = self.held_by.get_mut(tenant) {
            *t -= n.min(*t);
            if *t == 0 {
                self.held_by.remove(tenant);
            }
        }
    }

    fn version(&mut self) -> Version {
        self.next_version += 1;
        self.next_version
    }

    /// Drops from `sandbox`'s queue the ids of jobs no longer queued (finished, taken
    /// or gone), and the queue itself once empty.
    fn prune_queue(&mut self, sandbox: &str) {
        let Some(queue) = self.queues.get_mut(sandbox) else {
            return;
        };
        let jobs = &self.jobs;
        queue.retain(|id| {
            jobs.get(id)
                .is_some_and(|j| j.job.status == JobStatus::Queued)
        });
        if queue.is_empty() {
            self.queues.remove(sandbox);
        }
    }

    /// Whether `lease` is the newest grant of its name.
    fn fenced_ok(&self, lease: &Lease) -> bool {
        self.leases
            .get(&lease.name)
            .is_none_or(|(held, _)| held.fence <= lease.fence)
    }
}

/// The journal line of a job whose output is in its own file.
fn spilled_line(job: &JobRecord, s: &Spilled) -> Line {
    // Every field but the output, which is not copied.
    let j = &job.job;
    let bare = JobRecord {
        tenant: job.tenant.clone(),
        job: orchard_protocol::compat::Job {
            job_id: j.job_id.clone(),
            sandbox_id: j.sandbox_id.clone(),
            command: j.command.clone(),
            status: j.status,
            stdout: String::new(),
            stderr: String::new(),
            exit_code: j.exit_code,
            created_at: j.created_at,
            started_at: j.started_at,
            completed_at: j.completed_at,
            error: j.error.clone(),
            output_truncated: j.output_truncated,
        },
        options: job.options.clone(),
        finished_ms: job.finished_ms,
        fence: job.fence,
    };
    Line::Spilled {
        spilled: Box::new(bare),
        stdout_len: s.stdout_len,
        stderr_len: s.stderr_len,
    }
}

/// Output a job holds against the budget (a dropped job's short note does not count).
fn output_len(job: &JobRecord) -> u64 {
    if job.job.stdout == DROPPED_NOTE && job.job.stderr.is_empty() {
        return 0;
    }
    (job.job.stdout.len() + job.job.stderr.len()) as u64
}

fn journal_path(dir: &Path) -> PathBuf {
    dir.join("jobs.ndjson")
}

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
            journal: Mutex::new(Journal {
                file: None,
                lines: 0,
                bytes: 0,
                compacted_bytes: 0,
            }),
            budget,
        };
        let mut last: HashMap<String, (JobRecord, Option<Spilled>)> = HashMap::new();
        // Line by line: the journal may be large, only the live jobs are kept.
        if let Ok(file) = File::open(journal_path(&dir)) {
            use std::io::BufRead;
            for line in std::io::BufReader::new(file).lines() {
                // A torn or unreadable line is skipped like a bad one.
                let Ok(line) = line else { continue };
                match serde_json::from_str::<Line>(&line) {
                    Ok(Line::Job(j)) => {
                        last.insert(j.job.job_id.clone(), (*j, None));
                    }
                    Ok(Line::Spilled {
                        spilled,
                        stdout_len,
                        stderr_len,
                    }) => {
                        let s = Spilled {
                            stdout_len,
                            stderr_len,
                            in_memory: false,
                        };
                        last.insert(spilled.job.job_id.clone(), (*spilled, Some(s)));
                    }
                    Ok(Line::Purged { purged }) => {
                        last.remove(&purged);
                    }
                    // A line torn by a kill in the middle of a write.
                    Err(_) => {}
                }
            }
        }
        // Output files of jobs no longer live (or never journaled) go.
        let keep = last
            .iter()
            .filter(|(_, (_, s))| s.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        super::spill::sweep(&dir, &keep);
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
            store.enforce_budget(&mut maps);
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
        let path = journal_path(&self.dir);
        let lines: Vec<Line> = {
            let maps = self.lock();
            maps.jobs
                .values()
                .map(|job| match maps.spilled.get(&job.job.job_id) {
                    Some(s) => spilled_line(job, s),
                    None => Line::Job(Box::new(job.clone())),
                })
                .collect()
        };
        let mut out = Vec::new();
        for line in &lines {
            if let Ok(mut bytes) = serde_json::to_vec(line) {
                bytes.push(b'\n');
                out.extend_from_slice(&bytes);
            }
        }
        crate::atomic_file::write_private(&path, &out)?;
        journal.file = Some(std::fs::OpenOptions::new().append(true).open(&path)?);
        journal.lines = lines.len();
        journal.bytes = out.len() as u64;
        journal.compacted_bytes = journal.bytes;
        Ok(())
    }

    /// Writes a finished job's big output to its own file and answers the journal line
    /// naming it; `None` (journal the whole record) for small output, or when the file
    /// cannot be written or the output was dropped meanwhile.
    fn spill(&self, job: &JobRecord) -> Option<Line> {
        if output_len(job) <= super::spill::SPILL_ABOVE {
            return None;
        }
        let id = &job.job.job_id;
        let (stdout_len, stderr_len) =
            super::spill::write(&self.dir, id, &job.job.stdout, &job.job.stderr).ok()?;
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
            super::spill::remove(&self.dir, id);
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
        Some(spilled_line(job, &s))
    }

    /// Appends lines; compacts when the journal holds twice the live jobs.
    fn append(&self, lines: &[Line]) {
        let mut bytes = Vec::new();
        for line in lines {
            if let Ok(mut b) = serde_json::to_vec(line) {
                b.push(b'\n');
                bytes.extend_from_slice(&b);
            }
        }
        if bytes.is_empty() {
            return;
        }
        let live = self.lock().jobs.len();
        let mut journal = self.journal();
        // A job whose line cannot be written still runs; only its restart report is lost.
        if let Some(f) = journal.file.as_mut() {
            let _ = f.write_all(&bytes);
        }
        journal.lines += lines.len();
        journal.bytes += bytes.len() as u64;
        // By lines (many small jobs) or by bytes (a few big outputs, each line up to
        // twice the output cap): the journal stays within about twice the live jobs.
        if journal.lines > 2 * live + 1024
            || journal.bytes > 2 * journal.compacted_bytes + JOURNAL_SLACK_BYTES
        {
            let _ = self.compact(&mut journal);
        }
    }

    /// Drops output until the held output fits the budget, each time the oldest job's
    /// of the tenant holding the most; answers the jobs it emptied.
    fn enforce_budget(&self, maps: &mut Maps) -> Vec<JobRecord> {
        if maps.held <= self.budget {
            return Vec::new();
        }
        // Each tenant's finished jobs with output, newest first (popped from the end).
        let mut by_tenant: HashMap<String, Vec<(u64, u64, String)>> = HashMap::new();
        for j in maps.jobs.values() {
            if let (Some(t), true) = (j.finished_ms, maps.len_of(j) > 0) {
                let seq = maps.finish_seq.get(&j.job.job_id).copied().unwrap_or(0);
                by_tenant
                    .entry(j.tenant.clone())
                    .or_default()
                    .push((t, seq, j.job.job_id.clone()));
            }
        }
        for jobs in by_tenant.values_mut() {
            jobs.sort_by(|a, b| b.cmp(a));
        }
        let mut emptied = Vec::new();
        while maps.held > self.budget {
            // The tenant holding the most that still has finished output to give.
            let Some(tenant) = maps
                .held_by
                .iter()
                .filter(|(t, _)| by_tenant.get(*t).is_some_and(|j| !j.is_empty()))
                .max_by_key(|(t, n)| (**n, std::cmp::Reverse((*t).clone())))
                .map(|(t, _)| t.clone())
            else {
                break;
            };
            let Some((_, _, id)) = by_tenant.get_mut(&tenant).and_then(Vec::pop) else {
                break;
            };
            let Some(before) = maps.jobs.get(&id).map(|j| maps.len_of(j)) else {
                continue;
            };
            if maps.spilled.remove(&id).is_some() {
                super::spill::remove(&self.dir, &id);
            }
            let Some(job) = maps.jobs.get_mut(&id) else {
                continue;
            };
            job.job.stdout = DROPPED_NOTE.to_string();
            job.job.stderr.clear();
            job.job.output_truncated = true;
            let emptied_job = job.clone();
            maps.release(&tenant, before);
            emptied.push(emptied_job);
        }
        emptied
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
            let output = on_disk.map(|s| (super::spill::open(&self.dir, id), s));
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
            self.enforce_budget(&mut maps)
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
                    super::spill::remove(&self.dir, id);
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

#[cfg(test)]
mod tests {
    use orchard_protocol::compat::CompatCommand;

    use super::*;

    /// A store holding sandbox `sb-1` (incarnation `u1`), the owner of the tests' jobs.
    fn open(dir: &Path) -> MemoryStore {
        open_with_budget(dir, DEFAULT_OUTPUT_BUDGET)
    }

    fn open_with_budget(dir: &Path, budget: u64) -> MemoryStore {
        let store = MemoryStore::open(dir.into(), budget).unwrap();
        let _ = futures_util::FutureExt::now_or_never(store.insert_sandbox(record()));
        store
    }

    fn record() -> SandboxRecord {
        let mut r = super::super::conformance::record("sb-1", "u1");
        r.labels.clear();
        r
    }

    fn job(id: &str, command: &str) -> JobRecord {
        let mut j = super::super::conformance::job(id, "sb-1");
        j.job.command = CompatCommand::Shell(command.into());
        j
    }

    fn finished(j: JobRecord, exit: i32, stdout: &str) -> JobRecord {
        super::super::conformance::finished(j, exit, stdout, crate::time::now_ms())
    }

    /// A journal that cannot be made is `Unavailable`, its `io::Error` the cause; the
    /// message says where, as it always did.
    #[test]
    fn a_journal_that_cannot_be_made_keeps_its_io_error() {
        use std::error::Error as _;
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let dir = file.join("jobs");
        let Err(err) = MemoryStore::open(dir.clone(), DEFAULT_OUTPUT_BUDGET) else {
            panic!("a journal under a file opened");
        };
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        let io = err
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotADirectory)
        );
        assert_eq!(
            err.to_string(),
            format!(
                "the state store failed: the job journal in {}: {}",
                dir.display(),
                io.unwrap()
            )
        );
    }

    fn lease(store: &MemoryStore, holder: &str) -> Option<Lease> {
        futures_util::FutureExt::now_or_never(store.acquire_lease(
            "sandbox/sb-1",
            holder,
            Duration::from_secs(30),
        ))
        .unwrap()
        .unwrap()
    }

    /// Runs a store future that the memory store resolves at once.
    fn now<T>(f: StoreFuture<'_, T>) -> T {
        futures_util::FutureExt::now_or_never(f).unwrap().unwrap()
    }

    #[tokio::test]
    async fn the_memory_store_passes_the_conformance_checks() {
        let dir = tempfile::tempdir().unwrap();
        let store = MemoryStore::open(dir.path().into(), DEFAULT_OUTPUT_BUDGET).unwrap();
        super::super::conformance::all(&store, "mem").await;
    }

    #[tokio::test]
    async fn jobs_are_taken_in_order_once_and_a_finish_wakes_its_subscriber() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let l = lease(&store, "me").unwrap();
        let mut queued = store.subscribe(Topic::Queue("sb-1".into()));
        now(store.insert_job(job("job-a", "a"), "u1"));
        now(store.insert_job(job("job-b", "b"), "u1"));
        assert!(queued.changed().await, "an insert wakes the queue's worker");
        let a = now(store.take_job("sb-1", &l)).unwrap();
        assert_eq!(
            (a.job.job_id.as_str(), a.job.status),
            ("job-a", JobStatus::Running)
        );
        let mut done = store.subscribe(Topic::Job("job-a".into()));
        assert!(now(
            store.finish_job(finished(a.clone(), 0, "out"), Some(&l))
        ));
        assert!(done.changed().await);
        assert!(
            !now(store.finish_job(finished(a, 1, "again"), Some(&l))),
            "finished once"
        );
        assert_eq!(now(store.job("job-a")).unwrap().job.stdout, "out");
        assert_eq!(now(store.take_job("sb-1", &l)).unwrap().job.job_id, "job-b");
        assert!(now(store.take_job("sb-1", &l)).is_none());
    }

    #[test]
    fn a_newer_lease_fences_off_the_old_holder() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let old = now(store.acquire_lease("sandbox/sb-1", "a", Duration::ZERO)).unwrap();
        // Expired at once: another holder takes it, with a larger fence.
        let new = now(store.acquire_lease("sandbox/sb-1", "b", Duration::from_secs(30))).unwrap();
        assert!(new.fence > old.fence);
        assert!(now(store.acquire_lease("sandbox/sb-1", "c", Duration::from_secs(30))).is_none());
        assert!(!now(store.renew_lease(&old, Duration::from_secs(30))));
        now(store.insert_job(job("job-a", "a"), "u1"));
        assert!(matches!(
            futures_util::FutureExt::now_or_never(store.take_job("sb-1", &old)).unwrap(),
            Err(StoreError::Conflict(_))
        ));
        let taken = now(store.take_job("sb-1", &new)).unwrap();
        assert!(matches!(
            futures_util::FutureExt::now_or_never(
                store.finish_job(finished(taken.clone(), 0, ""), Some(&old))
            )
            .unwrap(),
            Err(StoreError::Conflict(_))
        ));
        assert!(now(store.finish_job(finished(taken, 0, ""), Some(&new))));
    }

    #[test]
    fn regression_a_job_is_never_queued_for_a_sandbox_that_is_gone() {
        // The compatible exec read the record, inserted the job, then read it again
        // and drained the queue if a delete had come between. The store now refuses the
        // job in the same step as the insert.
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let refused = |store: &MemoryStore, id: &str, uid: &str| {
            matches!(
                futures_util::FutureExt::now_or_never(store.insert_job(job(id, "x"), uid)).unwrap(),
                Err(StoreError::NotFound(_))
            )
        };
        assert!(refused(&store, "job-old", "u0"), "another incarnation");
        now(store.remove_sandbox("sb-1", "u1"));
        assert!(refused(&store, "job-late", "u1"), "deleted");
        assert!(now(store.job("job-late")).is_none());
        assert!(
            now(store.queued_jobs("sb-1")).is_empty(),
            "nothing was queued"
        );
    }

    #[test]
    fn versions_make_updates_compare_and_set_and_removal_is_per_incarnation() {
        let dir = tempfile::tempdir().unwrap();
        let store = MemoryStore::open(dir.path().into(), DEFAULT_OUTPUT_BUDGET).unwrap();
        let rec = record();
        let v1 = now(store.insert_sandbox(rec.clone()));
        assert!(matches!(
            futures_util::FutureExt::now_or_never(store.insert_sandbox(rec.clone())).unwrap(),
            Err(StoreError::Exists(_))
        ));
        let mut beat = rec.clone();
        beat.heartbeat_ms = Some(5);
        let v2 = now(store.update_sandbox(beat.clone(), v1));
        assert_ne!(v1, v2);
        // A writer that read v1 loses: it must re-read.
        assert!(matches!(
            futures_util::FutureExt::now_or_never(store.update_sandbox(rec.clone(), v1)).unwrap(),
            Err(StoreError::Conflict(_))
        ));
        assert!(now(store.remove_sandbox("sb-1", "another-incarnation")).is_none());
        assert_eq!(now(store.remove_sandbox("sb-1", "u1")), Some(beat));
        assert!(now(store.sandbox("sb-1")).is_none());
    }

    #[test]
    fn slots_stop_at_their_limit_and_rates_at_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        assert!(now(store.acquire_slot("c", 2)));
        assert!(now(store.acquire_slot("c", 2)));
        assert!(!now(store.acquire_slot("c", 2)));
        now(store.release_slot("c"));
        assert!(now(store.acquire_slot("c", 2)));
        assert!(now(store.acquire_slot("c", 0)), "0 is no limit");
        let minute = Duration::from_secs(60);
        assert!(now(store.hit_rate("r", minute, 2)));
        assert!(now(store.hit_rate("r", minute, 2)));
        assert!(!now(store.hit_rate("r", minute, 2)));
        assert!(
            now(store.hit_rate("r", Duration::ZERO, 2)),
            "an empty window admits"
        );
    }

    #[test]
    fn unfinished_jobs_of_a_previous_process_are_failed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path());
            now(store.insert_job(job("job-q", "sleep 9"), "u1"));
            now(store.insert_job(job("job-d", "false"), "u1"));
            let l = lease(&store, "me").unwrap();
            now(store.take_job("sb-1", &l));
            let d = now(store.take_job("sb-1", &l)).unwrap();
            now(store.finish_job(finished(d, 1, ""), Some(&l)));
        }
        let store = open(dir.path());
        let q = now(store.job("job-q")).unwrap().job;
        assert_eq!(q.status, JobStatus::Failed);
        assert_eq!(q.error.as_deref(), Some(RESTART_ERROR));
        let d = now(store.job("job-d")).unwrap().job;
        assert_eq!(
            (d.status, d.exit_code, d.error),
            (JobStatus::Failed, Some(1), None)
        );
    }

    #[test]
    fn regression_the_journal_is_private_to_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        let store = open(&jobs);
        now(store.insert_job(job("job-s", "echo secret"), "u1"));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&jobs), 0o700);
        assert_eq!(mode(&jobs.join("jobs.ndjson")), 0o600);
    }

    #[test]
    fn regression_one_tenants_big_jobs_never_evict_the_output_of_a_tenant_holding_less() {
        // Issue 30: tenant A's big jobs evicted tenant B's finished output.
        let dir = tempfile::tempdir().unwrap();
        let store = open_with_budget(dir.path(), 1000);
        let l = lease(&store, "me").unwrap();
        let run = |id: &str, tenant: &str, out: &str| {
            let mut j = job(id, "x");
            j.tenant = tenant.into();
            now(store.insert_job(j, "u1"));
            let j = now(store.take_job("sb-1", &l)).unwrap();
            now(store.finish_job(finished(j, 0, out), Some(&l)));
        };
        run("b-old", "b", &"b".repeat(300));
        for i in 0..10 {
            run(&format!("a-{i}"), "a", &"a".repeat(400));
        }
        assert!(store.held_output() <= 1000, "{}", store.held_output());
        assert_eq!(
            now(store.job("b-old")).unwrap().job.stdout,
            "b".repeat(300),
            "the older output of the tenant holding less stays"
        );
        assert_eq!(now(store.job("a-9")).unwrap().job.stdout, "a".repeat(400));
        assert_eq!(now(store.job("a-0")).unwrap().job.stdout, DROPPED_NOTE);
    }

    #[test]
    fn regression_the_journal_of_a_few_big_outputs_stays_within_twice_the_live_jobs() {
        // Issue 30: compacted by line count only, the journal of big jobs reached
        // 2.4 GB against a 1 GiB budget.
        let dir = tempfile::tempdir().unwrap();
        let budget = 4 << 20;
        let store = open_with_budget(dir.path(), budget);
        let l = lease(&store, "me").unwrap();
        for i in 0..60 {
            now(store.insert_job(job(&format!("job-{i}"), "x"), "u1"));
            let j = now(store.take_job("sb-1", &l)).unwrap();
            now(store.finish_job(finished(j, 0, &"o".repeat(1 << 20)), Some(&l)));
        }
        let size = std::fs::metadata(journal_path(dir.path())).unwrap().len();
        assert!(
            size <= 2 * budget + JOURNAL_SLACK_BYTES + (2 << 20),
            "journal {size} bytes for a {budget}-byte budget"
        );
    }

    #[test]
    fn regression_big_output_is_kept_raw_beside_the_journal_and_a_restart_reads_none_of_it() {
        // Issue 30: output JSON-escaped in the journal (six bytes per control byte) and
        // all of it parsed by a restart: 8 to 17 s with a big journal.
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let l = lease(&store, "me").unwrap();
        let big = "\u{1}".repeat(300 << 10);
        for i in 0..3 {
            now(store.insert_job(job(&format!("big-{i}"), "x"), "u1"));
            let j = now(store.take_job("sb-1", &l)).unwrap();
            let mut j = finished(j, 0, &big);
            j.job.stderr = format!("err {i}");
            now(store.finish_job(j, Some(&l)));
        }
        now(store.insert_job(job("small", "x"), "u1"));
        let j = now(store.take_job("sb-1", &l)).unwrap();
        now(store.finish_job(finished(j, 0, "tiny"), Some(&l)));
        let journal = std::fs::metadata(journal_path(dir.path())).unwrap().len();
        assert!(journal < 16 << 10, "the journal holds {journal} bytes");
        let held = store.held_output();
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.held_output(), held, "counted from the lengths");
        let j = now(store.job("big-1")).unwrap().job;
        assert_eq!((j.stdout.len(), j.stderr.as_str()), (big.len(), "err 1"));
        assert_eq!(now(store.job("small")).unwrap().job.stdout, "tiny");
        // Purged: its file goes; the others stay and survive a compaction.
        let spilled = super::super::spill::dir_of(dir.path());
        assert_eq!(std::fs::read_dir(&spilled).unwrap().count(), 3);
        now(store.purge_jobs(crate::time::now_ms()));
        assert_eq!(std::fs::read_dir(&spilled).unwrap().count(), 0);
    }

    #[test]
    fn regression_output_past_the_budget_drops_the_oldest_jobs_output_not_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let open = || open_with_budget(dir.path(), 250);
        let store = open();
        let l = lease(&store, "me").unwrap();
        for i in 0..3 {
            now(store.insert_job(job(&format!("job-{i}"), "x"), "u1"));
            let j = now(store.take_job("sb-1", &l)).unwrap();
            now(store.finish_job(finished(j, 0, &format!("{i}").repeat(100)), Some(&l)));
        }
        assert!(store.held_output() <= 250, "{}", store.held_output());
        let first = now(store.job("job-0")).unwrap().job;
        assert_eq!(first.stdout, DROPPED_NOTE, "the oldest output goes first");
        assert!(first.output_truncated);
        assert_eq!(
            (first.status, first.exit_code),
            (JobStatus::Succeeded, Some(0))
        );
        assert_eq!(now(store.job("job-2")).unwrap().job.stdout, "2".repeat(100));
        drop(store);
        // The journal says the same after a restart, within the budget.
        let store = open();
        assert!(store.held_output() <= 250);
        assert_eq!(now(store.job("job-0")).unwrap().job.stdout, DROPPED_NOTE);
        assert_eq!(now(store.job("job-2")).unwrap().job.stdout, "2".repeat(100));
    }

    #[test]
    fn finished_jobs_are_purged_and_the_purge_holds_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let l = lease(&store, "me").unwrap();
        now(store.insert_job(job("job-run", "x"), "u1"));
        now(store.insert_job(job("job-done", "y"), "u1"));
        now(store.take_job("sb-1", &l));
        let d = now(store.take_job("sb-1", &l)).unwrap();
        now(store.finish_job(finished(d, 0, ""), Some(&l)));
        assert_eq!(now(store.purge_jobs(crate::time::now_ms())), 1);
        assert!(now(store.job("job-run")).is_some());
        assert!(now(store.job("job-done")).is_none());
        drop(store);
        let store = open(dir.path());
        assert!(now(store.job("job-done")).is_none());
        assert_eq!(
            now(store.job("job-run")).unwrap().job.status,
            JobStatus::Failed
        );
    }

    #[test]
    fn the_journal_is_compacted_and_survives_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let l = lease(&store, "me").unwrap();
        for i in 0..1500 {
            now(store.insert_job(job(&format!("job-{i}"), "true"), "u1"));
            let j = now(store.take_job("sb-1", &l)).unwrap();
            now(store.finish_job(finished(j, 0, ""), Some(&l)));
            now(store.purge_jobs(crate::time::now_ms()));
        }
        now(store.insert_job(job("job-kept", "kept"), "u1"));
        let lines = std::fs::read_to_string(dir.path().join("jobs.ndjson"))
            .unwrap()
            .lines()
            .count();
        assert!(lines < 1100, "compacted: {lines} lines");
        drop(store);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("jobs.ndjson"))
            .unwrap();
        f.write_all(b"{\"tenant\":\"t1\",\"job\":{\"job_").unwrap();
        let store = open(dir.path());
        assert_eq!(store.job_count(), 1);
        assert!(now(store.job("job-kept")).is_some());
    }
}
