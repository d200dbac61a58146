//! The in-memory store's tests: the conformance checks, and what only this store does
//! (the journal across restarts, the output budget, spilled output).

use std::io::Write;
use std::path::Path;

use orchard_protocol::compat::CompatCommand;

use super::journal::JOURNAL_SLACK_BYTES;
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
    let mut r = crate::state::conformance::record("sb-1", "u1");
    r.labels.clear();
    r
}

fn job(id: &str, command: &str) -> JobRecord {
    let mut j = crate::state::conformance::job(id, "sb-1");
    j.job.command = CompatCommand::Shell(command.into());
    j
}

fn finished(j: JobRecord, exit: i32, stdout: &str) -> JobRecord {
    crate::state::conformance::finished(j, exit, stdout, crate::time::now_ms())
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
    crate::state::conformance::all(&store, "mem").await;
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
    let size = std::fs::metadata(journal::path(dir.path())).unwrap().len();
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
    let journal = std::fs::metadata(journal::path(dir.path())).unwrap().len();
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
