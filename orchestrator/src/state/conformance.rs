//! What every [`StateStore`] must do, as checks any implementation runs: the memory
//! store in its unit tests, the Redis store against a real `redis-server` in the
//! integration tests (`orchestrator/tests/redis/`). Each check uses its own ids (from
//! `tag`), so checks can share one store.
//!
//! A check panics with what broke; the guarantees themselves are written down in
//! [`super`]'s module documentation.

use std::time::{Duration, Instant};

use orchard_protocol::compat::{CompatCommand, Job, JobStatus};

use super::{JobRecord, Phase, SandboxRecord, StateStore, StoreError, Topic};

/// A pending record `id`, incarnation `uid`.
pub fn record(id: &str, uid: &str) -> SandboxRecord {
    SandboxRecord {
        id: id.into(),
        uid: uid.into(),
        tenant: "t1".into(),
        image: "busybox".into(),
        cpu: "1".into(),
        memory: "1Gi".into(),
        working_dir: "/workspace".into(),
        block_network: true,
        ready_timeout_ms: 1000,
        ttl_ms: None,
        labels: [("k".to_string(), "v".to_string())].into(),
        created_ms: 1,
        heartbeat_ms: None,
        phase: Phase::Pending,
        agent: None,
        paused: false,
        notice: None,
        unschedulable: None,
    }
}

/// A queued job `id` of sandbox `sandbox`.
pub fn job(id: &str, sandbox: &str) -> JobRecord {
    JobRecord {
        tenant: "t1".into(),
        job: Job {
            job_id: id.into(),
            sandbox_id: sandbox.into(),
            command: CompatCommand::Shell(format!("echo {id}")),
            status: JobStatus::Queued,
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            created_at: 1.0,
            started_at: None,
            completed_at: None,
            error: None,
            output_truncated: false,
        },
        options: Default::default(),
        finished_ms: None,
        fence: None,
    }
}

/// `j` finished with `exit` and `stdout`, at `finished_ms`.
pub fn finished(mut j: JobRecord, exit: i32, stdout: &str, finished_ms: u64) -> JobRecord {
    j.job.status = if exit == 0 {
        JobStatus::Succeeded
    } else {
        JobStatus::Failed
    };
    j.job.exit_code = Some(exit);
    j.job.stdout = stdout.into();
    j.job.completed_at = Some(2.0);
    j.finished_ms = Some(finished_ms);
    j
}

/// Runs every check on `store`.
pub async fn all(store: &dyn StateStore, tag: &str) {
    versions_and_incarnations(store, tag).await;
    jobs_in_order_once(store, tag).await;
    regression_a_worker_stopped_while_ending_a_deleted_sandboxs_jobs_leaves_the_rest_queued(
        store, tag,
    )
    .await;
    fencing(store, tag).await;
    no_job_behind_a_delete(store, tag).await;
    unattended(store, tag).await;
    slots_and_rates(store, tag).await;
    purge(store, tag).await;
    listing(store, tag).await;
}

/// Updates are compare-and-set on the version; removal is per incarnation.
pub async fn versions_and_incarnations(store: &dyn StateStore, tag: &str) {
    let id = format!("{tag}-cas");
    let rec = record(&id, "u1");
    let v1 = store.insert_sandbox(rec.clone()).await.unwrap();
    assert!(matches!(
        store.insert_sandbox(rec.clone()).await,
        Err(StoreError::Exists(_))
    ));
    let got = store.sandbox(&id).await.unwrap().unwrap();
    assert_eq!((got.value.clone(), got.version), (rec.clone(), v1));
    let mut beat = rec.clone();
    beat.heartbeat_ms = Some(5);
    let v2 = store.update_sandbox(beat.clone(), v1).await.unwrap();
    assert_ne!(v1, v2);
    assert!(
        matches!(
            store.update_sandbox(rec.clone(), v1).await,
            Err(StoreError::Conflict(_))
        ),
        "a writer that read v1 loses"
    );
    let mut other = beat.clone();
    other.uid = "u2".into();
    assert!(
        matches!(
            store.update_sandbox(other, v2).await,
            Err(StoreError::Conflict(_))
        ),
        "another incarnation's write"
    );
    assert!(store.remove_sandbox(&id, "u0").await.unwrap().is_none());
    assert_eq!(store.remove_sandbox(&id, "u1").await.unwrap(), Some(beat));
    assert!(store.sandbox(&id).await.unwrap().is_none());
    assert!(matches!(
        store.update_sandbox(rec, v2).await,
        Err(StoreError::NotFound(_))
    ));
}

/// Jobs are taken in insertion order, each once; a finish wakes its subscriber and
/// happens once.
pub async fn jobs_in_order_once(store: &dyn StateStore, tag: &str) {
    let sb = format!("{tag}-jobs");
    store.insert_sandbox(record(&sb, "u1")).await.unwrap();
    let lease = store
        .acquire_lease(&format!("sandbox/{sb}"), "me", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let mut queued = store.subscribe(Topic::Queue(sb.clone()));
    let (a, b) = (format!("{tag}-job-a"), format!("{tag}-job-b"));
    store.insert_job(job(&a, &sb), "u1").await.unwrap();
    assert!(matches!(
        store.insert_job(job(&a, &sb), "u1").await,
        Err(StoreError::Exists(_))
    ));
    store.insert_job(job(&b, &sb), "u1").await.unwrap();
    assert!(queued.changed().await, "an insert wakes the queue's worker");
    assert_eq!(
        store.job(&a).await.unwrap().unwrap().job.status,
        JobStatus::Queued
    );
    let taken = store.take_job(&sb, &lease).await.unwrap().unwrap();
    assert_eq!(
        (taken.job.job_id.as_str(), taken.job.status),
        (a.as_str(), JobStatus::Running)
    );
    let read = store.job(&a).await.unwrap().unwrap();
    assert_eq!(read.job.status, JobStatus::Running, "as read by anyone");
    assert!(read.job.started_at.is_some());
    assert_eq!(read.fence, Some(lease.fence), "taken under this lease");
    let running = store.running_jobs(&sb).await.unwrap();
    assert_eq!(
        running
            .iter()
            .map(|j| (j.job.job_id.as_str(), j.fence))
            .collect::<Vec<_>>(),
        [(a.as_str(), Some(lease.fence))]
    );
    let mut done = store.subscribe(Topic::Job(a.clone()));
    let now = crate::time::now_ms();
    assert!(store
        .finish_job(finished(taken.clone(), 0, "out", now), Some(&lease))
        .await
        .unwrap());
    assert!(done.changed().await, "a finish wakes its waiter");
    assert!(
        store.running_jobs(&sb).await.unwrap().is_empty(),
        "a finished job is not running"
    );
    assert!(
        !store
            .finish_job(finished(taken, 1, "again", now), Some(&lease))
            .await
            .unwrap(),
        "finished once"
    );
    let read = store.job(&a).await.unwrap().unwrap();
    assert_eq!(
        (read.job.status, read.job.stdout.as_str()),
        (JobStatus::Succeeded, "out")
    );
    assert_eq!(
        store
            .take_job(&sb, &lease)
            .await
            .unwrap()
            .unwrap()
            .job
            .job_id,
        b
    );
    assert!(store.take_job(&sb, &lease).await.unwrap().is_none());
    queued_jobs_end_once(store, tag, &sb, &lease).await;
    store.release_lease(&lease).await.unwrap();
}

/// The part of [`jobs_in_order_once`] on queued jobs: one read from the queue stays
/// queued and may be ended there, but once taken only its taker ends it.
async fn queued_jobs_end_once(store: &dyn StateStore, tag: &str, sb: &str, lease: &super::Lease) {
    let c = format!("{tag}-job-c");
    store.insert_job(job(&c, sb), "u1").await.unwrap();
    let queued = store.queued_jobs(sb).await.unwrap();
    assert_eq!(
        queued
            .iter()
            .map(|j| j.job.job_id.as_str())
            .collect::<Vec<_>>(),
        [c.as_str()]
    );
    assert_eq!(
        store.queued_jobs(sb).await.unwrap().len(),
        1,
        "a read leaves them queued"
    );
    let now = crate::time::now_ms();
    assert!(store
        .finish_job(finished(queued[0].clone(), 1, "", now), Some(lease))
        .await
        .unwrap());
    assert!(
        store.queued_jobs(sb).await.unwrap().is_empty(),
        "a finished job left the queue"
    );
    assert!(store.take_job(sb, lease).await.unwrap().is_none());
    // Read while queued, then taken: the read copy no longer ends it.
    let d = format!("{tag}-job-d");
    store.insert_job(job(&d, sb), "u1").await.unwrap();
    let read = store.queued_jobs(sb).await.unwrap().remove(0);
    let taken = store.take_job(sb, lease).await.unwrap().unwrap();
    assert!(
        !store
            .finish_job(finished(read, 1, "", now), Some(lease))
            .await
            .unwrap(),
        "a job taken since it was read from the queue is its taker's to end"
    );
    assert_eq!(
        store.job(&d).await.unwrap().unwrap().job.status,
        JobStatus::Running
    );
    assert!(store
        .finish_job(finished(taken, 0, "d", now), Some(lease))
        .await
        .unwrap());
}

/// Regression (the chaos test's jobs `queued` for good): a worker ending the queued
/// jobs of a deleted sandbox took them all out of the queue in one step, then wrote
/// each failed; its replica killed in between left the rest `queued` in no queue, where
/// no worker would ever look. Now each leaves the queue as it is written: what a worker
/// did not end stays queued, and the sandbox unattended, for the next one.
pub async fn regression_a_worker_stopped_while_ending_a_deleted_sandboxs_jobs_leaves_the_rest_queued(
    store: &dyn StateStore,
    tag: &str,
) {
    let sb = format!("{tag}-halfway");
    store.insert_sandbox(record(&sb, "u1")).await.unwrap();
    let ids: Vec<String> = (0..3).map(|n| format!("{tag}-job-halfway-{n}")).collect();
    for id in &ids {
        store.insert_job(job(id, &sb), "u1").await.unwrap();
    }
    store.remove_sandbox(&sb, "u1").await.unwrap();
    let name = format!("sandbox/{sb}");
    let lease = store
        .acquire_lease(&name, "first", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let queued = store.queued_jobs(&sb).await.unwrap();
    assert_eq!(queued.len(), 3);
    let now = crate::time::now_ms();
    let mut first = queued[0].clone();
    first.job.error = Some("the sandbox was deleted".into());
    assert!(store
        .finish_job(finished(first, 1, "", now), Some(&lease))
        .await
        .unwrap());
    // The worker's replica dies here: its lease is never renewed.
    store.release_lease(&lease).await.unwrap();
    assert!(
        store
            .unattended_sandboxes("sandbox/")
            .await
            .unwrap()
            .contains(&sb),
        "the jobs left need a worker"
    );
    let next = store
        .acquire_lease(&name, "next", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let left = store.queued_jobs(&sb).await.unwrap();
    assert_eq!(
        left.iter()
            .map(|j| j.job.job_id.as_str())
            .collect::<Vec<_>>(),
        [ids[1].as_str(), ids[2].as_str()]
    );
    for j in left {
        assert!(store
            .finish_job(finished(j, 1, "", now), Some(&next))
            .await
            .unwrap());
    }
    for id in &ids {
        assert_eq!(
            store.job(id).await.unwrap().unwrap().job.status,
            JobStatus::Failed
        );
    }
    store.release_lease(&next).await.unwrap();
    assert!(
        !store
            .unattended_sandboxes("sandbox/")
            .await
            .unwrap()
            .contains(&sb),
        "nothing left to attend to"
    );
}

/// A newer grant of a lease fences off the old holder's job writes.
pub async fn fencing(store: &dyn StateStore, tag: &str) {
    let sb = format!("{tag}-fence");
    let name = format!("sandbox/{sb}");
    store.insert_sandbox(record(&sb, "u1")).await.unwrap();
    let old = store
        .acquire_lease(&name, "a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    // Expired at once: another holder takes it, with a larger fence.
    let new = until_granted(store, &name, "b").await;
    assert!(new.fence > old.fence);
    assert!(store
        .acquire_lease(&name, "c", Duration::from_secs(30))
        .await
        .unwrap()
        .is_none());
    let again = store
        .acquire_lease(&name, "b", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.fence, new.fence,
        "a renewal by the holder keeps its fence"
    );
    assert!(!store
        .renew_lease(&old, Duration::from_secs(30))
        .await
        .unwrap());
    assert!(store
        .renew_lease(&new, Duration::from_secs(30))
        .await
        .unwrap());
    let id = format!("{tag}-fenced-job");
    store.insert_job(job(&id, &sb), "u1").await.unwrap();
    assert!(matches!(
        store.take_job(&sb, &old).await,
        Err(StoreError::Conflict(_))
    ));
    let taken = store.take_job(&sb, &new).await.unwrap().unwrap();
    let now = crate::time::now_ms();
    assert!(matches!(
        store
            .finish_job(finished(taken.clone(), 0, "", now), Some(&old))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert!(store
        .finish_job(finished(taken, 0, "", now), Some(&new))
        .await
        .unwrap());
    // Released: someone else gets it at once.
    store.release_lease(&old).await.unwrap();
    assert!(
        store
            .acquire_lease(&name, "c", Duration::from_secs(30))
            .await
            .unwrap()
            .is_none(),
        "a stale holder's release does not free the lease"
    );
    store.release_lease(&new).await.unwrap();
    assert!(store
        .acquire_lease(&name, "c", Duration::from_secs(30))
        .await
        .unwrap()
        .is_some());
}

/// Acquires `name` for `holder`, retrying while its previous grant's expiry (already
/// due) has not been applied yet.
async fn until_granted(store: &dyn StateStore, name: &str, holder: &str) -> super::Lease {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(l) = store
            .acquire_lease(name, holder, Duration::from_secs(30))
            .await
            .unwrap()
        {
            return l;
        }
        assert!(Instant::now() < deadline, "an expired lease stayed held");
        tokio::task::yield_now().await;
    }
}

/// A job is refused for a deleted sandbox or another incarnation, in the insert's step.
pub async fn no_job_behind_a_delete(store: &dyn StateStore, tag: &str) {
    let sb = format!("{tag}-gone");
    store.insert_sandbox(record(&sb, "u1")).await.unwrap();
    let old = format!("{tag}-job-old");
    assert!(matches!(
        store.insert_job(job(&old, &sb), "u0").await,
        Err(StoreError::NotFound(_))
    ));
    let mut queue = store.subscribe(Topic::Queue(sb.clone()));
    store.remove_sandbox(&sb, "u1").await.unwrap();
    assert!(queue.changed().await, "a removal wakes the queue's worker");
    let late = format!("{tag}-job-late");
    assert!(matches!(
        store.insert_job(job(&late, &sb), "u1").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(store.job(&late).await.unwrap().is_none());
    assert!(store.queued_jobs(&sb).await.unwrap().is_empty());
}

/// A sandbox with queued or running jobs and no holder of its worker lease is
/// unattended; an idle or leased one is not; a deleted one with a job left still is.
pub async fn unattended(store: &dyn StateStore, tag: &str) {
    let sb = format!("{tag}-lone");
    let listed = || async {
        store
            .unattended_sandboxes("sandbox/")
            .await
            .unwrap()
            .contains(&sb)
    };
    store.insert_sandbox(record(&sb, "u1")).await.unwrap();
    assert!(!listed().await, "an idle sandbox needs no worker");
    let j = format!("{tag}-job-lone");
    store.insert_job(job(&j, &sb), "u1").await.unwrap();
    assert!(listed().await, "a queued job and no worker");
    let lease = store
        .acquire_lease(&format!("sandbox/{sb}"), "w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(!listed().await, "its worker holds the lease");
    let taken = store.take_job(&sb, &lease).await.unwrap().unwrap();
    store.release_lease(&lease).await.unwrap();
    assert!(listed().await, "a running job whose worker is gone");
    store.remove_sandbox(&sb, "u1").await.unwrap();
    assert!(listed().await, "deleted, with a job still to end");
    let now = crate::time::now_ms();
    assert!(store
        .finish_job(finished(taken, 0, "x", now), None)
        .await
        .unwrap());
    assert!(!listed().await, "nothing left to attend to");
}

/// Counters stop at their limit; rate windows at theirs.
pub async fn slots_and_rates(store: &dyn StateStore, tag: &str) {
    let c = format!("{tag}-slots");
    assert!(store.acquire_slot(&c, 2).await.unwrap());
    assert!(store.acquire_slot(&c, 2).await.unwrap());
    assert!(!store.acquire_slot(&c, 2).await.unwrap());
    store.release_slot(&c).await.unwrap();
    assert!(store.acquire_slot(&c, 2).await.unwrap());
    assert!(store.acquire_slot(&c, 0).await.unwrap(), "0 is no limit");
    for _ in 0..3 {
        store.release_slot(&c).await.unwrap();
    }
    store.release_slot(&c).await.unwrap();
    assert!(store.acquire_slot(&c, 1).await.unwrap(), "not below 0");
    let r = format!("{tag}-rate");
    let minute = Duration::from_secs(60);
    assert!(store.hit_rate(&r, minute, 2).await.unwrap());
    assert!(store.hit_rate(&r, minute, 2).await.unwrap());
    assert!(!store.hit_rate(&r, minute, 2).await.unwrap());
    assert!(
        store.hit_rate(&r, Duration::ZERO, 2).await.unwrap(),
        "an empty window admits"
    );
}

/// The purge removes the jobs that finished before its time, and only those.
pub async fn purge(store: &dyn StateStore, tag: &str) {
    let sb = format!("{tag}-purge");
    store.insert_sandbox(record(&sb, "u1")).await.unwrap();
    let (old, new) = (format!("{tag}-job-1"), format!("{tag}-job-2"));
    for id in [&old, &new] {
        store.insert_job(job(id, &sb), "u1").await.unwrap();
    }
    // Far in the past and far in the future: other checks' jobs are in between.
    store
        .finish_job(finished(job(&old, &sb), 0, "", 1000), None)
        .await
        .unwrap();
    store
        .finish_job(finished(job(&new, &sb), 0, "", u64::MAX / 4), None)
        .await
        .unwrap();
    assert!(store.purge_jobs(2000).await.unwrap() >= 1);
    assert!(store.job(&old).await.unwrap().is_none());
    assert!(store.job(&new).await.unwrap().is_some());
}

/// The list and the phase counts see every record.
pub async fn listing(store: &dyn StateStore, tag: &str) {
    let before = store.phase_counts().await.unwrap();
    let (a, b) = (format!("{tag}-list-a"), format!("{tag}-list-b"));
    store.insert_sandbox(record(&a, "u1")).await.unwrap();
    let mut ready = record(&b, "u1");
    ready.phase = Phase::Ready;
    store.insert_sandbox(ready).await.unwrap();
    let all = store.sandboxes().await.unwrap();
    for id in [&a, &b] {
        assert!(all.iter().any(|r| &r.value.id == id), "{id} listed");
    }
    let after = store.phase_counts().await.unwrap();
    let n = |m: &std::collections::BTreeMap<&str, u64>, k| m.get(k).copied().unwrap_or(0);
    assert_eq!(n(&after, "pending"), n(&before, "pending") + 1);
    assert_eq!(n(&after, "running"), n(&before, "running") + 1);
    for id in [&a, &b] {
        store.remove_sandbox(id, "u1").await.unwrap();
    }
}
