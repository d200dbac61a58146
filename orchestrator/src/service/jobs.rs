//! The compatible route's jobs over the store: submitting (queued last in the
//! sandbox's queue, which its worker takes in order), reading, waiting (woken by the
//! store's notification when the job finishes: no polling) and finishing.
//!
//! Where they are kept, how they survive a restart and how their output is bounded
//! across jobs is the store's business: see [`crate::state::memory`].

use std::collections::BTreeMap;
use std::time::Duration;

use orchard_protocol::compat::{CompatCommand, Job, JobStatus};

use crate::state::{JobOptions, JobRecord, JobView, Lease, Phase, StoreError, Topic};

pub use crate::state::memory::{DEFAULT_OUTPUT_BUDGET, DROPPED_NOTE, RESTART_ERROR};

use super::auth::Tenant;
use super::checks::validate_env_and_labels;
use super::error::Error;
use super::exec::Outcome;
use super::handle::Service;
use crate::time::{now_ms, now_secs};

/// Most bytes of a compatible job's command (a shell string, or the arguments of a
/// list together). The kernel takes at most 128 KiB in one argument and about 2 MiB in
/// all.
pub const MAX_COMMAND_BYTES: usize = 1 << 20;

impl Service {
    /// Queues a compatible job; jobs of one sandbox run one at a time in this order.
    /// An empty command (a blank string, an empty list) is refused first, whatever
    /// the sandbox.
    pub async fn submit(
        &self,
        tenant: &Tenant,
        id: &str,
        command: CompatCommand,
        options: JobOptions,
    ) -> Result<Job, Error> {
        let empty = match &command {
            CompatCommand::Shell(s) => s.trim().is_empty(),
            CompatCommand::Argv(v) => v.is_empty(),
        };
        if empty {
            return Err(Error::BadRequest("command must not be empty".into()));
        }
        let rec = self.get(tenant, id).await?;
        if let Phase::Failed { message } = &rec.phase {
            return Err(Error::sandbox_failed(id, message));
        }
        if rec.paused {
            return Err(Error::Paused(id.to_string()));
        }
        let bytes = match &command {
            CompatCommand::Shell(s) => s.len(),
            CompatCommand::Argv(v) => v.iter().map(|a| a.len() + 1).sum(),
        };
        // A queued job's command is kept (and journaled) until it ends: bounded, far
        // above what a process can be given anyway.
        if bytes > MAX_COMMAND_BYTES {
            return Err(Error::TooLarge(format!(
                "the command is {bytes} bytes; at most {MAX_COMMAND_BYTES}"
            )));
        }
        validate_env_and_labels(&options.env, &BTreeMap::new())?;
        let job = Job {
            job_id: format!("job-{}", crate::random::hex(8)?),
            sandbox_id: id.to_string(),
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
        let record = JobRecord {
            tenant: tenant.0.clone(),
            job: job.clone(),
            options,
            finished_ms: None,
            fence: None,
        };
        // Refused when a delete came since the read above: the queue's worker may already
        // have ended it, and a job queued now would wait forever.
        match self.store().insert_job(record, &rec.uid).await {
            Err(StoreError::NotFound(_)) => return Err(Error::no_sandbox(id)),
            other => other?,
        }
        // A worker here too (a no-op when one runs): if the replica whose worker holds
        // the sandbox's lease dies, this one takes its jobs over.
        super::worker::spawn_worker(self, &rec);
        Ok(job)
    }

    /// The job `id` of `tenant`, its output read in if it has a file.
    pub async fn job(&self, tenant: &Tenant, id: &str) -> Result<Job, Error> {
        let view = self.job_view(tenant, id).await?;
        materialise(view).await
    }

    /// The job `id` of `tenant` as the store has it, its output possibly in a file for
    /// the answer to stream ([`crate::state::JobView`]).
    pub async fn job_view(&self, tenant: &Tenant, id: &str) -> Result<JobView, Error> {
        match self.store().job_view(id).await? {
            Some(v) if v.record.tenant == tenant.0 => Ok(v),
            _ => Err(Error::no_job(id)),
        }
    }

    /// [`Self::wait_job_view`] with the output read in.
    pub async fn wait_job(
        &self,
        tenant: &Tenant,
        id: &str,
        timeout: Option<Duration>,
    ) -> Result<Job, Error> {
        materialise(self.wait_job_view(tenant, id, timeout).await?).await
    }

    /// Waits until the job finishes or `timeout` passes, then answers the job as it is
    /// (still `running` if it has not finished).
    pub async fn wait_job_view(
        &self,
        tenant: &Tenant,
        id: &str,
        timeout: Option<Duration>,
    ) -> Result<JobView, Error> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            // Subscribed before the read: the finish after it wakes the wait.
            let mut changes = self.store().subscribe(Topic::Job(id.to_string()));
            let view = self.job_view(tenant, id).await?;
            if view.record.job.status.is_finished() {
                return Ok(view);
            }
            let woke = match deadline {
                Some(d) => tokio::time::timeout_at(d, changes.changed())
                    .await
                    .unwrap_or(false),
                None => changes.changed().await,
            };
            if !woke {
                return self.job_view(tenant, id).await;
            }
        }
    }

    /// Finishes a job with `outcome`. A job that finished already stays as it was; with
    /// `lease` (its worker's), the write is refused once another worker took the
    /// sandbox's lease.
    pub(super) async fn finish_job(
        &self,
        mut job: JobRecord,
        outcome: Outcome,
        lease: Option<&Lease>,
    ) {
        let Outcome {
            exit_code,
            stdout,
            stderr,
            error,
            truncated,
        } = outcome;
        let j = &mut job.job;
        j.status = if exit_code == Some(0) && error.is_none() {
            JobStatus::Succeeded
        } else {
            JobStatus::Failed
        };
        j.exit_code = exit_code;
        j.stdout = stdout;
        j.stderr = stderr;
        j.error = error;
        j.completed_at = Some(now_secs());
        j.output_truncated = truncated;
        if j.started_at.is_none() {
            j.started_at = j.completed_at;
        }
        job.finished_ms = Some(now_ms());
        // While the store is away the outcome waits here (the worker's next job waits
        // with it): dropped, the job would stay `running` and its output be lost.
        crate::state::until_answered(|| self.store().finish_job(job.clone(), lease)).await;
    }

    /// Removes finished jobs older than the retention period; answers how many.
    pub async fn purge_jobs(&self) -> usize {
        let retention = u64::try_from(self.policy().job_retention.as_millis()).unwrap_or(u64::MAX);
        let before = now_ms().saturating_sub(retention);
        self.store().purge_jobs(before).await.unwrap_or(0)
    }
}

/// The job of `view` with its output in it (a file read off the server's threads).
async fn materialise(view: JobView) -> Result<Job, Error> {
    if view.output.is_none() {
        return Ok(view.record.job);
    }
    tokio::task::spawn_blocking(move || view.into_record().job)
        .await
        .map_err(|e| Error::internal("reading a job's output", e))
}
