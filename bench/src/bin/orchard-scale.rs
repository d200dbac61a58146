//! `orchard-scale` (`make bench-scale`): Orchard Env at scale on one machine, next to
//! the floors measured in the same run, against a real `orchard serve`:
//!
//! - create to ready through `/v1` and the compatible route (POST, then `/wait`),
//!   one at a time and 100 at once, against `runc run` of `true` from the same layers;
//! - N sandboxes (1,000) created at once: wall time, failures, host memory per sandbox;
//! - exec `true` throughput with M clients (256) spread over them: direct to the
//!   agents, `/v1`, compatible; the spawn floor with as many spawners;
//! - a mixed load (exec, files, sessions) with its latency-over-time plot;
//! - exec `true` latency with and without a CPU hog on every core;
//! - delete of all N, and an audit of what is left.
//!
//! Writes `scale.md` (and `scale.json`, the next run's "prev") to `--out`. Nothing
//! about times is asserted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use orchard_bench::host::{self, FloorBundle, Hog, Server};
use orchard_bench::load::{self, Api, LoadConfig, LoadReport, Op};
use orchard_bench::stats::Pcts;
use orchard_client::{AgentClient, Endpoint};
use orchard_protocol::{Command as Cmd, ExecRequest};
use serde_json::{json, Value};

/// Rounds of the exec throughput series (each series runs a share of `--seconds` in
/// each round).
const THROUGHPUT_ROUNDS: usize = 4;

#[derive(Parser, Debug)]
#[command(name = "orchard-scale")]
struct Args {
    /// The `orchard` binary.
    #[arg(long, default_value = "target/release/orchard")]
    orchard: PathBuf,
    /// The agent binary.
    #[arg(
        long,
        default_value = "target/x86_64-unknown-linux-musl/release/orchard-agent"
    )]
    agent: PathBuf,
    /// The busybox OCI layout.
    #[arg(long, default_value = "images/out/busybox")]
    image_dir: PathBuf,
    /// Sandboxes alive at once.
    #[arg(long, default_value_t = 1000)]
    sandboxes: usize,
    /// Concurrent clients of the throughput runs.
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Sequential creates per route (and `runc run`s).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Creates at once in the burst.
    #[arg(long, default_value_t = 100)]
    burst: usize,
    /// Seconds per throughput series.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// Calls per latency series (each with and without the hog).
    #[arg(long, default_value_t = 600)]
    calls: usize,
    /// Extra flag for `orchard serve` (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// Where `scale.md` goes.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ms_all(ds: &[Duration]) -> Vec<f64> {
    ds.iter().map(|d| ms(*d)).collect()
}

/// The numbers of this run, by key (also the JSON).
#[derive(Default)]
struct Numbers(BTreeMap<String, f64>);

impl Numbers {
    fn set(&mut self, k: &str, v: f64) -> f64 {
        self.0.insert(k.to_string(), v);
        v
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // This process is the client a trainer would be: ask for the short slice the
    // server and agents use, or its own wake-ups would be what the hog delays.
    let _ = orchard_sched::set_thread_slice(orchard_sched::LATENCY_SLICE);
    raise_nofile();
    let extra: Vec<&str> = args.server_args.iter().map(String::as_str).collect();
    let mut server = Server::start(&args.orchard, &args.agent, &args.image_dir, &extra)?;
    let api = Api::new(&server.url, &server.key)?;
    let mut n = Numbers::default();
    let mut md = String::new();
    eprintln!("server {} (data {})", server.url, server.data.display());

    // Warm-up: page cache of the layers, the agent and runc.
    let id = api
        .create_ready("busybox:latest")
        .await
        .map_err(anyhow::Error::msg)?;
    api.delete(&format!("/v1/sandboxes/{id}"))
        .await
        .map_err(anyhow::Error::msg)?;

    let mut floor = FloorBundle::new(&server)?;
    let creates = create_latency(&api, &mut floor, args.rounds, args.burst, &mut n).await?;
    md += &creates;

    let (many, ids) = many_sandboxes(&api, &server, args.sandboxes, &mut n).await?;
    md += &many;
    md += &throughput(&api, &ids, args.clients, args.seconds, &mut n).await?;
    md += &mixed_load(&api, &ids, args.clients, args.seconds, &args.out).await?;
    md += &quiet_client(&server, &ids[0], args.calls, &mut n)?;
    // The floor's overlay is under the data directory: gone before the audit.
    drop(floor);
    md += &delete_all(&api, &server, &ids, &mut n).await?;
    let stop = server.stop()?;

    let prev = previous(&args.out);
    let mut doc = String::from("# Scale on one machine\n\n");
    let _ = writeln!(
        doc,
        "A release `orchard serve` (default flags{}) on this machine ({} cores, {:.0} GiB), busybox sandboxes, clients in one process on the same machine with keep-alive connections. Ratios are against floors measured in the same run; `prev` columns are the previous run's (`scale.json`). The server stopped in {:.1} s.\n",
        if extra.is_empty() { String::new() } else { format!(" plus `{}`", extra.join(" ")) },
        std::thread::available_parallelism().map_or(0, |c| c.get()),
        host::mem_total() as f64 / (1u64 << 30) as f64,
        stop.as_secs_f64()
    );
    doc += &with_prev(&md, &prev);
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("scale.md"), &doc)?;
    std::fs::write(
        args.out.join("scale.json"),
        serde_json::to_vec_pretty(&n.0)?,
    )?;
    print!("{doc}");
    Ok(())
}

/// Raises this process's open-file limit to its hard limit (each client and agent
/// connection is a descriptor).
fn raise_nofile() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    let _ = setrlimit(Resource::Nofile, l);
}

/// Replaces `{prev:KEY}` in `md` with the previous run's value of KEY.
fn with_prev(md: &str, prev: &BTreeMap<String, f64>) -> String {
    let mut out = String::new();
    let mut rest = md;
    while let Some(i) = rest.find("{prev:") {
        out += &rest[..i];
        let after = &rest[i + 6..];
        let Some(j) = after.find('}') else {
            out += &rest[i..];
            return out;
        };
        let key = &after[..j];
        out += &prev.get(key).map_or("–".to_string(), |v| fmt_num(*v));
        rest = &after[j + 1..];
    }
    out + rest
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn previous(out: &std::path::Path) -> BTreeMap<String, f64> {
    std::fs::read(out.join("scale.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Create to ready through both routes next to `runc run`, one at a time
/// (interleaved) and `burst` at once.
// Over 100 lines because the three routes are measured side by side in one loop, so
// that each round's noise falls on all of them alike.
async fn create_latency(
    api: &Api,
    floor: &mut FloorBundle,
    rounds: usize,
    burst: usize,
    n: &mut Numbers,
) -> anyhow::Result<String> {
    eprintln!("create latency: {rounds} rounds, then {burst} at once");
    let (mut f, mut v1, mut compat) = (Vec::new(), Vec::new(), Vec::new());
    // The order turns each round (floor, /v1, compatible; then /v1, compatible, floor;
    // ...), so that each series follows each of the others as often. In a fixed order
    // the compatible create always came right after a /v1 sandbox's delete and the /v1
    // create after the floor, and whatever a predecessor leaves behind was charged to
    // one series only (quick runs: compatible 1.23x `runc run` fixed, 1.09-1.17x turned).
    for round in 0..rounds {
        for series in (0..3).map(|k| (k + round) % 3) {
            if series == 0 {
                f.push(ms(floor.run().await?));
                continue;
            }
            let compatible = series == 2;
            let (t, id) = timed_create(api, compatible).await?;
            if compatible { &mut compat } else { &mut v1 }.push(t);
            api.delete(&format!("/v1/sandboxes/{id}"))
                .await
                .map_err(anyhow::Error::msg)?;
        }
    }
    let (pf, pv, pc) = (Pcts::of(&f), Pcts::of(&v1), Pcts::of(&compat));
    // Each burst twice, in mirrored order (floor, /v1, compatible, compatible, /v1,
    // floor), so neither route is always the one after the floor.
    let (mut fb, mut vb, mut cb) = (Vec::new(), Vec::new(), Vec::new());
    let (mut v_wall, mut c_wall) = (Duration::ZERO, Duration::ZERO);
    for pass in 0..2 {
        if pass == 0 {
            fb.extend(ms_all(&floor.run_many(burst).await?));
        }
        for compat in if pass == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let t = Instant::now();
            let times = burst_create(api, burst, compat).await?;
            if compat {
                cb.extend(times);
                c_wall += t.elapsed() / 2;
            } else {
                vb.extend(times);
                v_wall += t.elapsed() / 2;
            }
        }
        if pass == 1 {
            fb.extend(ms_all(&floor.run_many(burst).await?));
        }
    }
    let (pfb, pvb, pcb) = (Pcts::of(&fb), Pcts::of(&vb), Pcts::of(&cb));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let slots = (4 * cpus).clamp(4, 64);
    let mut md = String::from("## Create to ready\n\n");
    let _ = writeln!(md, "{rounds} rounds one at a time (the three interleaved, the order turned each round), then {burst} at once, twice per series (mirrored order). Each sandbox is deleted right after its create (not timed). The server runs its default number of creates at once (two per CPU on the local backend, 4 to 64: {slots} here); the rest wait in its queue, and that wait is in the times.\n");
    md += "| measure | n | p50 ms | p99 ms | vs `runc run` (p50) | target | prev p50 ms |\n|---|---|---|---|---|---|---|\n";
    let rows = [
        (
            "floor: `runc run` of `true`, one at a time",
            "floor_1",
            pf,
            pf.p50,
            "",
        ),
        (
            "`POST /v1/sandboxes` then `GET .../wait`, one at a time",
            "v1_1",
            pv,
            pf.p50,
            "≤ 1.5x",
        ),
        (
            "compatible `POST /sandboxes` then `GET .../wait`, one at a time",
            "compat_1",
            pc,
            pf.p50,
            "≤ 1.5x",
        ),
        (
            "floor: `runc run` of `true`, all at once",
            "floor_burst",
            pfb,
            pfb.p50,
            "",
        ),
        (
            "`/v1` create to ready, all at once",
            "v1_burst",
            pvb,
            pfb.p50,
            "≤ 1.5x",
        ),
        (
            "compatible create to ready, all at once",
            "compat_burst",
            pcb,
            pfb.p50,
            "≤ 1.5x",
        ),
    ];
    for (label, key, p, base, target) in rows {
        let r = n.set(&format!("create_{key}_ratio"), p.p50 / base);
        n.set(&format!("create_{key}_p50_ms"), p.p50);
        let ok = if target.is_empty() {
            String::new()
        } else if r <= 1.5 {
            format!("{target} ✓")
        } else {
            format!("{target} ✗")
        };
        let _ = writeln!(
            md,
            "| {label} | {} | {:.1} | {:.1} | {r:.2}x | {ok} | {{prev:create_{key}_p50_ms}} |",
            p.n, p.p50, p.p99
        );
    }
    let _ = writeln!(
        md,
        "\nWall time of a burst (mean of two): `/v1` {:.2} s, compatible {:.2} s for {burst} sandboxes.\n",
        v_wall.as_secs_f64(),
        c_wall.as_secs_f64()
    );
    Ok(md)
}

/// Creates one sandbox and waits for it; the time to ready (ms) and its id.
async fn timed_create(api: &Api, compat: bool) -> anyhow::Result<(f64, String)> {
    let t = Instant::now();
    let id = if compat {
        let v = api
            .post("/sandboxes", &json!({"image": "busybox:latest"}))
            .await
            .map_err(anyhow::Error::msg)?;
        let id = v["sandbox_id"]
            .as_str()
            .context("no sandbox_id")?
            .to_string();
        let w = api
            .get(&format!("/sandboxes/{id}/wait"))
            .await
            .map_err(anyhow::Error::msg)?;
        if w["ready"] != true {
            bail!("{id} not ready: {w}");
        }
        id
    } else {
        api.create_ready("busybox:latest")
            .await
            .map_err(anyhow::Error::msg)?
    };
    Ok((ms(t.elapsed()), id))
}

async fn burst_create(api: &Api, k: usize, compat: bool) -> anyhow::Result<Vec<f64>> {
    let results = load::spawn_all((0..k).map(|_| {
        let api = api.clone();
        async move { timed_create(&api, compat).await.map_err(|e| e.to_string()) }
    }))
    .await;
    let mut times = Vec::new();
    let mut ids = Vec::new();
    for r in results {
        let (t, id) = r.map_err(anyhow::Error::msg)?;
        times.push(t);
        ids.push(id);
    }
    delete_ids(api, &ids).await;
    Ok(times)
}

async fn delete_ids(api: &Api, ids: &[String]) -> usize {
    let r = load::spawn_all(ids.iter().map(|id| {
        let api = api.clone();
        let path = format!("/v1/sandboxes/{id}");
        async move { api.delete(&path).await }
    }))
    .await;
    r.iter().filter(|r| r.is_err()).count()
}

/// Creates `k` sandboxes at once and reports wall time, failures and memory.
async fn many_sandboxes(
    api: &Api,
    server: &Server,
    k: usize,
    n: &mut Numbers,
) -> anyhow::Result<(String, Vec<String>)> {
    eprintln!("{k} sandboxes at once");
    let before = host::mem_available();
    let rss_before = host::rss(server.pid());
    let t = Instant::now();
    let results = load::spawn_all((0..k).map(|_| {
        let api = api.clone();
        async move { api.create_ready("busybox:latest").await }
    }))
    .await;
    let wall = t.elapsed();
    let pressure = host::pressure();
    let mut ids = Vec::new();
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    for r in results {
        match r {
            Ok(id) => ids.push(id),
            Err(e) => *failures.entry(e.chars().take(200).collect()).or_default() += 1,
        }
    }
    // Idle memory: what the sandboxes hold once every create is done.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = host::mem_available();
    let per = before.saturating_sub(after) as f64 / ids.len().max(1) as f64 / (1u64 << 20) as f64;
    let server_rss = host::rss(server.pid());
    let fds = host::fds(server.pid());
    n.set("many_ready", ids.len() as f64);
    n.set("many_wall_s", wall.as_secs_f64());
    n.set("many_mib_per_sandbox", per);
    let mut md = format!("## {k} sandboxes at once\n\n");
    let _ = writeln!(
        md,
        "| measure | value | target | prev |\n|---|---|---|---|\n| ready | {} of {k} | all | {{prev:many_ready}} |\n| wall time, first POST to last ready | {:.1} s | ≤ 30 s {} | {{prev:many_wall_s}} |\n| host memory per idle sandbox (MemAvailable drop / ready) | {per:.2} MiB | ≤ 4 MiB {} | {{prev:many_mib_per_sandbox}} |\n| server RSS before → after | {:.0} → {:.0} MiB | | |\n| server open descriptors | {fds} | | |\n",
        ids.len(),
        wall.as_secs_f64(),
        if wall.as_secs_f64() <= 30.0 { "✓" } else { "✗" },
        if per <= 4.0 { "✓" } else { "✗" },
        rss_before as f64 / (1u64 << 20) as f64,
        server_rss as f64 / (1u64 << 20) as f64,
    );
    let _ = writeln!(md, "Pressure at the end of the creates: {pressure}.\n");
    if !failures.is_empty() {
        md += "Failures:\n\n";
        for (e, c) in &failures {
            let _ = writeln!(md, "- {c} x `{}`", e.replace('`', "'"));
        }
        md += "\n";
    }
    if ids.is_empty() {
        bail!("no sandbox became ready:\n{md}");
    }
    Ok((md, ids))
}

/// The agent of sandbox `id` (its socket and token from `GET /v1/sandboxes/{id}`).
async fn agent_of(api: &Api, id: &str) -> anyhow::Result<AgentClient> {
    let v: Value = api
        .get(&format!("/v1/sandboxes/{id}"))
        .await
        .map_err(anyhow::Error::msg)?;
    let socket = v["agent"]["socket"].as_str().context("no agent socket")?;
    let token = v["agent"]["token"].as_str().context("no agent token")?;
    Ok(AgentClient::new(
        Endpoint::Unix(PathBuf::from(socket)),
        token,
    ))
}

/// Exec `true` per second with `clients` clients over `ids`: direct (argv, and the
/// shell command the compatible route runs), `/v1`, compatible, and the spawn floor.
// Over 100 lines because the five ways are measured in one interleaved loop, so that
// each round's noise falls on all of them alike.
async fn throughput(
    api: &Api,
    ids: &[String],
    clients: usize,
    secs: f64,
    n: &mut Numbers,
) -> anyhow::Result<String> {
    eprintln!("throughput: {clients} clients over {} sandboxes", ids.len());
    // The series take turns in THROUGHPUT_ROUNDS rounds (the order turned each round),
    // so that a drift of the machine's speed during the run (seen here: 20% within a
    // minute) falls on every series alike instead of on whichever ran last.
    let block = Duration::from_secs_f64(secs / THROUGHPUT_ROUNDS as f64);
    let mut agents = Vec::new();
    for id in ids {
        agents.push(Arc::new(agent_of(api, id).await?));
    }
    let cfg = |mix: &str| LoadConfig {
        clients,
        duration: block,
        mix: mix.parse().expect("a valid mix"),
        file_bytes: 0,
    };
    // What the compatible route runs for the command string "true": the image's shell
    // (busybox `sh`) with `-c`, by the compatibility contract. Its ratio is against
    // the same command sent straight to the agents, so that it measures the route and
    // not the shell's start (a third of the CPU in that series).
    let sh = ["/bin/sh", "-c", "true"];
    let (mut floor, mut direct, mut direct_sh) = (0.0, 0.0, 0.0);
    let (mut direct_err, mut direct_sh_err) = (0, 0);
    let (mut v1, mut compat) = (LoadReport::default(), LoadReport::default());
    let mut compat_ratios = Vec::new();
    for round in 0..THROUGHPUT_ROUNDS {
        let (mut sh_rate, mut compat_rate) = (0.0, 0.0);
        for k in 0..5 {
            match (round + k) % 5 {
                0 => floor += host::spawn_throughput(clients, block).await,
                1 => {
                    let (r, e) = direct_throughput(&agents, &["true"], clients, block).await;
                    direct += r;
                    direct_err += e;
                }
                2 => {
                    let (r, e) = direct_throughput(&agents, &sh, clients, block).await;
                    (sh_rate, direct_sh) = (r, direct_sh + r);
                    direct_sh_err += e;
                }
                3 => v1.absorb(load::run(api, ids, &cfg("v1")).await),
                _ => {
                    let r = load::run(api, ids, &cfg("exec")).await;
                    compat_rate = r.per_s(None);
                    compat.absorb(r);
                }
            }
        }
        if sh_rate > 0.0 {
            compat_ratios.push(compat_rate / sh_rate);
        }
    }
    let rounds = THROUGHPUT_ROUNDS as f64;
    let (floor, direct, direct_sh) = (floor / rounds, direct / rounds, direct_sh / rounds);
    let spread = match (
        compat_ratios.iter().copied().reduce(f64::min),
        compat_ratios.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => format!("{lo:.2}x to {hi:.2}x"),
        _ => "none".to_string(),
    };
    let pressure = host::pressure();
    let mut md = format!(
        "## Exec throughput: {clients} clients over {} sandboxes\n\nEach series {secs:.0} s in all, in {THROUGHPUT_ROUNDS} rounds of {:.1} s in which the series take turns (the order turned each round); the compatible route's ratio to the direct `sh -c` ranged from {spread} across the rounds. Client `i` calls sandboxes `i`, `i+{clients}`, ... in turn. Floor: {clients} concurrent spawn-and-wait loops of `true` on the host. \"vs direct\" compares a route with the same command sent straight to the agents: the compatible route runs every command string through the image's shell, by the compatibility contract.\n\n| route | execs/s | vs direct | p50 ms | p99 ms | errors | target | prev execs/s |\n|---|---|---|---|---|---|---|---|\n",
        ids.len(),
        block.as_secs_f64()
    );
    n.set("tp_floor", floor);
    n.set("tp_direct", direct);
    n.set("tp_direct_sh", direct_sh);
    let _ = writeln!(
        md,
        "| floor: host spawn of `true` | {floor:.0} | {:.2}x | | | | | {{prev:tp_floor}} |",
        floor / direct
    );
    let _ = writeln!(md, "| direct to the agents (Unix sockets), argv `true` | {direct:.0} | 1.00x | | | {direct_err} | | {{prev:tp_direct}} |");
    let _ = writeln!(md, "| direct to the agents, `/bin/sh -c true` (what the compatible route runs) | {direct_sh:.0} | 1.00x | | | {direct_sh_err} | | {{prev:tp_direct_sh}} |");
    for (label, key, r, base, target) in [
        (
            "`POST /v1/sandboxes/{id}/exec`, argv `true`",
            "tp_v1",
            &v1,
            direct,
            "",
        ),
        (
            "compatible `POST /sandboxes/{id}/exec`, `wait`, vs the direct `sh -c`",
            "tp_compat",
            &compat,
            direct_sh,
            "≥ 0.7x",
        ),
    ] {
        let rate = n.set(key, r.per_s(None));
        let p = Pcts::of(&r.latencies(None));
        let ratio = rate / base;
        let ok = match target {
            "" => String::new(),
            t if ratio >= 0.7 => format!("{t} ✓"),
            t => format!("{t} ✗"),
        };
        let _ = writeln!(
            md,
            "| {label} | {rate:.0} | {ratio:.2}x | {:.2} | {:.2} | {} | {ok} | {{prev:{key}}} |",
            p.p50 / 1000.0,
            p.p99 / 1000.0,
            r.error_count()
        );
    }
    let _ = writeln!(md, "\nPressure after the series: {pressure}.\n");
    Ok(md)
}

async fn direct_throughput(
    agents: &[Arc<AgentClient>],
    argv: &[&str],
    clients: usize,
    dur: Duration,
) -> (f64, u64) {
    let started = Instant::now();
    let deadline = started + dur;
    let agents = Arc::new(agents.to_vec());
    let req = ExecRequest {
        command: Cmd::Argv(argv.iter().map(|a| a.to_string()).collect()),
        ..Default::default()
    };
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let agents = agents.clone();
            let req = req.clone();
            tokio::spawn(async move {
                let mine: Vec<_> = agents.iter().skip(c).step_by(clients).cloned().collect();
                let mine = if mine.is_empty() {
                    vec![agents[c % agents.len()].clone()]
                } else {
                    mine
                };
                let (mut ok, mut err, mut k) = (0u64, 0u64, 0usize);
                while Instant::now() < deadline {
                    match mine[k % mine.len()].exec(&req).await {
                        Ok(r) if r.exit_code == Some(0) => ok += 1,
                        _ => err += 1,
                    }
                    k += 1;
                }
                (ok, err)
            })
        })
        .collect();
    let (mut ok, mut err) = (0, 0);
    for t in tasks {
        if let Ok((o, e)) = t.await {
            ok += o;
            err += e;
        }
    }
    (ok as f64 / started.elapsed().as_secs_f64(), err)
}

/// The load generator's mix over every sandbox, with its plot.
async fn mixed_load(
    api: &Api,
    ids: &[String],
    clients: usize,
    secs: f64,
    out: &std::path::Path,
) -> anyhow::Result<String> {
    eprintln!("mixed load");
    let cfg = LoadConfig {
        clients,
        duration: Duration::from_secs_f64(secs * 2.0),
        mix: "exec=6,v1=2,file=1,session=1"
            .parse()
            .map_err(anyhow::Error::msg)?,
        file_bytes: 4096,
    };
    let r = load::run(api, ids, &cfg).await;
    let mut md = format!(
        "## Mixed load: {clients} clients over {} sandboxes, {:.0} s\n\nThe load generator (`orchard-load`) with mix `exec=6,v1=2,file=1,session=1` (a file is a 4 KiB put and its get; a session command runs `true` in a shell session per client and sandbox).\n\n",
        ids.len(),
        r.secs
    );
    md += &r.table();
    std::fs::create_dir_all(out)?;
    match orchard_bench::plot::latency_png(
        &out.join("scale-load.png"),
        &format!("{clients} clients over {} sandboxes", ids.len()),
        &r,
    ) {
        Ok(()) => md += "\n![latency over time](scale-load.png)\n\n",
        Err(e) => {
            let _ = writeln!(md, "\n(no plot: {e})\n");
        }
    }
    Ok(md)
}

/// [`under_hog`] on a thread of its own with a single-threaded runtime and clients of
/// its own: a multi-threaded client runtime hops between its threads on every call,
/// and under the hog those hops wait for the scheduler's tick like the server's would,
/// which would measure the client.
fn quiet_client(
    server: &Server,
    id: &str,
    calls: usize,
    n: &mut Numbers,
) -> anyhow::Result<String> {
    let (url, key, id) = (server.url.clone(), server.key.clone(), id.to_string());
    let (md, numbers) = std::thread::spawn(move || -> anyhow::Result<(String, Numbers)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let api = Api::new(&url, &key)?;
            let mut n = Numbers::default();
            let md = under_hog(&api, &id, calls, &mut n).await?;
            Ok((md, n))
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the latency thread panicked"))??;
    n.0.extend(numbers.0);
    Ok(md)
}

/// One client, exec `true` on sandbox `id` by every route and the host spawn floor,
/// interleaved in blocks, without and then with a busy loop on every core.
async fn under_hog(api: &Api, id: &str, calls: usize, n: &mut Numbers) -> anyhow::Result<String> {
    eprintln!("latency with and without a CPU hog");
    let agent = agent_of(api, id).await?;
    let req = ExecRequest {
        command: Cmd::Argv(vec!["true".into()]),
        ..Default::default()
    };
    let mut md = String::from("## Exec `true` latency, with and without a CPU hog\n\nOne client (a single-threaded runtime on its own thread), calls one after another on one sandbox (of the live ones), the four series interleaved in blocks of 50; the hog is one `sh` busy loop per core at the default nice level and slice, started after the quiet series and stopped after. The floor is a spawn-and-wait of `true` on the host by `orchard-floor`, a process in a session of its own (spawning from the client would charge the client's scheduling group for the children). The hog loops are pinned one to each core.\n\n| series | hog | p50 µs | p90 µs | p99 µs | p99/p50 | p50 vs floor | target | prev p99 µs |\n|---|---|---|---|---|---|---|---|---|\n");
    for hog in [false, true] {
        let _guard = if hog {
            Some(Hog::start(Duration::from_secs(600))?)
        } else {
            None
        };
        let mut s: [Vec<f64>; 4] = Default::default();
        let block = 50;
        for _ in 0..calls.div_ceil(block) {
            s[0].extend(
                ms_all(&host::spawn_floor_apart(block)?)
                    .iter()
                    .map(|m| m * 1000.0),
            );
            for _ in 0..block {
                let t = Instant::now();
                let r = agent.exec(&req).await?;
                s[1].push(t.elapsed().as_secs_f64() * 1e6);
                if r.exit_code != Some(0) {
                    bail!("direct exec failed");
                }
            }
            for (i, op) in [(2, Op::V1Exec), (3, Op::Exec)] {
                let one = load::run_calls(api, id, op, block)
                    .await
                    .map_err(anyhow::Error::msg)?;
                s[i].extend(one);
            }
        }
        let floor = Pcts::of(&s[0]).p50;
        let tag = if hog { "hog" } else { "quiet" };
        for (i, label) in [
            "floor: host spawn of `true`",
            "direct agent",
            "`/v1` exec",
            "compatible exec (`wait`)",
        ]
        .iter()
        .enumerate()
        {
            let p = Pcts::of(&s[i]);
            let key = format!("lat_{tag}_{i}");
            n.set(&format!("{key}_p50"), p.p50);
            n.set(&format!("{key}_p99"), p.p99);
            let target = match (hog, i) {
                (true, 1..=3) => {
                    if p.p99 <= 3.0 * p.p50 {
                        "p99 ≤ 3x p50 ✓"
                    } else {
                        "p99 ≤ 3x p50 ✗"
                    }
                }
                (false, 1) => {
                    if p.p50 <= 1.5 * floor {
                        "p50 ≤ 1.5x floor ✓"
                    } else {
                        "p50 ≤ 1.5x floor ✗"
                    }
                }
                _ => "",
            };
            let _ = writeln!(
                md,
                "| {label} | {} | {:.0} | {:.0} | {:.0} | {:.1}x | {:.2}x | {target} | {{prev:{key}_p99}} |",
                if hog { "yes" } else { "no" },
                p.p50,
                p.p90,
                p.p99,
                p.p99 / p.p50.max(1.0),
                p.p50 / floor.max(1.0)
            );
        }
        if hog {
            let _ = writeln!(md, "\nPressure under the hog: {}.\n", host::pressure());
        }
    }
    Ok(md)
}

/// Deletes every sandbox at once and audits what is left.
async fn delete_all(
    api: &Api,
    server: &Server,
    ids: &[String],
    n: &mut Numbers,
) -> anyhow::Result<String> {
    eprintln!("deleting {}", ids.len());
    let t = Instant::now();
    let failed = delete_ids(api, ids).await;
    let wall = n.set("delete_all_s", t.elapsed().as_secs_f64());
    let left = host::leftovers(&server.data);
    let listed = api.get("/v1/sandboxes").await.map_err(anyhow::Error::msg)?;
    let still = listed
        .as_array()
        .or_else(|| listed["sandboxes"].as_array())
        .map_or(0, Vec::len);
    let mut md = format!("## Delete all {}\n\n", ids.len());
    let _ = writeln!(
        md,
        "All deleted at once in {wall:.1} s (prev {{prev:delete_all_s}} s), {failed} failed; the server then lists {still} sandboxes. Left behind: {}.\n",
        if left.is_empty() { "nothing (no mounts under the data directory, no runc state, no agent process)".to_string() } else { left.join(", ") }
    );
    Ok(md)
}
