//! Benchmarks of the local backend (feature `backend`), for the orchestrator's ignored
//! integration tests `bench_local_backend` (`make bench`, `bench/results/backend.md`)
//! and `bench_kubernetes` (its local floors): create-to-ready latency of a cached image
//! next to the floor (`runc run` of `true` from the same layers, measured in the same
//! run), delete latency, and a burst of sandboxes created at once (success rate, wall
//! time, memory per sandbox). It drives the backend through its public API only.
//!
//! Give the backend a `ready_timeout` long enough for the burst (creates queue on the
//! CPU: 200 at once on 2 cores take tens of seconds).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use oci_spec::runtime::{ProcessBuilder, RootBuilder, Spec};
use orchard::backend::local::sys::RealMounter;
use orchard::backend::local::{rootfs, spec, LocalBackend, SandboxSpec, DEFAULT_PATH};
use orchard::image::Image;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Sequential create/delete rounds (and `runc run` rounds).
    pub rounds: usize,
    /// Sandboxes created at once.
    pub burst: usize,
    /// The floor's command, run by `runc run` in the image (`["true"]`).
    pub floor_argv: Vec<String>,
    /// The runc binary of the floor: the backend's (`LocalConfig::runc`, `runc` on the
    /// `PATH` by default).
    pub runc: PathBuf,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            rounds: 20,
            burst: 200,
            floor_argv: vec!["true".into()],
            runc: "runc".into(),
        }
    }
}

/// Percentiles of a series, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile (the maximum for fewer than 100 samples).
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples` (milliseconds).
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| s[((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1)];
        Summary {
            n: s.len(),
            p50: at(0.5),
            p99: at(0.99),
            mean: s.iter().sum::<f64>() / s.len() as f64,
        }
    }
}

/// The burst's outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BurstReport {
    /// Sandboxes asked for.
    pub requested: usize,
    /// Sandboxes whose agent answered.
    pub succeeded: usize,
    /// From the first create to the last answer, in milliseconds.
    pub wall_ms: f64,
    /// Mean of the sandboxes' memory cgroup usage, in bytes.
    pub cgroup_memory_per_sandbox: u64,
    /// Host `MemAvailable` drop divided by the sandboxes, in bytes (kernel overhead
    /// included: page tables, overlay and runc state).
    pub host_memory_per_sandbox: u64,
    /// Deleting all of them, in milliseconds.
    pub delete_all_ms: f64,
    /// The first few errors.
    pub errors: Vec<String>,
}

/// All results.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchReport {
    /// Create until the agent answers.
    pub create_ms: Summary,
    /// `runc run` of the floor command.
    pub runc_run_ms: Summary,
    /// Delete.
    pub delete_ms: Summary,
    /// The burst.
    pub burst: BurstReport,
}

impl BenchReport {
    /// A Markdown table of the results.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let _ = writeln!(s, "| measure | p50 ms | p99 ms | vs floor (p50) |");
        let _ = writeln!(s, "|---|---|---|---|");
        let _ = writeln!(
            s,
            "| floor: `runc run` of `true` | {:.1} | {:.1} | 1.0 |",
            self.runc_run_ms.p50, self.runc_run_ms.p99
        );
        let _ = writeln!(
            s,
            "| create to ready (cached image) | {:.1} | {:.1} | {:.2} |",
            self.create_ms.p50,
            self.create_ms.p99,
            ratio(self.create_ms.p50, self.runc_run_ms.p50)
        );
        let _ = writeln!(
            s,
            "| delete | {:.1} | {:.1} | {:.2} |",
            self.delete_ms.p50,
            self.delete_ms.p99,
            ratio(self.delete_ms.p50, self.runc_run_ms.p50)
        );
        let b = &self.burst;
        let _ = writeln!(
            s,
            "\n{} sandboxes at once: {}/{} ready ({:.1}%), wall {:.1} s, delete all {:.1} s, \
             memory per sandbox {:.1} MiB (cgroup) / {:.1} MiB (host)",
            b.requested,
            b.succeeded,
            b.requested,
            100.0 * b.succeeded as f64 / b.requested.max(1) as f64,
            b.wall_ms / 1000.0,
            b.delete_all_ms / 1000.0,
            b.cgroup_memory_per_sandbox as f64 / (1 << 20) as f64,
            b.host_memory_per_sandbox as f64 / (1 << 20) as f64,
        );
        for e in &b.errors {
            let _ = writeln!(s, "- error: {e}");
        }
        s
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Runs every measurement with `image` on `backend`.
pub async fn run(
    backend: &LocalBackend,
    image: &Image,
    cfg: &BenchConfig,
) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport::default();

    // Warm-up: page cache of the layers, the agent and runc.
    let warm = backend.create(SandboxSpec::new(image.clone())).await?;
    backend.delete(&warm.id).await?;

    report.runc_run_ms = floor(backend, image, cfg).await?;

    let (mut creates, mut deletes) = (Vec::new(), Vec::new());
    for _ in 0..cfg.rounds {
        let t = Instant::now();
        let sb = backend.create(SandboxSpec::new(image.clone())).await?;
        creates.push(ms(t.elapsed()));
        let t = Instant::now();
        backend.delete(&sb.id).await?;
        deletes.push(ms(t.elapsed()));
    }
    report.create_ms = Summary::of(&creates);
    report.delete_ms = Summary::of(&deletes);
    report.burst = burst(backend, image, cfg.burst).await;
    Ok(report)
}

/// `runc run` of the floor command over the same layers (one overlay mounted for all
/// rounds), with runc's default isolation and no agent.
async fn floor(
    backend: &LocalBackend,
    image: &Image,
    cfg: &BenchConfig,
) -> anyhow::Result<Summary> {
    let dir = backend.root().join("bench-floor");
    let (rootfs_dir, upper, work, runc_root, empty) = (
        dir.join("rootfs"),
        dir.join("upper"),
        dir.join("work"),
        dir.join("runc"),
        dir.join("empty"),
    );
    for d in [&rootfs_dir, &upper, &work, &runc_root, &empty] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    // An image without layers runs on an empty lower directory, as a sandbox does.
    let layers = if image.layers.is_empty() {
        vec![empty]
    } else {
        image.layers.clone()
    };
    rootfs::mount_overlay(&RealMounter, &layers, &upper, &work, &rootfs_dir)?;
    let result = async {
        let mut config = Spec::default();
        let process = ProcessBuilder::default()
            .terminal(false)
            .args(cfg.floor_argv.clone())
            .env(vec![format!("PATH={DEFAULT_PATH}")])
            .cwd("/")
            .build()?;
        config.set_process(Some(process));
        config.set_hostname(Some("floor".into()));
        config.set_root(Some(
            RootBuilder::default()
                .path("rootfs")
                .readonly(true)
                .build()?,
        ));
        spec::write(&config, &dir.join("config.json"))?;
        let mut samples = Vec::new();
        for i in 0..cfg.rounds.max(1) {
            let id = format!("orchard-floor-{}-{i}", backend.tag());
            let t = Instant::now();
            let status = tokio::process::Command::new(&cfg.runc)
                .arg("--root")
                .arg(&runc_root)
                .args(["run", "--bundle"])
                .arg(&dir)
                .arg(&id)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .status()
                .await
                .with_context(|| format!("running runc for {}", dir.display()))?;
            samples.push(ms(t.elapsed()));
            if !status.success() {
                bail!(
                    "the floor `runc run {:?}` failed ({status}): does the image have it?",
                    cfg.floor_argv
                );
            }
        }
        Ok(Summary::of(&samples))
    }
    .await;
    let _ = rootfs::unmount(&RealMounter, &rootfs_dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn burst(backend: &LocalBackend, image: &Image, n: usize) -> BurstReport {
    let mut out = BurstReport {
        requested: n,
        ..BurstReport::default()
    };
    let before = mem_available();
    let t = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let b = backend.clone();
            let spec = SandboxSpec::new(image.clone());
            tokio::spawn(async move { b.create(spec).await })
        })
        .collect();
    let mut ready = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(info)) => ready.push(info),
            Ok(Err(e)) => out.errors.push(e.to_string()),
            Err(e) => out.errors.push(e.to_string()),
        }
    }
    out.wall_ms = ms(t.elapsed());
    out.succeeded = ready.len();
    if !ready.is_empty() {
        let cg: u64 = ready
            .iter()
            .filter_map(|s| s.cgroup_dir("memory"))
            .filter_map(|d| std::fs::read_to_string(d.join("memory.usage_in_bytes")).ok())
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum();
        out.cgroup_memory_per_sandbox = cg / ready.len() as u64;
        out.host_memory_per_sandbox = before.saturating_sub(mem_available()) / ready.len() as u64;
    }
    let t = Instant::now();
    let deletes: Vec<_> = ready
        .into_iter()
        .map(|s| {
            let b = backend.clone();
            tokio::spawn(async move { b.delete(&s.id).await })
        })
        .collect();
    for d in deletes {
        match d.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => out.errors.push(e.to_string()),
            Err(e) => out.errors.push(e.to_string()),
        }
    }
    out.delete_all_ms = ms(t.elapsed());
    out.errors.truncate(5);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_pick_percentiles() {
        let s = Summary::of(&(1..=100).map(f64::from).collect::<Vec<_>>());
        assert_eq!((s.n, s.p50, s.p99), (100, 51.0, 99.0));
        assert_eq!(Summary::of(&[]), Summary::default());
        let r = BenchReport::default().to_markdown();
        assert!(r.contains("create to ready"), "{r}");
    }
}
