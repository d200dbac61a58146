//! The in-memory store's maps, behind its one lock: records, jobs and their queues,
//! counters, leases, notification topics, and the output budget's accounting (what
//! each tenant's finished jobs hold, and which output goes first past the budget).
//! A leaf of [`super`]: plain data and its bookkeeping, no I/O but removing the output
//! file of a job whose output the budget drops.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::time::Instant;

use orchard_protocol::compat::JobStatus;
use tokio::sync::watch;

use crate::state::record::{
    JobRecord, Lease, SandboxRecord, Topic, Version, Versioned, DROPPED_NOTE,
};
use crate::state::spill;

/// Where a job's output is when it is not (only) in its record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spilled {
    pub(super) stdout_len: u64,
    pub(super) stderr_len: u64,
    /// Also in the record (finished in this process); else only in the file (read
    /// from it when the job is asked for).
    pub(super) in_memory: bool,
}

/// What the store holds (one lock over all of it).
#[derive(Default)]
pub(super) struct Maps {
    pub(super) sandboxes: HashMap<String, Versioned<SandboxRecord>>,
    pub(super) jobs: HashMap<String, JobRecord>,
    /// Queued job ids per sandbox, oldest first.
    pub(super) queues: HashMap<String, VecDeque<String>>,
    pub(super) counters: HashMap<String, u64>,
    pub(super) rates: HashMap<String, VecDeque<Instant>>,
    pub(super) leases: HashMap<String, (Lease, Instant)>,
    pub(super) topics: HashMap<Topic, watch::Sender<u64>>,
    pub(super) next_version: Version,
    pub(super) next_fence: u64,
    /// Bytes of output held by finished jobs.
    pub(super) held: u64,
    /// The same by tenant (entries of zero removed).
    pub(super) held_by: HashMap<String, u64>,
    /// Jobs whose output has its own file.
    pub(super) spilled: HashMap<String, Spilled>,
    /// The order jobs finished in, in this process (ties of `finished_ms`).
    pub(super) finish_seq: HashMap<String, u64>,
    pub(super) next_finish: u64,
}

impl Maps {
    pub(super) fn publish(&mut self, topic: &Topic) {
        if let Some(tx) = self.topics.get(topic) {
            if tx.receiver_count() == 0 {
                self.topics.remove(topic);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Counts `job`'s output as held.
    pub(super) fn hold(&mut self, job: &JobRecord) {
        let n = self.len_of(job);
        self.held += n;
        *self.held_by.entry(job.tenant.clone()).or_default() += n;
    }

    /// Output `job` holds, in its record or in its file.
    pub(super) fn len_of(&self, job: &JobRecord) -> u64 {
        match self.spilled.get(&job.job.job_id) {
            Some(s) if !s.in_memory => s.stdout_len + s.stderr_len,
            _ => output_len(job),
        }
    }

    /// Counts `n` bytes of `tenant`'s output as no longer held.
    pub(super) fn release(&mut self, tenant: &str, n: u64) {
        self.held -= n.min(self.held);
        if let Some(t) = self.held_by.get_mut(tenant) {
            *t -= n.min(*t);
            if *t == 0 {
                self.held_by.remove(tenant);
            }
        }
    }

    pub(super) fn version(&mut self) -> Version {
        self.next_version += 1;
        self.next_version
    }

    /// Drops from `sandbox`'s queue the ids of jobs no longer queued (finished, taken
    /// or gone), and the queue itself once empty.
    pub(super) fn prune_queue(&mut self, sandbox: &str) {
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
    pub(super) fn fenced_ok(&self, lease: &Lease) -> bool {
        self.leases
            .get(&lease.name)
            .is_none_or(|(held, _)| held.fence <= lease.fence)
    }

    /// Drops output until the held output fits the budget, each time the oldest job's
    /// of the tenant holding the most; answers the jobs it emptied (their output file,
    /// if any, in `dir` removed).
    pub(super) fn enforce_budget(&mut self, budget: u64, dir: &Path) -> Vec<JobRecord> {
        let maps = self;
        if maps.held <= budget {
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
        while maps.held > budget {
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
                spill::remove(dir, &id);
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

/// Output a job holds against the budget (a dropped job's short note does not count).
pub(super) fn output_len(job: &JobRecord) -> u64 {
    if job.job.stdout == DROPPED_NOTE && job.job.stderr.is_empty() {
        return 0;
    }
    (job.job.stdout.len() + job.job.stderr.len()) as u64
}
