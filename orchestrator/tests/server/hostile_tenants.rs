//! One tenant against another on the real server (issue 30, points 4, 5 and 10): A's
//! output does not evict B's, A's burst of creates does not queue B's behind it, and
//! A's reads of a big job leave B's exec at its quiet median (the long version, with
//! every abuse and p99s, is `bench_hostile.rs` under `make bench`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::bench::pcts;
use crate::util::server::{busybox_server, exec_waited, sandbox, send, KEY, OTHER_KEY};

/// Runs `command` in `id` as `key`, waited; answers the job.
async fn run(http: &reqwest::Client, url: &str, key: &str, id: &str, command: &str) -> Value {
    let (s, job) = exec_waited(http, url, key, id, command).await;
    assert_eq!(s, 200, "{job}");
    assert_eq!(job["status"].as_str(), Some("succeeded"), "{job}");
    job
}

async fn job(http: &reqwest::Client, url: &str, key: &str, id: &str) -> Value {
    let (s, job) = send(
        http.get(format!("{url}/jobs/{id}"))
            .header("X-API-Key", key),
    )
    .await;
    assert_eq!(s, 200, "{job}");
    job
}

/// The output budget is shared, but the tenant holding the most pays: A's jobs past it
/// empty A's oldest output, never B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_one_tenants_output_never_evicts_anothers() {
    orchard_test_support::require_runc!();
    let budget = (4u64 << 20).to_string();
    let (_data, srv) =
        busybox_server("orchard-evict-", &["--job-output-budget-bytes", &budget]).await;
    let http = reqwest::Client::new();
    sandbox(&http, &srv.url, KEY, "ev-a").await;
    sandbox(&http, &srv.url, OTHER_KEY, "ev-b").await;
    let b = run(
        &http,
        &srv.url,
        OTHER_KEY,
        "ev-b",
        "head -c 524288 /dev/zero | tr '\\0' b",
    )
    .await;
    let b_id = b["job_id"].as_str().unwrap().to_string();
    let mut a_ids = Vec::new();
    for _ in 0..8 {
        let a = run(
            &http,
            &srv.url,
            KEY,
            "ev-a",
            "head -c 1048576 /dev/zero | tr '\\0' a",
        )
        .await;
        a_ids.push(a["job_id"].as_str().unwrap().to_string());
    }
    // A's 8 MiB passed the 4 MiB budget: A's oldest output went.
    let first_a = job(&http, &srv.url, KEY, &a_ids[0]).await;
    assert_eq!(
        first_a["output_truncated"], true,
        "A's oldest output stayed"
    );
    assert!(first_a["stdout"].as_str().unwrap().len() < 1 << 20);
    let b = job(&http, &srv.url, OTHER_KEY, &b_id).await;
    assert_eq!(b["output_truncated"], false, "B's output was evicted");
    let out = b["stdout"].as_str().unwrap();
    assert_eq!(out.len(), 524_288);
    assert!(out.bytes().all(|c| c == b'b'));
}

/// Create slots go to the keys in turn: with one slot, B's single create waits for at
/// most one of A's, not for A's whole burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_burst_of_creates_does_not_queue_another_tenants_create_behind_it() {
    orchard_test_support::require_runc!();
    let (_data, srv) = busybox_server("orchard-fair-", &["--max-concurrent-creates", "1"]).await;
    let http = reqwest::Client::new();
    let create = |key: &'static str| {
        let req = http
            .post(format!("{}/sandboxes", srv.url))
            .header("X-API-Key", key)
            .json(&json!({"image": "busybox:latest"}));
        async move {
            let (s, v) = send(req).await;
            assert_eq!(s, 200, "{v}");
            v["sandbox_id"].as_str().unwrap().to_string()
        }
    };
    let mut a_ids = Vec::new();
    for _ in 0..10 {
        a_ids.push(create(KEY).await);
    }
    let b_id = create(OTHER_KEY).await;
    let status = |key: &'static str, id: String| {
        let req = http
            .get(format!("{}/sandboxes/{id}", srv.url))
            .header("X-API-Key", key);
        async move {
            send(req).await.1["status"]
                .as_str()
                .unwrap_or("")
                .to_string()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = status(OTHER_KEY, b_id.clone()).await;
        if s != "pending" {
            assert_eq!(s, "ready", "B's create failed");
            break;
        }
        assert!(Instant::now() < deadline, "B's create never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut a_pending = 0;
    for id in &a_ids {
        if status(KEY, id.clone()).await == "pending" {
            a_pending += 1;
        }
    }
    // In turn: one of A's ran before B's (holding the slot), maybe a second one; FIFO
    // would have made B's wait for all ten.
    assert!(
        a_pending >= 6,
        "only {a_pending} of A's 10 creates were still waiting when B's finished"
    );
}

/// B's exec median while A reads a big job over and over stays near its quiet median:
/// the body is made on the bulk thread, chunk by chunk, from the output's file, A's
/// reads taking turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_big_job_reads_leave_another_tenants_exec_at_its_quiet_median() {
    orchard_test_support::require_runc!();
    let (_data, srv) = busybox_server("orchard-reads-", &[]).await;
    let http = reqwest::Client::new();
    sandbox(&http, &srv.url, KEY, "rd-a").await;
    sandbox(&http, &srv.url, OTHER_KEY, "rd-b").await;
    // 2 x 4 MiB of control bytes: 48 MiB as JSON.
    let big = run(
        &http,
        &srv.url,
        KEY,
        "rd-a",
        "head -c 4194304 /dev/zero | tr '\\0' '\\1'; head -c 4194304 /dev/zero | tr '\\0' '\\1' >&2",
    )
    .await;
    let big = big["job_id"].as_str().unwrap().to_string();
    // B's calls: at least 60, and until `enough` says A has read enough meanwhile.
    let b_exec = |http: reqwest::Client, url: String, enough: Box<dyn Fn() -> bool + Send>| async move {
        let mut ms = Vec::new();
        let start = Instant::now();
        while ms.len() < 60 || (!enough() && start.elapsed() < Duration::from_secs(120)) {
            let t = Instant::now();
            run(&http, &url, OTHER_KEY, "rd-b", "true").await;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        pcts(&ms)
    };
    let quiet = b_exec(http.clone(), srv.url.clone(), Box::new(|| true)).await;
    let stop = Arc::new(AtomicBool::new(false));
    // Bytes A received while B was measured: A's reads take turns and run at low
    // priority, so B calls until A has read one whole body's worth.
    let got = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, got, url, big) = (stop.clone(), got.clone(), srv.url.clone(), big.clone());
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                while !stop.load(Ordering::Relaxed) {
                    let mut r = http
                        .get(format!("{url}/jobs/{big}"))
                        .header("X-API-Key", KEY)
                        .send()
                        .await
                        .unwrap();
                    while let Some(piece) = r.chunk().await.unwrap() {
                        got.fetch_add(piece.len() as u64, Ordering::Relaxed);
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    let seen = got.clone();
    let loaded = b_exec(
        http.clone(),
        srv.url.clone(),
        Box::new(move || seen.load(Ordering::Relaxed) >= 48 << 20),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let read = got.load(Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
    assert!(
        read >= 16 << 20,
        "A read only {read} bytes during B's calls"
    );
    // Medians, against the quiet one of the same run: a stall of the request thread
    // per read (a copy of the output, a whole body built at once) shows in half of B's
    // calls, a scheduling hiccup does not.
    assert!(
        loaded.p50 <= 5.0 * quiet.p50,
        "B's exec median {:.2} ms under A's reads, {:.2} ms quiet",
        loaded.p50,
        quiet.p50
    );
}
