//! The [`StateStore`] trait, what every store implements, with its [`Subscription`]s and
//! [`until_answered`], the retry of a call while the store is away. What each operation
//! guarantees is in [`crate::state`]'s documentation.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;

use super::error::StoreError;
use super::record::{JobRecord, JobView, Lease, SandboxRecord, Topic, Version, Versioned};

/// A boxed future of a store call.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Wakes after each write to its topic made after it was taken.
pub struct Subscription {
    rx: watch::Receiver<u64>,
}

impl Subscription {
    /// A subscription on `rx`, a counter its store bumps on every write to the topic.
    pub fn new(rx: watch::Receiver<u64>) -> Subscription {
        Subscription { rx }
    }

    /// Waits for the next write; `false` when the store went away.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// Where the shared state lives. See the module documentation for what each operation
/// guarantees; an implementation over a remote store must keep those guarantees across
/// processes.
pub trait StateStore: Send + Sync + 'static {
    /// Short name (`memory`).
    fn name(&self) -> &'static str;

    /// Whether other processes share it (replicas): its records outlive this process,
    /// so a restart has nothing to rebuild from the backend.
    fn shared(&self) -> bool {
        false
    }

    /// Stores a new sandbox record; `Exists` when the id is taken.
    fn insert_sandbox(&self, record: SandboxRecord) -> StoreFuture<'_, Version>;
    /// The record of `id`.
    fn sandbox<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Versioned<SandboxRecord>>>;
    /// Every record.
    fn sandboxes(&self) -> StoreFuture<'_, Vec<Versioned<SandboxRecord>>>;
    /// How many records are in each phase, by [`Phase::name`](super::Phase::name) (`/health` and `/metrics`
    /// ask on every call: no record is copied).
    fn phase_counts(&self) -> StoreFuture<'_, BTreeMap<&'static str, u64>>;
    /// Replaces the record if it is still at `expected`: `Conflict` when it changed,
    /// `NotFound` when it is gone.
    fn update_sandbox(&self, record: SandboxRecord, expected: Version) -> StoreFuture<'_, Version>;
    /// Removes the record of `id` if it is the incarnation `uid`; answers the removed
    /// record (`None`: it was not there, or another incarnation is).
    fn remove_sandbox<'a>(
        &'a self,
        id: &'a str,
        uid: &'a str,
    ) -> StoreFuture<'a, Option<SandboxRecord>>;

    /// Stores a new job, queued last in its sandbox's queue, if that sandbox's record
    /// is still incarnation `sandbox_uid` (`NotFound` otherwise). Checked with the insert
    /// in one step: a job can never be queued behind a delete whose worker already ended
    /// the queue, so the caller needs no second read.
    fn insert_job<'a>(&'a self, job: JobRecord, sandbox_uid: &'a str) -> StoreFuture<'a, ()>;
    /// The job `id`.
    fn job<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>>;
    /// The job `id` for an answer that streams its output: where the output has a file
    /// of its own, the record comes without it and the view holds the open file, so a
    /// read costs neither a copy of the output nor the time to make one (issue 30: four
    /// reads of one big job stalled every tenant's calls). By default, [`Self::job`].
    fn job_view<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobView>> {
        Box::pin(async move {
            Ok(self.job(id).await?.map(|record| JobView {
                record,
                output: None,
            }))
        })
    }
    /// Takes the oldest queued job of `sandbox` out of its queue, marked running, for
    /// the holder of `lease`; `None` when the queue is empty.
    fn take_job<'a>(
        &'a self,
        sandbox: &'a str,
        lease: &'a Lease,
    ) -> StoreFuture<'a, Option<JobRecord>>;
    /// The jobs of `sandbox` taken by a worker and not finished (with the fence each
    /// was taken under).
    fn running_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>>;
    /// Sandboxes (ids, whether or not their record still exists) with queued or running
    /// jobs and no holder of the lease `{lease_prefix}{id}`: no worker attends to
    /// them (the replica whose worker did died). The policy loop starts one.
    fn unattended_sandboxes<'a>(&'a self, lease_prefix: &'a str) -> StoreFuture<'a, Vec<String>>;
    /// The queued jobs of `sandbox`, oldest first (ids in the queue whose job is no
    /// longer queued are dropped from it). They stay queued: a worker ending
    /// them (the sandbox is gone) finishes them one by one, and a replica that stops
    /// half-way leaves the rest queued, so the sandbox stays unattended and the next
    /// worker ends them (taken out in one step, they would stay `queued` for good).
    fn queued_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>>;
    /// Writes a finished job, unless it finished already (answers whether it wrote),
    /// and takes it out of its sandbox's queue if it was queued; with `lease`, refused
    /// (`Conflict`) once a newer grant of that lease exists. A job without a fence (read
    /// from the queue, never taken) is written only while it is still queued: once a
    /// worker took it, that worker ends it (a worker of a deleted incarnation must not
    /// fail a job the next incarnation's worker, with the same holder and grant, runs).
    fn finish_job<'a>(&'a self, job: JobRecord, lease: Option<&'a Lease>) -> StoreFuture<'a, bool>;
    /// Removes jobs that finished before `before_ms`; answers how many.
    fn purge_jobs(&self, before_ms: u64) -> StoreFuture<'_, usize>;

    /// Increments `counter` if it is below `limit` (0: no limit); answers whether it did.
    fn acquire_slot<'a>(&'a self, counter: &'a str, limit: u64) -> StoreFuture<'a, bool>;
    /// Decrements `counter` (not below 0).
    fn release_slot<'a>(&'a self, counter: &'a str) -> StoreFuture<'a, ()>;
    /// Counts a hit on `key` if fewer than `limit` came within `window`; answers whether
    /// it did.
    fn hit_rate<'a>(&'a self, key: &'a str, window: Duration, limit: u64) -> StoreFuture<'a, bool>;

    /// Grants the lease `name` to `holder` for `ttl` if no one else holds it (the holder
    /// itself gets a renewal with the same fence).
    fn acquire_lease<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<Lease>>;
    /// Extends a lease still held; `false` when it expired and another holder took it.
    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, bool>;
    /// Gives a lease up.
    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()>;

    /// Wakes on every write to `topic` after this call.
    fn subscribe(&self, topic: Topic) -> Subscription;
}

/// First and longest pause between two tries of a store call while the store is away.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// `call`'s answer, tried again with a growing pause while the store is unavailable
/// (Redis away: nothing is lost by waiting, much by giving up); `None`, logged, on
/// another error.
pub async fn until_answered<T, F, Fut>(call: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut pause = RETRY_FIRST;
    loop {
        match call().await {
            Ok(v) => return Some(v),
            Err(StoreError::Unavailable { message, .. }) => {
                tracing::warn!(error = %message, "the store is away; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a store call failed");
                return None;
            }
        }
    }
}
