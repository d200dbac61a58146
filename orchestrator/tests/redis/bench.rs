//! The replicas benchmark (`make bench`): what sharing state in Redis costs, and what
//! spreading load over replicas changes. In-process replicas over one Redis (on a Unix
//! socket) and one local backend, as in `servers.rs`:
//! - exec `true` through the compatible route (`POST /sandboxes/{id}/exec`,
//!   `wait=true`) through one replica, and round-robin over three (the sandbox's worker
//!   lives on the first: a call through another crosses Redis's pub/sub twice), next to
//!   one server on the in-memory store (the floor); interleaved call by call;
//! - a lease round trip (a renewal: one Lua script) against a Redis `PING`;
//! - creates per second, a burst through one replica and spread over three.
//!
//! Writes a Markdown table to `ORCHARD_BENCH_OUT` (default `bench/results/replicas.md`)
//! with ratios against the floors and the change from the previous run; nothing about
//! times is asserted.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use orchard::state::redis::RedisStore;
use orchard::state::StateStore;
use serde_json::json;

use super::servers::{first_replica, replica};
use super::RedisServer;
use crate::util::bench::{change, out_path, pcts, previous, Pcts};
use crate::util::server::{send, TestServer, KEY};

const EXEC_ROUNDS: usize = 300;
const WARMUP: usize = 20;
const LEASE_ROUNDS: usize = 2000;
const BURST: usize = 12;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn exec_once(http: &reqwest::Client, url: &str, id: &str) -> f64 {
    let t = Instant::now();
    let (s, job) = send(
        http.post(format!("{url}/sandboxes/{id}/exec"))
            .header("X-API-Key", KEY)
            .json(&json!({"command": "true", "wait": true})),
    )
    .await;
    let took = us(t.elapsed());
    assert_eq!(
        (s, job["status"].as_str()),
        (200, Some("succeeded")),
        "{job}"
    );
    took
}

async fn create(http: &reqwest::Client, url: &str) -> String {
    let (s, sb) = send(
        http.post(format!("{url}/v1/sandboxes"))
            .header("X-API-Key", KEY)
            .json(&json!({"image": "busybox:latest"})),
    )
    .await;
    assert_eq!(s, 201, "{sb}");
    sb["id"].as_str().unwrap().to_string()
}

async fn delete(http: &reqwest::Client, url: &str, id: &str) {
    let (s, body) = send(
        http.delete(format!("{url}/sandboxes/{id}"))
            .header("X-API-Key", KEY),
    )
    .await;
    assert_eq!(s, 200, "{body}");
}

/// Wall time of `BURST` concurrent creates spread over `urls`, then their deletes;
/// answers creates per second.
async fn burst(http: &reqwest::Client, urls: &[String]) -> f64 {
    let t = Instant::now();
    let ids =
        futures_util::future::join_all((0..BURST).map(|i| create(http, &urls[i % urls.len()])))
            .await;
    let rate = BURST as f64 / t.elapsed().as_secs_f64();
    futures_util::future::join_all(
        ids.iter()
            .enumerate()
            .map(|(i, id)| delete(http, &urls[i % urls.len()], id)),
    )
    .await;
    rate
}

/// Lease renewals against `PING`s on the same Redis, interleaved: (lease, ping) µs.
async fn lease_round_trips(redis: &RedisServer) -> (Pcts, Pcts) {
    let store = RedisStore::connect(&redis.url(), "bench").await.unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let ttl = Duration::from_secs(30);
    let lease = store
        .acquire_lease("bench", "me", ttl)
        .await
        .unwrap()
        .unwrap();
    let (mut leases, mut pings) = (Vec::new(), Vec::new());
    for i in 0..LEASE_ROUNDS + WARMUP {
        let t = Instant::now();
        assert!(store.renew_lease(&lease, ttl).await.unwrap());
        let l = us(t.elapsed());
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        let p = us(t.elapsed());
        if i >= WARMUP {
            leases.push(l);
            pings.push(p);
        }
    }
    (pcts(&leases), pcts(&pings))
}

/// `make bench` runs it; by hand:
/// `cargo test --release -p orchard --test integration bench_replicas -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by make bench"]
async fn bench_replicas() {
    orchard_test_support::require_runc!();
    let redis = RedisServer::start();
    let first = first_replica(&redis).await;
    let (b, _bs, b_task) = replica(&first, &redis).await;
    let (c, _cs, c_task) = replica(&first, &redis).await;
    let memory = TestServer::start().await;
    let urls = [first.url.clone(), b, c];
    let http = reqwest::Client::new();

    let sb = create(&http, &urls[0]).await;
    let mem_sb = create(&http, &memory.url).await;
    let (mut one, mut three, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..EXEC_ROUNDS + WARMUP {
        // The order rotates, so none always runs first.
        let mut samples = [0.0; 3];
        for k in 0..3 {
            let which = (i + k) % 3;
            samples[which] = match which {
                0 => exec_once(&http, &memory.url, &mem_sb).await,
                1 => exec_once(&http, &urls[0], &sb).await,
                _ => exec_once(&http, &urls[i % 3], &sb).await,
            };
        }
        if i >= WARMUP {
            floor.push(samples[0]);
            one.push(samples[1]);
            three.push(samples[2]);
        }
    }
    let (floor, one, three) = (pcts(&floor), pcts(&one), pcts(&three));
    let (lease, ping) = lease_round_trips(&redis).await;
    let mut rates = (Vec::new(), Vec::new());
    for _ in 0..3 {
        rates.0.push(burst(&http, &urls[..1]).await);
        rates.1.push(burst(&http, &urls).await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (rate1, rate3) = (median(&mut rates.0), median(&mut rates.1));

    let path = out_path("replicas.md");
    let prev = std::fs::read_to_string(&path).unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(md, "# Replicas over Redis\n");
    let _ = writeln!(
        md,
        "In-process replicas (each its own service, router, listener and Redis store) over \
         one `redis-server` on a Unix socket and one local backend; the floor is one server \
         on the in-memory store, measured in the same run. Exec: {EXEC_ROUNDS} calls per \
         series after {WARMUP} warm-up calls, interleaved call by call; the sandbox's job \
         worker runs on replica 1, so a call through another crosses Redis's pub/sub \
         twice (the job's queue, then its finish).\n"
    );
    let _ = writeln!(
        md,
        "| exec `true`, compatible route, `wait=true` | n | p50 µs | p90 µs | vs floor (p50) | vs 1 replica (p50) | vs previous run |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for (label, p) in [
        ("floor: one server, in-memory store", floor),
        ("1 replica, Redis", one),
        ("3 replicas round-robin, Redis", three),
    ] {
        let _ = writeln!(
            md,
            "| {label} | {} | {:.0} | {:.0} | {:.2}x | {:.2}x | {} |",
            p.n,
            p.p50,
            p.p90,
            p.p50 / floor.p50,
            p.p50 / one.p50,
            change(p.p50, previous(&prev, label, 3)),
        );
    }
    let _ = writeln!(
        md,
        "\n| round trip | n | p50 µs | p90 µs | vs `PING` (p50) | vs previous run |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for (label, p) in [
        ("floor: Redis `PING`", ping),
        ("lease renewal (one Lua script)", lease),
    ] {
        let _ = writeln!(
            md,
            "| {label} | {} | {:.0} | {:.0} | {:.2}x | {} |",
            p.n,
            p.p50,
            p.p90,
            p.p50 / ping.p50,
            change(p.p50, previous(&prev, label, 3)),
        );
    }
    let _ = writeln!(
        md,
        "\n| creates, a burst of {BURST} (`/v1`, until ready), median of 3 | creates/s | vs 1 replica | vs previous run |"
    );
    let _ = writeln!(md, "|---|---|---|---|");
    for (label, r) in [
        ("through 1 replica", rate1),
        ("spread over 3 replicas", rate3),
    ] {
        let _ = writeln!(
            md,
            "| {label} | {r:.1} | {:.2}x | {} |",
            r / rate1,
            change(r, previous(&prev, label, 2)),
        );
    }
    let _ = writeln!(
        md,
        "\nOne machine, 2 cores: the replicas share its CPUs with the backend, so three \
         replicas add no create capacity here; what the rows show is what the shared \
         state costs per call."
    );
    print!("{md}");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, md).unwrap();
    b_task.abort();
    c_task.abort();
    memory.finish().await;
    first.finish().await;
}
