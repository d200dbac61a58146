//! `orchard-load`: the load generator against a running server. Creates N sandboxes,
//! runs M clients with a mix of operations for a while, prints throughput, latency
//! percentiles and errors, writes the table and a latency-over-time PNG, and deletes
//! the sandboxes (see `bench/README.md`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use orchard_bench::load::{self, Api, LoadConfig, Mix};

/// Drive an Orchard Env server with N sandboxes and M clients.
#[derive(Parser, Debug)]
#[command(name = "orchard-load")]
struct Args {
    /// The server (default `SANDBOX_BASE_URL`).
    #[arg(long, env = "SANDBOX_BASE_URL")]
    url: String,
    /// Its API key (default `SANDBOX_API_KEY`).
    #[arg(long, env = "SANDBOX_API_KEY", hide_env_values = true)]
    key: String,
    /// Image of the sandboxes.
    #[arg(long, default_value = "busybox:latest")]
    image: String,
    /// Sandboxes to create (all at once).
    #[arg(long, default_value_t = 8)]
    sandboxes: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds the clients call for.
    #[arg(long, default_value_t = 20.0)]
    duration_s: f64,
    /// Operations and their weights: exec (compatible route), v1 (`/v1` exec), file (a
    /// put and a get), session (a command in a shell session).
    #[arg(long, default_value = "exec=6,v1=2,file=1,session=1")]
    mix: Mix,
    /// Size of the file the `file` operation writes and reads back.
    #[arg(long, default_value_t = 4096)]
    file_bytes: usize,
    /// Where `NAME.md` and `NAME.png` go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// File name stem of the results.
    #[arg(long, default_value = "load")]
    name: String,
    /// Leave the sandboxes running.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.sandboxes == 0 || args.clients == 0 {
        bail!("--sandboxes and --clients must be at least 1");
    }
    let api = Api::new(&args.url, &args.key)?;
    eprintln!(
        "creating {} sandboxes of {} ...",
        args.sandboxes, args.image
    );
    let t = Instant::now();
    let created = load::spawn_all((0..args.sandboxes).map(|_| {
        let api = api.clone();
        let image = args.image.clone();
        async move { api.create_ready(&image).await }
    }))
    .await;
    let create_s = t.elapsed().as_secs_f64();
    let mut ids = Vec::new();
    let mut failures = Vec::new();
    for r in created {
        match r {
            Ok(id) => ids.push(id),
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "{} ready in {create_s:.1} s, {} failed",
        ids.len(),
        failures.len()
    );
    if let Some(e) = failures.first() {
        eprintln!("first failure: {e}");
    }
    if ids.is_empty() {
        bail!("no sandbox became ready");
    }
    let cfg = LoadConfig {
        clients: args.clients,
        duration: Duration::from_secs_f64(args.duration_s),
        mix: args.mix.clone(),
        file_bytes: args.file_bytes,
    };
    eprintln!(
        "{} clients for {:.0} s, mix {:?} ...",
        cfg.clients,
        args.duration_s,
        cfg.mix.round().iter().map(|o| o.key()).collect::<Vec<_>>()
    );
    let report = load::run(&api, &ids, &cfg).await;
    let mut md = format!(
        "# Load: {} sandboxes, {} clients, {:.0} s\n\nServer {}; image `{}`; mix `{}`; sandboxes created in {create_s:.1} s ({} failed).\n\n",
        ids.len(),
        cfg.clients,
        report.secs,
        api.base(),
        args.image,
        cfg.mix.round().iter().map(|o| o.key()).collect::<Vec<_>>().join(","),
        failures.len()
    );
    md += &report.table();
    print!("{md}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let png = args.out.join(format!("{}.png", args.name));
    let title = format!(
        "{} clients over {} sandboxes: latency and throughput",
        cfg.clients,
        ids.len()
    );
    match orchard_bench::plot::latency_png(&png, &title, &report) {
        Ok(()) => {
            md += &format!("\n![latency over time]({}.png)\n", args.name);
            eprintln!("plot: {}", png.display());
        }
        Err(e) => eprintln!("no plot: {e}"),
    }
    let path = args.out.join(format!("{}.md", args.name));
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    if !args.keep {
        let t = Instant::now();
        let gone = load::spawn_all(ids.iter().map(|id| {
            let api = api.clone();
            let path = format!("/v1/sandboxes/{id}");
            async move { api.delete(&path).await }
        }))
        .await;
        let failed = gone.iter().filter(|r| r.is_err()).count();
        eprintln!(
            "deleted {} sandboxes in {:.1} s ({failed} failed)",
            ids.len(),
            t.elapsed().as_secs_f64()
        );
    }
    if report.error_count() > 0 || !failures.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
