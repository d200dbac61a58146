//! `bench_server`: what the HTTP server costs on top of the agent, all measured in one
//! run so noise hits every series alike.
//!
//! Latency: exec `true` straight to the sandbox's agent (the floor), through the proxied
//! `POST /v1/sandboxes/{id}/exec`, and through the compatible
//! `POST /sandboxes/{id}/exec` with `wait=true` (which runs `sh -c true` as a job, so
//! the agent's `sh -c true` is measured too), interleaved call by call, keep-alive
//! clients, a warm-up first. `GET /health` back to back gives the HTTP hop alone.
//!
//! Throughput: 64 sandboxes, 64 concurrent clients (one per sandbox) each looping exec
//! `true` for a few seconds, directly, through `/v1` and through the compatible route.
//!
//! Writes a Markdown table to `ORCHARD_BENCH_OUT` (default
//! `bench/results/server.md`) and the numbers next to it as `server.json`, the
//! baseline of the next run's "prev" column. Nothing about times is asserted.

use std::fmt::Write as _;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchard::service::Policy;
use orchard_client::{AgentClient, Endpoint};
use orchard_protocol::{Command, ExecRequest};
use serde_json::{json, Value};

use crate::util::bench::{change, out_path, pcts, post_json, Pcts};
use crate::util::server::{Options, TestServer};

/// Rounds of the latency series: one call of each route per round, in an order that
/// rotates, so a burst of outside load hits every series alike.
const ROUNDS: usize = 600;
/// Warm-up calls per series.
const WARMUP: usize = 50;
/// Sandboxes (and concurrent clients) of the throughput runs.
const CLIENTS: usize = 64;
/// The p50 target of both server routes, as a multiple of the direct agent's.
const TARGET: f64 = 2.0;

/// One way to run `true`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    /// `GET /health` (no exec): the HTTP hop alone.
    Health,
    /// The agent's `POST /v1/exec` of `["true"]`, straight to its socket.
    Direct,
    /// The agent's `POST /v1/exec` of `["sh", "-c", "true"]` (what a compatible job runs).
    DirectSh,
    /// `POST /v1/sandboxes/{id}/exec` `{"command": ["true"]}`.
    V1,
    /// `POST /sandboxes/{id}/exec` `{"command": "true", "wait": true}`.
    Compat,
}

impl Route {
    fn key(self) -> &'static str {
        match self {
            Route::Health => "health",
            Route::Direct => "direct",
            Route::DirectSh => "direct_sh",
            Route::V1 => "v1",
            Route::Compat => "compat",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Route::Health => "HTTP floor: `GET /health` on the server, back to back (no exec)",
            Route::Direct => "direct agent: exec `true` on its socket (floor)",
            Route::DirectSh => "direct agent: exec `sh -c true` (what a compat job runs)",
            Route::V1 => "`POST /v1/sandboxes/{id}/exec` `[\"true\"]`",
            Route::Compat => "`POST /sandboxes/{id}/exec` `\"true\"`, `wait=true`",
        }
    }
}

/// A client of one sandbox, by every route.
struct Target {
    http: reqwest::Client,
    agent: AgentClient,
    url_v1: String,
    url_compat: String,
    url_health: String,
}

fn exec_req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        command: Command::Argv(argv.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

impl Target {
    async fn new(srv: &TestServer, id: &str, http: reqwest::Client) -> Target {
        let (s, v) = srv.get(&format!("/v1/sandboxes/{id}")).await;
        assert_eq!(s, 200, "{v}");
        let agent = &v["agent"];
        let endpoint = match agent["socket"].as_str() {
            Some(p) => Endpoint::Unix(PathBuf::from(p)),
            None => Endpoint::Tcp(
                agent["url"]
                    .as_str()
                    .and_then(|u| u.strip_prefix("http://"))
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("no agent endpoint in {v}")),
            ),
        };
        let token = agent["token"].as_str().expect("agent token");
        Target {
            http,
            agent: AgentClient::new(endpoint, token),
            url_v1: format!("{}/v1/sandboxes/{id}/exec", srv.url),
            url_compat: format!("{}/sandboxes/{id}/exec", srv.url),
            url_health: format!("{}/health", srv.url),
        }
    }

    async fn post(&self, url: &str, body: &'static [u8]) -> Result<Value, String> {
        post_json(&self.http, url, body).await
    }

    /// One call by `route`; an error says what went wrong.
    async fn call(&self, route: Route) -> Result<(), String> {
        let ok = match route {
            Route::Health => {
                let resp = self
                    .http
                    .get(&self.url_health)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = resp.status();
                let _ = resp.bytes().await.map_err(|e| e.to_string())?;
                status.is_success()
            }
            Route::Direct | Route::DirectSh => {
                let argv: &[&str] = if route == Route::Direct {
                    &["true"]
                } else {
                    &["sh", "-c", "true"]
                };
                let r = self
                    .agent
                    .exec(&exec_req(argv))
                    .await
                    .map_err(|e| e.to_string())?;
                r.exit_code == Some(0)
            }
            Route::V1 => {
                let v = self.post(&self.url_v1, br#"{"command":["true"]}"#).await?;
                v["exit_code"] == 0
            }
            Route::Compat => {
                let v = self
                    .post(&self.url_compat, br#"{"command":"true","wait":true}"#)
                    .await?;
                v["status"] == "succeeded"
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!("{route:?}: `true` did not succeed"))
        }
    }
}

/// One throughput measurement: calls done and errors over the wall time.
#[derive(Default, Clone)]
struct Throughput {
    calls: u64,
    errors: u64,
    secs: f64,
    first_error: Option<String>,
}

impl Throughput {
    fn per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.calls as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// Every client loops `route` on its own sandbox until `dur` has passed.
async fn throughput(targets: &[Arc<Target>], route: Route, dur: Duration) -> Throughput {
    let started = Instant::now();
    let deadline = started + dur;
    let tasks: Vec<_> = targets
        .iter()
        .map(|t| {
            let t = t.clone();
            tokio::spawn(async move {
                let (mut calls, mut errors, mut first) = (0u64, 0u64, None);
                while Instant::now() < deadline {
                    match t.call(route).await {
                        Ok(()) => calls += 1,
                        Err(e) => {
                            errors += 1;
                            first.get_or_insert(e);
                        }
                    }
                }
                (calls, errors, first)
            })
        })
        .collect();
    let mut out = Throughput::default();
    for task in tasks {
        let (c, e, f) = task.await.expect("a throughput client");
        out.calls += c;
        out.errors += e;
        if out.first_error.is_none() {
            out.first_error = f;
        }
    }
    out.secs = started.elapsed().as_secs_f64();
    out
}

/// Sends this process's stderr (the server's JSON request log, one line per request)
/// to a file while the benchmark runs, as `orchard serve 2>>server.log` would; restored
/// on drop, when the end of the log is shown if the benchmark failed.
struct StderrToFile {
    saved: i32,
    path: PathBuf,
}

impl StderrToFile {
    fn new(path: &Path) -> StderrToFile {
        let file = std::fs::File::create(path).expect("creating the server log");
        // SAFETY: plain descriptor duplication of our own stderr and a file we own.
        let saved = unsafe { libc::dup(2) };
        assert!(saved >= 0, "dup(2) failed");
        assert!(
            // SAFETY: as above.
            unsafe { libc::dup2(file.as_raw_fd(), 2) } >= 0,
            "dup2 failed"
        );
        StderrToFile {
            saved,
            path: path.to_path_buf(),
        }
    }
}

impl Drop for StderrToFile {
    fn drop(&mut self) {
        // SAFETY: restores the descriptor saved in `new`.
        unsafe {
            libc::dup2(self.saved, 2);
            libc::close(self.saved);
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- the end of {} ---", self.path.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

fn prev_cell(prev: Option<f64>, decimals: usize) -> String {
    prev.map_or("–".into(), |p| format!("{p:.decimals$}"))
}

/// `make bench` runs it (release build, table in bench/results/server.md); by hand:
/// `cargo test --release -p orchard --test integration bench_server -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by make bench"]
async fn bench_server() {
    orchard_test_support::require_runc!();
    let secs: f64 = std::env::var("ORCHARD_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5.0);
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("server.log");
    let quiet = StderrToFile::new(&log_path);
    // The production policy loop (once a second), not the tests' fast one.
    let srv = TestServer::with(Options {
        policy: Policy {
            ready_timeout: Duration::from_secs(120),
            ..Policy::default()
        },
        ..Options::default()
    })
    .await;
    // The fixture quiets the request log; `orchard serve` writes it (level `info`), so
    // its cost is part of what is measured (`ORCHARD_BENCH_LOG=warn` leaves it out).
    let log_level = std::env::var("ORCHARD_BENCH_LOG").unwrap_or_else(|_| "info".into());
    orchard::log::set_level(&log_level);

    // 64 sandboxes, made 16 at a time.
    let mut ids = Vec::new();
    while ids.len() < CLIENTS {
        let n = (CLIENTS - ids.len()).min(16);
        let made = futures_util::future::join_all((0..n).map(|_| srv.sandbox())).await;
        ids.extend(made);
    }
    let mut targets = Vec::new();
    for id in &ids {
        // One keep-alive HTTP client per simulated client.
        targets.push(Arc::new(
            Target::new(&srv, id, reqwest::Client::new()).await,
        ));
    }

    // Latency, on the first sandbox, interleaved rounds (the order rotates per round).
    let routes = [
        Route::Health,
        Route::Direct,
        Route::DirectSh,
        Route::V1,
        Route::Compat,
    ];
    let one = &targets[0];
    for _ in 0..WARMUP {
        for r in routes {
            one.call(r).await.expect("warm-up");
        }
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); routes.len()];
    // The HTTP hop alone, back to back: right after an exec it would also pay for the
    // exec's aftermath (reaping, wake-ups from idle), which the exec rows already do.
    for _ in 0..ROUNDS {
        let t = Instant::now();
        one.call(Route::Health).await.expect("a health call");
        samples[0].push(t.elapsed().as_secs_f64() * 1e6);
    }
    for round in 0..ROUNDS {
        // The exec routes (all but `Health`, first), one call each, rotating.
        let execs = routes.len() - 1;
        for k in 0..execs {
            let i = 1 + (k + round) % execs;
            let t = Instant::now();
            one.call(routes[i]).await.expect("a latency call");
            samples[i].push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let lat: Vec<Pcts> = samples.iter().map(|s| pcts(s)).collect();
    let at = |r: Route| lat[routes.iter().position(|x| *x == r).unwrap()];

    // Throughput: every client warms its connection, then two interleaved passes over
    // the three routes, half the time each.
    let tput_routes = [Route::Direct, Route::V1, Route::Compat];
    for r in tput_routes {
        let _ = throughput(&targets, r, Duration::from_millis(200)).await;
    }
    let mut tput = vec![Throughput::default(); tput_routes.len()];
    for _pass in 0..2 {
        for (i, r) in tput_routes.iter().enumerate() {
            let t = throughput(&targets, *r, Duration::from_secs_f64(secs / 2.0)).await;
            let acc = &mut tput[i];
            acc.calls += t.calls;
            acc.errors += t.errors;
            acc.secs += t.secs;
            if acc.first_error.is_none() {
                acc.first_error = t.first_error;
            }
        }
    }
    drop(targets);
    srv.finish().await;
    let log_bytes = std::fs::metadata(&log_path).map_or(0, |m| m.len());
    drop(quiet);

    // The numbers, and the previous run's.
    let out = out_path("server.md");
    let json_path = out.with_extension("json");
    let prev: Value = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let prevv = |k: &str| prev.get(k).and_then(Value::as_f64);
    let mut now = serde_json::Map::new();
    for r in routes {
        let p = at(r);
        now.insert(format!("{}_p50_us", r.key()), json!(p.p50));
        now.insert(format!("{}_p90_us", r.key()), json!(p.p90));
        now.insert(format!("{}_p99_us", r.key()), json!(p.p99));
    }
    for (i, r) in tput_routes.iter().enumerate() {
        now.insert(format!("tput_{}_per_s", r.key()), json!(tput[i].per_s()));
    }
    now.insert("samples".into(), json!(ROUNDS));
    now.insert("clients".into(), json!(CLIENTS));
    now.insert("seconds".into(), json!(secs));

    let direct = at(Route::Direct).p50;
    let mut md = String::new();
    let _ = writeln!(md, "# orchard serve benchmark\n");
    let _ = writeln!(
        md,
        "In-process server over the local backend, busybox sandboxes, keep-alive clients. \
         Latency: {ROUNDS} calls per series on one sandbox, the exec routes interleaved \
         call by call (the order rotates every round) after {WARMUP} warm-up calls each; the server's log \
         (level `{log_level}`) goes to a file ({:.1} MiB this run). Ratios are against the \
         direct agent in this run; `prev` is the previous run's value.\n",
        log_bytes as f64 / (1 << 20) as f64,
    );
    let _ = writeln!(
        md,
        "| measure | p50 µs | p90 µs | p99 µs | vs direct (p50) | target | prev p50 µs | change |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for r in routes {
        let p = at(r);
        let ratio = p.p50 / direct;
        let target = match r {
            Route::V1 | Route::Compat => {
                let mark = if ratio <= TARGET { "✓" } else { "✗" };
                format!("≤ {TARGET:.0}x {mark}")
            }
            _ => String::new(),
        };
        let key = format!("{}_p50_us", r.key());
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | {:.0} | {ratio:.2}x | {target} | {} | {} |",
            r.label(),
            p.p50,
            p.p90,
            p.p99,
            prev_cell(prevv(&key), 0),
            change(p.p50, prevv(&key)),
        );
    }
    let _ = writeln!(
        md,
        "\nThroughput: {CLIENTS} sandboxes, {CLIENTS} concurrent clients (one per sandbox) \
         each looping exec `true` for {secs:.1} s per route (two interleaved passes).\n"
    );
    let _ = writeln!(
        md,
        "| measure | execs/s | vs direct | errors | prev execs/s | change |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let direct_tput = tput[0].per_s();
    for (i, r) in tput_routes.iter().enumerate() {
        let t = &tput[i];
        let key = format!("tput_{}_per_s", r.key());
        let name = match r {
            Route::Direct => "direct agent (floor)",
            Route::V1 => "`/v1/sandboxes/{id}/exec`",
            _ => "compatible `/sandboxes/{id}/exec`, `wait=true`",
        };
        let _ = writeln!(
            md,
            "| {name} | {:.0} | {:.2}x | {} | {} | {} |",
            t.per_s(),
            t.per_s() / direct_tput,
            t.errors,
            prev_cell(prevv(&key), 0),
            change(t.per_s(), prevv(&key)),
        );
    }
    for (i, r) in tput_routes.iter().enumerate() {
        if let Some(e) = &tput[i].first_error {
            let _ = writeln!(md, "\n- first {r:?} error: {e}");
        }
    }
    println!("{md}");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).expect("creating the results directory");
    }
    std::fs::write(&out, &md).expect("writing the benchmark table");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&Value::Object(now)).unwrap() + "\n",
    )
    .expect("writing the benchmark numbers");
    println!("wrote {} and {}", out.display(), json_path.display());
}
