//! The job store of the compatible exec route.
//!
//! A job is appended as one JSON line to `<dir>/jobs.ndjson` when it is submitted and
//! again when it finishes, before either is answered, so a server killed mid-job and
//! restarted reports the job `failed` with an error instead of forgetting it or leaving
//! it `running` forever. One append to one open file costs microseconds, where a file
//! per job cost a new inode (0.2 to 0.4 ms on ext4) on every compatible exec. On open
//! the journal is replayed (the last line of a job wins; a torn last line is skipped)
//! and rewritten compacted; it is compacted again whenever it holds twice the live jobs.
//! Waiters block on a watch channel woken when the job finishes: no polling. Finished
//! jobs are kept for the retention period, then dropped by [`JobStore::purge`] (a
//! `{"purged": id}` line).
//!
//! Output is bounded twice: per job by the exec's cap (the job says `output_truncated`),
//! and across jobs by a budget ([`DEFAULT_OUTPUT_BUDGET`]): past it the output of the
//! oldest finished jobs is dropped (their status, exit code and times stay, and their
//! stdout says what happened). The journal therefore holds at most about twice the
//! budget, and a restart replays it line by line in bounded time and memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orchard_protocol::compat::{CompatCommand, Job, JobStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::auth::Tenant;
use super::{now_secs, random_hex, Error};

/// Error of a job that was queued or running when the server stopped.
pub const RESTART_ERROR: &str =
    "the orchestrator restarted before this job finished; the command may have run in part";

/// Default of the output budget across all jobs: 1 GiB.
pub const DEFAULT_OUTPUT_BUDGET: u64 = 1 << 30;

/// What a job's stdout says once its output was dropped for the budget.
pub const DROPPED_NOTE: &str =
    "[orchard: this job's output was dropped: the server's job output budget was full]\n";

/// One job and its waiters.
pub struct JobEntry {
    /// Who submitted it.
    pub tenant: Tenant,
    job: Mutex<Job>,
    status: watch::Sender<JobStatus>,
    finished_at: Mutex<Option<Instant>>,
}

impl JobEntry {
    /// A copy of the job as it is now.
    pub fn snapshot(&self) -> Job {
        self.job.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Its id.
    pub fn id(&self) -> String {
        self.job
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .job_id
            .clone()
    }

    /// Waits until the job finishes or `timeout` passes, then answers the job as it is
    /// (still `running` if it has not finished).
    pub async fn wait(&self, timeout: Option<Duration>) -> Job {
        let mut rx = self.status.subscribe();
        let finished = rx.wait_for(|s| s.is_finished());
        match timeout {
            Some(t) => {
                let _ = tokio::time::timeout(t, finished).await;
            }
            None => {
                let _ = finished.await;
            }
        }
        self.snapshot()
    }
}

#[derive(Serialize, Deserialize)]
struct JobFile {
    tenant: String,
    job: Job,
}

/// One line of the journal.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Job(Box<JobFile>),
    Purged { purged: String },
}

/// The open journal and how many lines it holds.
struct Journal {
    file: Option<File>,
    lines: usize,
}

/// Every job of this server.
pub struct JobStore {
    jobs: Mutex<HashMap<String, Arc<JobEntry>>>,
    dir: PathBuf,
    retention: Duration,
    journal: Mutex<Journal>,
    /// Bytes of output held by finished jobs, and the most that may be.
    held: std::sync::atomic::AtomicU64,
    budget: u64,
}

/// Output a job holds against the budget (a dropped job's short note does not count).
fn output_len(job: &Job) -> u64 {
    if job.stdout == DROPPED_NOTE && job.stderr.is_empty() {
        return 0;
    }
    (job.stdout.len() + job.stderr.len()) as u64
}

fn journal_path(dir: &Path) -> PathBuf {
    dir.join("jobs.ndjson")
}

impl JobStore {
    /// Opens the store in `dir`, loading the jobs a previous process left: those that
    /// had not finished become `failed` with [`RESTART_ERROR`].
    pub fn open(dir: PathBuf, retention: Duration) -> Result<JobStore, Error> {
        Self::open_with_budget(dir, retention, DEFAULT_OUTPUT_BUDGET)
    }

    /// [`JobStore::open`] with an output budget across all jobs, in bytes.
    pub fn open_with_budget(
        dir: PathBuf,
        retention: Duration,
        budget: u64,
    ) -> Result<JobStore, Error> {
        // Every tenant's commands and output: readable by the server's user only.
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| {
                Error::internal(
                    "cannot open the job store",
                    format!("{}: {e}", dir.display()),
                )
            })?;
        let store = JobStore {
            jobs: Mutex::new(HashMap::new()),
            dir,
            retention,
            journal: Mutex::new(Journal {
                file: None,
                lines: 0,
            }),
            held: std::sync::atomic::AtomicU64::new(0),
            budget,
        };
        let mut last: HashMap<String, JobFile> = HashMap::new();
        // Line by line: the journal may be large, only the live jobs are kept.
        if let Ok(file) = File::open(journal_path(&store.dir)) {
            use std::io::BufRead;
            for line in std::io::BufReader::new(file).lines() {
                // A torn or unreadable line is skipped like a bad one.
                let Ok(line) = line else { continue };
                let line = line.as_str();
                match serde_json::from_str::<Line>(line) {
                    Ok(Line::Job(f)) => {
                        last.insert(f.job.job_id.clone(), *f);
                    }
                    Ok(Line::Purged { purged }) => {
                        last.remove(&purged);
                    }
                    // A line torn by a kill in the middle of a write.
                    Err(_) => {}
                }
            }
        }
        for file in last.into_values() {
            let mut job = file.job;
            if !job.status.is_finished() {
                job.status = JobStatus::Failed;
                job.error = Some(RESTART_ERROR.into());
                job.completed_at = Some(now_secs());
            }
            store
                .held
                .fetch_add(output_len(&job), std::sync::atomic::Ordering::Relaxed);
            let entry = Arc::new(JobEntry {
                tenant: Tenant(file.tenant),
                status: watch::Sender::new(job.status),
                job: Mutex::new(job),
                finished_at: Mutex::new(Some(Instant::now())),
            });
            store.lock().insert(entry.id(), entry);
        }
        store.enforce_budget(false);
        let mut journal = store.journal();
        store
            .compact(&mut journal)
            .map_err(|e| Error::internal("cannot open the job store", e))?;
        drop(journal);
        Ok(store)
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rewrites the journal with one line per live job and reopens it for appending.
    fn compact(&self, journal: &mut Journal) -> std::io::Result<()> {
        let path = journal_path(&self.dir);
        let tmp = self.dir.join("jobs.ndjson.tmp");
        let entries: Vec<Arc<JobEntry>> = self.lock().values().cloned().collect();
        let mut out = Vec::new();
        for e in &entries {
            let line = Line::Job(Box::new(JobFile {
                tenant: e.tenant.0.clone(),
                job: e.snapshot(),
            }));
            if let Ok(mut bytes) = serde_json::to_vec(&line) {
                bytes.push(b'\n');
                out.extend_from_slice(&bytes);
            }
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&out))?;
        // A journal left by an older server may have been readable by others.
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, &path)?;
        journal.file = Some(std::fs::OpenOptions::new().append(true).open(&path)?);
        journal.lines = entries.len();
        Ok(())
    }

    /// Appends one line; compacts when the journal holds twice the live jobs.
    fn append(&self, line: &Line) {
        let Ok(mut bytes) = serde_json::to_vec(line) else {
            return;
        };
        bytes.push(b'\n');
        let mut journal = self.journal();
        // A job whose line cannot be written still runs; only its restart report is lost.
        if let Some(f) = journal.file.as_mut() {
            let _ = f.write_all(&bytes);
        }
        journal.lines += 1;
        if journal.lines > 2 * self.len() + 1024 {
            let _ = self.compact(&mut journal);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<JobEntry>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn persist(&self, entry: &JobEntry) {
        self.append(&Line::Job(Box::new(JobFile {
            tenant: entry.tenant.0.clone(),
            job: entry.snapshot(),
        })));
    }

    /// A new queued job.
    pub fn submit(
        &self,
        tenant: &Tenant,
        sandbox_id: &str,
        command: CompatCommand,
    ) -> Arc<JobEntry> {
        let job = Job {
            job_id: format!("job-{}", random_hex(8)),
            sandbox_id: sandbox_id.to_string(),
            command,
            status: JobStatus::Queued,
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            created_at: now_secs(),
            started_at: None,
            completed_at: None,
            error: None,
            output_truncated: false,
        };
        let entry = Arc::new(JobEntry {
            tenant: tenant.clone(),
            status: watch::Sender::new(JobStatus::Queued),
            job: Mutex::new(job),
            finished_at: Mutex::new(None),
        });
        // In the table first: a compaction triggered by this very line keeps the job.
        self.lock().insert(entry.id(), entry.clone());
        self.persist(&entry);
        entry
    }

    /// The job `id` of `tenant`.
    pub fn get(&self, tenant: &Tenant, id: &str) -> Result<Arc<JobEntry>, Error> {
        match self.lock().get(id) {
            Some(e) if &e.tenant == tenant => Ok(e.clone()),
            _ => Err(Error::no_job(id)),
        }
    }

    /// Marks a job running.
    pub fn start(&self, entry: &JobEntry) {
        {
            let mut job = entry.job.lock().unwrap_or_else(|p| p.into_inner());
            job.status = JobStatus::Running;
            job.started_at = Some(now_secs());
        }
        entry.status.send_replace(JobStatus::Running);
    }

    /// Finishes a job: `exit_code` and output when it ran, `error` when it could not run
    /// or timed out, `truncated` when the output passed the cap. Idempotent: a finished
    /// job stays as it is.
    pub fn finish(
        &self,
        entry: &JobEntry,
        exit_code: Option<i32>,
        stdout: String,
        stderr: String,
        error: Option<String>,
        truncated: bool,
    ) {
        {
            let mut job = entry.job.lock().unwrap_or_else(|p| p.into_inner());
            if job.status.is_finished() {
                return;
            }
            job.status = if exit_code == Some(0) && error.is_none() {
                JobStatus::Succeeded
            } else {
                JobStatus::Failed
            };
            job.exit_code = exit_code;
            job.stdout = stdout;
            job.stderr = stderr;
            job.error = error;
            job.completed_at = Some(now_secs());
            job.output_truncated = truncated;
            if job.started_at.is_none() {
                job.started_at = job.completed_at;
            }
        }
        *entry.finished_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.held.fetch_add(
            output_len(&entry.snapshot()),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.persist(entry);
        entry.status.send_replace(entry.snapshot().status);
        self.enforce_budget(true);
    }

    /// Bytes of output held by finished jobs.
    pub fn held_output(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drops the output of the oldest finished jobs until the held output fits the
    /// budget; `persist` writes the emptied jobs to the journal.
    fn enforce_budget(&self, persist: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.held.load(Relaxed) <= self.budget {
            return;
        }
        let mut finished: Vec<(Instant, Arc<JobEntry>)> = self
            .lock()
            .values()
            .filter_map(|e| {
                let at = *e.finished_at.lock().unwrap_or_else(|p| p.into_inner());
                at.map(|t| (t, e.clone()))
            })
            .collect();
        finished.sort_by_key(|(t, _)| *t);
        for (_, entry) in finished {
            if self.held.load(Relaxed) <= self.budget {
                break;
            }
            let freed = {
                let mut job = entry.job.lock().unwrap_or_else(|p| p.into_inner());
                let before = output_len(&job);
                if before == 0 {
                    continue;
                }
                job.stdout = DROPPED_NOTE.to_string();
                job.stderr.clear();
                job.output_truncated = true;
                before
            };
            self.held.fetch_sub(freed, Relaxed);
            if persist {
                self.persist(&entry);
            }
        }
    }

    /// Removes finished jobs older than the retention period; returns how many.
    pub fn purge(&self) -> usize {
        let now = Instant::now();
        let expired: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, e)| {
                e.finished_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some_and(|t| now.duration_since(t) >= self.retention)
            })
            .map(|(id, _)| id.clone())
            .collect();
        {
            let mut jobs = self.lock();
            for id in &expired {
                if let Some(e) = jobs.remove(id) {
                    self.held.fetch_sub(
                        output_len(&e.snapshot()),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
            }
        }
        for id in &expired {
            self.append(&Line::Purged { purged: id.clone() });
        }
        expired.len()
    }

    /// Jobs held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no job is held.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> Tenant {
        Tenant("t1".into())
    }

    #[tokio::test]
    async fn a_wait_is_woken_by_the_finish_and_a_short_wait_answers_running() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(JobStore::open(dir.path().into(), Duration::from_secs(60)).unwrap());
        let e = store.submit(&tenant(), "sb-1", CompatCommand::Shell("true".into()));
        store.start(&e);
        let running = e.wait(Some(Duration::from_millis(1))).await;
        assert_eq!(
            running.status,
            JobStatus::Running,
            "never reported as finished"
        );
        let waiter = {
            let e = e.clone();
            tokio::spawn(async move { e.wait(None).await })
        };
        store.finish(&e, Some(0), "out".into(), String::new(), None, false);
        let done = waiter.await.unwrap();
        assert_eq!(done.status, JobStatus::Succeeded);
        assert_eq!(done.stdout, "out");
        assert!(done.completed_at.is_some());
        assert!(store.get(&Tenant("other".into()), &done.job_id).is_err());
    }

    #[test]
    fn unfinished_jobs_of_a_previous_process_are_failed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let (queued, done) = {
            let store = JobStore::open(dir.path().into(), Duration::from_secs(60)).unwrap();
            let q = store.submit(&tenant(), "sb-1", CompatCommand::Shell("sleep 9".into()));
            let d = store.submit(&tenant(), "sb-1", CompatCommand::Shell("false".into()));
            store.finish(&d, Some(1), String::new(), String::new(), None, false);
            (q.id(), d.id())
        };
        let store = JobStore::open(dir.path().into(), Duration::from_secs(60)).unwrap();
        let q = store.get(&tenant(), &queued).unwrap().snapshot();
        assert_eq!(q.status, JobStatus::Failed);
        assert_eq!(q.error.as_deref(), Some(RESTART_ERROR));
        let d = store.get(&tenant(), &done).unwrap().snapshot();
        assert_eq!(
            (d.status, d.exit_code, d.error),
            (JobStatus::Failed, Some(1), None)
        );
    }

    #[test]
    fn regression_the_journal_is_private_to_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        let store = JobStore::open(jobs.clone(), Duration::from_secs(60)).unwrap();
        store.submit(
            &tenant(),
            "sb-1",
            CompatCommand::Shell("echo secret".into()),
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&jobs), 0o700);
        assert_eq!(mode(&jobs.join("jobs.ndjson")), 0o600);
    }

    #[test]
    fn regression_output_past_the_budget_drops_the_oldest_jobs_output_not_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let open =
            || JobStore::open_with_budget(dir.path().into(), Duration::from_secs(60), 250).unwrap();
        let store = open();
        let ids: Vec<String> = (0..3)
            .map(|i| {
                let e = store.submit(&tenant(), "sb-1", CompatCommand::Shell("x".into()));
                store.finish(
                    &e,
                    Some(0),
                    format!("{i}").repeat(100),
                    String::new(),
                    None,
                    false,
                );
                e.id()
            })
            .collect();
        assert!(store.held_output() <= 250, "{}", store.held_output());
        let first = store.get(&tenant(), &ids[0]).unwrap().snapshot();
        assert_eq!(first.stdout, DROPPED_NOTE, "the oldest output goes first");
        assert!(first.output_truncated);
        assert_eq!(
            (first.status, first.exit_code),
            (JobStatus::Succeeded, Some(0))
        );
        let last = store.get(&tenant(), &ids[2]).unwrap().snapshot();
        assert_eq!(last.stdout, "2".repeat(100), "the newest is whole");
        drop(store);
        // The journal says the same after a restart, within the budget.
        let store = open();
        assert!(store.held_output() <= 250);
        assert_eq!(
            store.get(&tenant(), &ids[0]).unwrap().snapshot().stdout,
            DROPPED_NOTE
        );
        assert_eq!(
            store.get(&tenant(), &ids[2]).unwrap().snapshot().stdout,
            "2".repeat(100)
        );
    }

    #[test]
    fn finished_jobs_are_purged_after_retention() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path().into(), Duration::ZERO).unwrap();
        let running = store.submit(&tenant(), "sb-1", CompatCommand::Shell("x".into()));
        let done = store.submit(&tenant(), "sb-1", CompatCommand::Shell("y".into()));
        store.finish(&done, Some(0), String::new(), String::new(), None, false);
        assert_eq!(store.purge(), 1);
        assert!(store.get(&tenant(), &running.id()).is_ok());
        assert!(store.get(&tenant(), &done.id()).is_err());
        drop(store);
        // The purge holds across a restart; the unfinished job comes back failed.
        let store = JobStore::open(dir.path().into(), Duration::from_secs(60)).unwrap();
        assert!(store.get(&tenant(), &done.id()).is_err());
        assert_eq!(
            store
                .get(&tenant(), &running.id())
                .unwrap()
                .snapshot()
                .status,
            JobStatus::Failed
        );
    }

    #[test]
    fn the_journal_is_compacted_and_survives_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path().into(), Duration::ZERO).unwrap();
        for _ in 0..1500 {
            let e = store.submit(&tenant(), "sb-1", CompatCommand::Shell("true".into()));
            store.finish(&e, Some(0), String::new(), String::new(), None, false);
            store.purge();
        }
        let kept = store.submit(&tenant(), "sb-1", CompatCommand::Shell("kept".into()));
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
        let store = JobStore::open(dir.path().into(), Duration::from_secs(60)).unwrap();
        assert_eq!(store.len(), 1);
        assert!(store.get(&tenant(), &kept.id()).is_ok());
    }
}
