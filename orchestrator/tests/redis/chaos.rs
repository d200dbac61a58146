//! Chaos: three `orchard serve` replicas over one Redis and one data directory; while
//! clients run 1,000 mixed operations (create, exec as a job, delete) through whichever
//! replica is up, a random replica is killed with SIGKILL every 83 answered operations and
//! started again, and halfway Redis crashes (SIGKILL) and restarts from its append-only
//! file once the replicas answered 503 for a while. Then the audit: the store and the backend agree sandbox for
//! sandbox, no sandbox was deleted twice, and every job either delivered its real
//! output or ended `failed` with a reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{import_busybox, req, RedisServer};
use crate::util::server::{reap_orphaned_agents, send, ServerProcess};

const OPS: usize = 1000;
const CLIENTS: usize = 6;
const REPLICAS: usize = 3;
/// Answered operations between two kills.
const KILL_STEP: usize = OPS / 12;

/// A request that may fail (its replica was just killed): `None` then.
async fn try_send(r: reqwest::RequestBuilder) -> Option<(u16, Value)> {
    let resp = r.send().await.ok()?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.ok()?;
    Some((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// A small deterministic generator (no dependency for a test's dice).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// What the clients saw.
#[derive(Default)]
struct Seen {
    /// Sandboxes a create answered 201 for.
    created: BTreeSet<String>,
    /// Deletes answered 200, per sandbox.
    deleted: BTreeMap<String, usize>,
    /// Jobs accepted, with the word their command echoes.
    jobs: BTreeMap<String, String>,
    /// Operations that got an answer (any status).
    answered: usize,
    /// Answers 503 (Redis away).
    unavailable: usize,
}

fn args(redis_url: &str) -> Vec<String> {
    [
        "--state",
        redis_url,
        "--worker-lease-s",
        "2",
        "--ready-timeout-s",
        "60",
        // What a kill leaves between the store and the backend (a delete cut after the
        // record went, a create adopted by a restarted replica after its record was
        // deleted) is the reconciliation's to remove: often, so the run settles soon.
        "--reconcile-interval-s",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn start(data: &Path, args: &[String]) -> ServerProcess {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerProcess::start(data, &a)
}

/// One client: `ops` operations through random live replicas.
async fn client(seed: u64, ops: usize, urls: Arc<Mutex<Vec<String>>>, seen: Arc<Mutex<Seen>>) {
    let mut dice = Dice(seed);
    let mut mine: Vec<String> = Vec::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for n in 0..ops {
        let url = {
            let u = urls.lock().unwrap();
            u[dice.below(u.len())].clone()
        };
        let key = |r: reqwest::RequestBuilder| r.header("X-API-Key", crate::util::server::KEY);
        let roll = dice.below(10);
        let answer = if mine.is_empty() || roll < 2 {
            let r = try_send(
                key(http.post(format!("{url}/v1/sandboxes")))
                    .json(&json!({"image": "busybox:latest"})),
            )
            .await;
            if let Some((201, sb)) = &r {
                let id = sb["id"].as_str().unwrap().to_string();
                seen.lock().unwrap().created.insert(id.clone());
                mine.push(id);
            }
            r
        } else if roll < 3 && mine.len() > 1 {
            let id = mine.swap_remove(dice.below(mine.len()));
            let r = try_send(key(http.delete(format!("{url}/sandboxes/{id}")))).await;
            match &r {
                Some((200, _)) => *seen.lock().unwrap().deleted.entry(id).or_default() += 1,
                // Not known to have gone: it may still be there; keep using it.
                Some((404, _)) => {}
                _ => mine.push(id),
            }
            r
        } else {
            let id = &mine[dice.below(mine.len())];
            let word = format!("w{seed}x{n}");
            let r = try_send(
                key(http.post(format!("{url}/sandboxes/{id}/exec")))
                    .json(&json!({"command": format!("echo {word}")})),
            )
            .await;
            if let Some((200, job)) = &r {
                if let Some(j) = job["job_id"].as_str() {
                    seen.lock().unwrap().jobs.insert(j.to_string(), word);
                }
            }
            r
        };
        if let Some((status, _)) = answer {
            let mut seen = seen.lock().unwrap();
            seen.answered += 1;
            seen.unavailable += usize::from(status == 503);
        }
    }
}

/// In `make test`; `make chaos` runs it alone, with its numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_replicas_during_a_thousand_operations_loses_and_doubles_nothing() {
    orchard_test_support::require_runc!();
    // With its append-only file: the crash in the middle of the run loses nothing.
    let mut redis = RedisServer::start_with(true);
    let args = args(&redis.url());
    let data = tempfile::tempdir().unwrap();
    let mut servers: Vec<ServerProcess> =
        (0..REPLICAS).map(|_| start(data.path(), &args)).collect();
    import_busybox(&servers[0].url).await;

    let urls = Arc::new(Mutex::new(
        servers.iter().map(|s| s.url.clone()).collect::<Vec<_>>(),
    ));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(client(
                0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1),
                OPS / CLIENTS,
                urls.clone(),
                seen.clone(),
            ))
        })
        .collect();
    let all_done = futures_util::future::join_all(clients);
    tokio::pin!(all_done);
    let mut dice = Dice(42);
    let mut kills = 0;
    let mut redis_restarted = false;
    let mut next_kill = KILL_STEP / 2;
    loop {
        tokio::select! {
            r = &mut all_done => {
                for c in r {
                    c.unwrap();
                }
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                // Kills follow the clients' progress (every KILL_STEP answered
                // operations), so each run has as many, however fast the machine.
                if seen.lock().unwrap().answered < next_kill {
                    continue;
                }
                next_kill += KILL_STEP;
                if kills == 2 && !redis_restarted {
                    // Redis crashes halfway: the replicas answer 503 until it is back.
                    redis_restarted = true;
                    let before = seen.lock().unwrap().unavailable;
                    redis.down();
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while seen.lock().unwrap().unavailable < before + 10
                        && Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    redis.up();
                    continue;
                }
                let i = dice.below(REPLICAS);
                servers[i].kill9();
                kills += 1;
                let restarted = start(data.path(), &args);
                urls.lock().unwrap()[i] = restarted.url.clone();
                servers[i] = restarted;
            }
        }
    }
    assert!(kills >= 3, "only {kills} kills: the run was too short");
    let url = servers[0].url.clone();

    // Settle: no record pending, no job queued or running, and the store and the
    // backend in agreement (the reconciliation removes what a kill left), within 90 s.
    let deadline = Instant::now() + Duration::from_secs(90);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let (records, jobs, running, no_sandbox, no_record) = loop {
        let (s, list) = send(req(reqwest::Method::GET, &url, "/v1/sandboxes")).await;
        assert_eq!(s, 200, "{list}");
        let records: BTreeMap<String, String> = list
            .as_array()
            .or_else(|| list["sandboxes"].as_array())
            .expect("a list")
            .iter()
            .map(|r| {
                (
                    r["id"].as_str().unwrap().to_string(),
                    r["status"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        let mut jobs = BTreeMap::new();
        for id in seen.jobs.keys() {
            let (_, j) = send(req(reqwest::Method::GET, &url, &format!("/jobs/{id}"))).await;
            jobs.insert(id.clone(), j);
        }
        let on_disk: BTreeSet<String> = std::fs::read_dir(data.path().join("backend/sandboxes"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        let running: BTreeSet<String> = records
            .iter()
            .filter(|(_, s)| s.as_str() == "running")
            .map(|(id, _)| id.clone())
            .collect();
        let no_sandbox: Vec<String> = running.difference(&on_disk).cloned().collect();
        let no_record: Vec<String> = on_disk.difference(&running).cloned().collect();
        let busy = records.values().any(|s| s == "pending")
            || jobs
                .values()
                .any(|j| j["status"] == "queued" || j["status"] == "running");
        if !busy && no_sandbox.is_empty() && no_record.is_empty() {
            break (records, jobs, running, no_sandbox, no_record);
        }
        if Instant::now() >= deadline {
            assert!(
                !busy,
                "not settled: {records:?} {:?}",
                jobs.values()
                    .filter(|j| j["status"] == "queued" || j["status"] == "running")
                    .collect::<Vec<_>>()
            );
            break (records, jobs, running, no_sandbox, no_record);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // The audit.
    assert!(
        seen.answered >= OPS / 2,
        "only {} of {OPS} operations answered",
        seen.answered
    );
    for (id, n) in &seen.deleted {
        assert_eq!(*n, 1, "{id} deleted {n} times");
    }
    if !no_sandbox.is_empty() || !no_record.is_empty() {
        let log = std::fs::read_to_string(data.path().join("server.log")).unwrap_or_default();
        let about: Vec<&str> = log
            .lines()
            .filter(|l| {
                no_sandbox
                    .iter()
                    .chain(&no_record)
                    .any(|id| l.contains(id.as_str()))
            })
            .collect();
        panic!(
            "records running without a sandbox: {no_sandbox:?}; sandboxes without a running \
             record: {no_record:?}; the log about them:\n{}",
            about.join("\n")
        );
    }
    for id in seen.deleted.keys() {
        assert!(
            !records.contains_key(id),
            "{id} was deleted but has a record"
        );
    }
    let (mut delivered, mut failed) = (0, 0);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (id, j) in &jobs {
        match j["status"].as_str() {
            Some("succeeded") => {
                assert_eq!(
                    j["stdout"].as_str(),
                    Some(format!("{}\n", seen.jobs[id]).as_str()),
                    "{j}"
                );
                delivered += 1;
            }
            Some("failed") => {
                assert!(
                    j["error"].as_str().is_some_and(|e| !e.is_empty()),
                    "a failed job says why: {j}"
                );
                let why: String = j["error"].as_str().unwrap_or("").chars().take(60).collect();
                *reasons.entry(why).or_default() += 1;
                failed += 1;
            }
            // Purged or unknown: never, within the retention period.
            _ => panic!("job {id}: {j}"),
        }
    }
    eprintln!(
        "chaos: {} answered ({} with 503 while Redis was away), {kills} kills, {} created, {} deleted, {delivered} jobs delivered, {failed} failed with a reason, {} sandboxes left",
        seen.answered,
        seen.unavailable,
        seen.created.len(),
        seen.deleted.len(),
        running.len()
    );
    eprintln!("chaos: why jobs failed: {reasons:#?}");
    assert!(delivered > 0);

    // Everything goes with the last replica (the others keep the shared sandboxes).
    let last = servers.pop().unwrap();
    drop(servers);
    let mut last = last;
    assert!(last.stop().success());
    let mut cleaner = ServerProcess::start(
        data.path(),
        &[
            args.iter().map(String::as_str).collect::<Vec<_>>(),
            vec!["--keep-sandboxes-on-exit", "false"],
        ]
        .concat(),
    );
    assert!(cleaner.stop().success());
    reap_orphaned_agents();
}
