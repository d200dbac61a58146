//! The job worker of a sandbox: one task per sandbox per replica that has a reason to
//! run its jobs (it created or adopted the sandbox, or accepted a job for it). Workers
//! of one sandbox on different replicas compete for the sandbox's lease in the store;
//! the holder takes the queued jobs in submission order and runs them
//! ([`exec::run`]), the others wait for the lease.
//!
//! Invariants:
//! - At most one worker per sandbox incarnation in a process ([`Runtime`]'s worker set),
//!   and at most one holder of the lease across processes, so jobs run one at a time
//!   in order whichever replica accepted them.
//! - The holder renews its lease every third of its period, idle or busy; a worker
//!   that finds its lease gone (a pause past its expiry, Redis away) stops taking jobs
//!   and competes for it again: the store refuses its job writes meanwhile (fences).
//! - A worker that gets the lease first finishes the running jobs taken under an older
//!   grant (their worker's replica died or lost the lease mid-job), before any queued
//!   job, so order holds: each job's command ran on in the agent under the job's id
//!   (`result_id`), and the worker collects its real output there. A job the agent does
//!   not know (the replica died before the command reached it, the agent restarted, or
//!   the result was handed to the old worker whose write the store then refused) ends
//!   `failed` with [`ORPHANED_ERROR`](super::exec::ORPHANED_ERROR), never `running` forever.
//! - The worker ends when its sandbox's record is gone (deleted, or another
//!   incarnation), after failing what is still queued.
//!
//! [`Runtime`]: super::runtime::Runtime

use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::Instrument;

use crate::state::{JobRecord, Lease, Phase, SandboxRecord, StoreError, Topic};

use super::exec::{self, collect, Outcome};
use super::handle::{Inner, Service};
use super::runtime::Live;

/// How the worker's hold on its lease ended.
enum Held {
    /// The sandbox is gone (or the service): the worker ends.
    Gone,
    /// The lease expired or another worker took it: compete again.
    Lost,
}

/// Removes a worker from its process's worker set when it ends.
struct Registered {
    weak: Weak<Inner>,
    id: String,
    uid: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(inner) = self.weak.upgrade() {
            inner.runtime.worker_done(&self.id, &self.uid);
        }
    }
}

/// Starts the job worker of `rec` in this process, unless one runs already.
pub(super) fn spawn_worker(service: &Service, rec: &SandboxRecord) {
    spawn_worker_for(service, &rec.id, &rec.uid)
}

/// Name of the lease of sandbox `id`'s worker.
pub(super) fn lease_name(id: &str) -> String {
    format!("{LEASE_PREFIX}{id}")
}

/// Prefix of the workers' lease names.
pub(super) const LEASE_PREFIX: &str = "sandbox/";

/// Starts a worker for the jobs of sandbox `id`, incarnation `uid`, unless one runs
/// already in this process. For a sandbox whose record is gone (any `uid`), the worker
/// ends its jobs with the reason and stops.
pub(super) fn spawn_worker_for(service: &Service, id: &str, uid: &str) {
    if !service.inner.runtime.claim_worker(id, uid) {
        return;
    }
    let registered = Registered {
        weak: Arc::downgrade(&service.inner),
        id: id.to_string(),
        uid: uid.to_string(),
    };
    // Every line the worker and its jobs write names the sandbox.
    let span = tracing::warn_span!("worker", sandbox_id = %id);
    let worker = async move {
        let r = &registered;
        loop {
            let Some(lease) = acquire(&r.weak, &r.id).await else {
                return;
            };
            if let Some(inner) = r.weak.upgrade() {
                take_over_orphans(&Service { inner }, &r.id, &lease).await;
            }
            match hold(&r.weak, &r.id, &r.uid, &lease).await {
                Held::Gone => return,
                Held::Lost => {
                    tracing::warn!("the sandbox's job lease was lost; competing for it again");
                }
            }
        }
    };
    tokio::spawn(worker.instrument(span));
}

/// Waits for the lease of sandbox `id`; `None` when the service went away.
async fn acquire(weak: &Weak<Inner>, id: &str) -> Option<Lease> {
    let name = lease_name(id);
    loop {
        let service = Service {
            inner: weak.upgrade()?,
        };
        let ttl = service.policy().worker_lease;
        let mut changes = service.store().subscribe(Topic::Sandbox(id.to_string()));
        if let Ok(Some(lease)) = service
            .store()
            .acquire_lease(&name, &service.inner.holder, ttl)
            .await
        {
            return Some(lease);
        }
        // Another worker holds it (or the store is away): wait for the sandbox to
        // change (a delete releases it) or the lease to expire.
        drop(service);
        let _ = tokio::time::timeout(ttl, changes.changed()).await;
    }
}

/// Finishes the running jobs of `id` taken under an older grant than `lease`, with the
/// output their commands left in the agent, or [`ORPHANED_ERROR`](super::exec::ORPHANED_ERROR).
async fn take_over_orphans(service: &Service, id: &str, lease: &Lease) {
    // A read that fails while the store is away is tried again: skipped, the orphans
    // would stay `running` under a lease this worker then holds for good.
    let Some(running) = crate::state::until_answered(|| service.store().running_jobs(id)).await
    else {
        return;
    };
    for job in running {
        if job.fence.is_some_and(|f| f >= lease.fence) {
            continue;
        }
        tracing::warn!(job_id = %job.job.job_id, "taking over a job its worker left running");
        let outcome = collect(service, id, &job, lease).await;
        service.finish_job(job, outcome, Some(lease)).await;
    }
}

/// Takes and runs the jobs of `id` (incarnation `uid`) while `lease` holds.
async fn hold(weak: &Weak<Inner>, id: &str, uid: &str, lease: &Lease) -> Held {
    // Set when a take's answer may have been lost.
    let mut unsure = false;
    loop {
        let Some(inner) = weak.upgrade() else {
            return Held::Gone;
        };
        let service = Service { inner };
        let ttl = service.policy().worker_lease;
        // Subscribed before the reads: a change after them wakes the wait below.
        let mut queued = service.store().subscribe(Topic::Queue(id.to_string()));
        let mut changed = service.store().subscribe(Topic::Sandbox(id.to_string()));
        let rec = match service.store().sandbox(id).await {
            Ok(Some(r)) if r.value.uid == uid => r.value,
            Ok(_) => {
                fail_queued(&service, id, "the sandbox was deleted", lease).await;
                let _ = service.store().release_lease(lease).await;
                return Held::Gone;
            }
            Err(_) => {
                drop(service);
                let _ = tokio::time::timeout(ttl / 3, changed.changed()).await;
                continue;
            }
        };
        let job = match &rec.phase {
            Phase::Pending => None,
            Phase::Failed { message } => {
                fail_all(&service, id, message, lease, &mut unsure).await;
                None
            }
            Phase::Ready => match next_job(&service, id, lease, ttl, &mut unsure).await {
                Ok(job) => job,
                Err(held) => return held,
            },
        };
        let Some(job) = job else {
            drop(service);
            tokio::select! {
                _ = queued.changed() => {}
                _ = changed.changed() => {}
                _ = tokio::time::sleep(ttl / 3) => {}
            }
            let Some(inner) = weak.upgrade() else {
                return Held::Gone;
            };
            if !(Service { inner }).renew_worker_lease(lease).await {
                return Held::Lost;
            }
            continue;
        };
        let live = match service.agent_of(&rec) {
            Ok(live) => live,
            Err(e) => {
                fail(&service, job, e.public_message(), lease).await;
                continue;
            }
        };
        run_job(&service, &live, job, &rec, lease, ttl).await;
        if !service.renew_worker_lease(lease).await {
            return Held::Lost;
        }
    }
}

/// A hold's step for a sandbox that failed to start: its queued jobs fail, and so
/// does a job whose take was unsure, once it is found.
async fn fail_all(service: &Service, id: &str, message: &str, lease: &Lease, unsure: &mut bool) {
    let why = format!("the sandbox failed to start: {message}");
    fail_queued(service, id, &why, lease).await;
    if *unsure {
        if let Ok(seen) = taken_unseen(service, id, lease).await {
            *unsure = false;
            if let Some(job) = seen {
                fail(service, job, why, lease).await;
            }
        }
    }
}

/// A hold's step for a ready sandbox: the next job to run, the one an unsure take
/// left running first; `Err` when the lease is lost.
async fn next_job(
    service: &Service,
    id: &str,
    lease: &Lease,
    ttl: Duration,
    unsure: &mut bool,
) -> Result<Option<JobRecord>, Held> {
    let mut job = None;
    if *unsure {
        if let Ok(seen) = taken_unseen(service, id, lease).await {
            *unsure = seen.is_some();
            job = seen;
        }
        // Run it only while surely still the holder: a successor may have
        // failed it as orphaned already.
        if job.is_some() && !matches!(service.store().renew_lease(lease, ttl).await, Ok(true)) {
            return Err(Held::Lost);
        }
    }
    if !*unsure {
        match service.store().take_job(id, lease).await {
            Ok(taken) => job = taken,
            Err(StoreError::Conflict(_)) => return Err(Held::Lost),
            // The take may have happened with its answer lost (Redis went
            // away mid-call): the job would be `running` under this lease
            // with nobody running it. Look before taking again.
            Err(_) => *unsure = true,
        }
    }
    Ok(job)
}

/// A hold's step that runs one job, renewing the lease meanwhile.
async fn run_job(
    service: &Service,
    live: &Live,
    job: JobRecord,
    rec: &SandboxRecord,
    lease: &Lease,
    ttl: Duration,
) {
    let job_span = tracing::warn_span!("job", job_id = %job.job.job_id);
    let run = exec::run(service, live, job, rec, lease).instrument(job_span);
    tokio::pin!(run);
    loop {
        tokio::select! {
            _ = &mut run => break,
            _ = tokio::time::sleep(ttl / 3) => {
                let _ = service.renew_worker_lease(lease).await;
            }
        }
    }
}

/// A job taken under `lease` whose take this worker never saw answered (it runs one
/// job at a time, so a running job under its own grant is one it is not running); the
/// command never reached the agent, so it runs now.
async fn taken_unseen(
    service: &Service,
    id: &str,
    lease: &Lease,
) -> Result<Option<JobRecord>, StoreError> {
    let running = service.store().running_jobs(id).await?;
    Ok(running.into_iter().find(|j| j.fence == Some(lease.fence)))
}

/// Fails every queued job of sandbox `id` with `why`, one at a time: each leaves the
/// queue as it is written failed, so a replica that stops half-way leaves the rest
/// queued, and the next worker (the sandbox is unattended then) ends them.
async fn fail_queued(service: &Service, id: &str, why: &str, lease: &Lease) {
    let queued = crate::state::until_answered(|| service.store().queued_jobs(id)).await;
    for job in queued.unwrap_or_default() {
        fail(service, job, why.to_string(), lease).await;
    }
}

/// Ends `job` failed with `error`, unless a newer grant of `lease` exists (its holder
/// ends the job then).
async fn fail(service: &Service, job: JobRecord, error: String, lease: &Lease) {
    let outcome = Outcome {
        error: Some(error),
        ..Outcome::default()
    };
    service.finish_job(job, outcome, Some(lease)).await;
}
