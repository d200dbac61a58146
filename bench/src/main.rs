//! `make bench`: measures the agent next to the floor in the same run and writes
//! `bench/results/agent.md` (table) and `agent.json` (numbers, the baseline of the next
//! run's comparison).
//!
//! - exec `true` round trip over the Unix socket and over TCP (keep-alive client),
//!   p50/p99, next to the floor: spawn + wait of the same `true` without the agent.
//!   Floor and agent calls run in interleaved blocks so machine noise hits both alike.
//! - streamed exec throughput of a large output (NDJSON and binary frames), next to
//!   reading the same command's pipe directly.
//! - a trivial command in a persistent shell session, p50/p99.
//! - git diff of a 20,000-file work tree through the agent, next to the git CLI.
//! - agent idle RSS and binary size.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Parser;
use hyper::Method;
use orchard_bench::stats::Pcts;
use orchard_client::{AgentClient, Endpoint, Frame};
use orchard_protocol::git::{GitDiff, GitDiffRequest};
use orchard_protocol::session::{SessionCreate, SessionRun};
use orchard_protocol::{Command as Cmd, ExecEvent, ExecRequest};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// The agent binary to measure.
    #[arg(long)]
    agent: PathBuf,
    /// Directory for the results.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Calls per measurement (split into interleaved blocks).
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Extra arguments for the agent (repeatable), e.g. `--agent-arg=--workers=1`.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// Files in the repository of the git diff measurement.
    #[arg(long, default_value_t = 20_000)]
    git_files: usize,
    /// Bytes streamed in the throughput test.
    #[arg(long, default_value_t = 256 << 20)]
    stream_bytes: u64,
    /// Rounds of the throughput test (pipe, frames, NDJSON each), medians reported.
    #[arg(long, default_value_t = 7)]
    stream_rounds: usize,
}

struct Agent {
    child: std::process::Child,
    dir: PathBuf,
    unix: PathBuf,
    tcp: std::net::SocketAddr,
    token: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SIGTERM, not `Child::kill`'s SIGKILL: the agent shuts down as it would in a
        // sandbox. Already gone is fine.
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_agent(bin: &Path, extra: &[String]) -> anyhow::Result<Agent> {
    let dir = std::env::temp_dir().join(format!("orchard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let unix = dir.join("agent.sock");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let token = format!("bench-{}", std::process::id());
    let child = Command::new(bin)
        .arg("--unix")
        .arg(&unix)
        .arg("--tcp")
        .arg(tcp.to_string())
        .args(extra)
        .env("ORCHARD_AGENT_TOKEN", &token)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Agent {
        child,
        dir,
        unix,
        tcp,
        token,
    })
}

async fn wait_ready(client: &AgentClient) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.health().await.is_err() {
        if Instant::now() > deadline {
            bail!("the agent did not answer within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e6);
    }
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return 0.0;
        }
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i]
    }
}

fn which(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    PathBuf::from(name)
}

async fn exec_true(client: &AgentClient, req: &ExecRequest) -> anyhow::Result<()> {
    let r = client.exec(req).await?;
    if r.exit_code != Some(0) {
        bail!("true exited {:?}", r.exit_code);
    }
    Ok(())
}

/// `head -c BYTES /dev/zero`: a large output at the pipe's speed.
fn head_zero(head: &Path, bytes: u64) -> ExecRequest {
    ExecRequest {
        command: Cmd::Argv(vec![
            head.display().to_string(),
            "-c".into(),
            bytes.to_string(),
            "/dev/zero".into(),
        ]),
        ..Default::default()
    }
}

async fn stream_throughput(client: &AgentClient, head: &Path, bytes: u64) -> anyhow::Result<f64> {
    let req = head_zero(head, bytes);
    let start = Instant::now();
    let mut stream = client.exec_stream(&req).await?;
    let mut got = 0u64;
    while let Some(ev) = stream.next().await? {
        match ev {
            ExecEvent::Stdout { data } => {
                got += orchard_protocol::output::b64_decode(&data)
                    .map(|d| d.len() as u64)
                    .unwrap_or(0)
            }
            ExecEvent::Exit { .. } => break,
            ExecEvent::Error { message, .. } => bail!("stream error: {message}"),
            _ => {}
        }
    }
    if got != bytes {
        bail!("streamed {got} bytes, expected {bytes}");
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
}

/// Like [`stream_throughput`], with binary frames (`Accept: application/vnd.orchard.exec-frames`).
async fn frames_throughput(client: &AgentClient, head: &Path, bytes: u64) -> anyhow::Result<f64> {
    let req = head_zero(head, bytes);
    let start = Instant::now();
    let mut stream = client.exec_frames(&req).await?;
    let mut got = 0u64;
    while let Some(frame) = stream.next().await? {
        match frame {
            Frame::Stdout(data) => got += data.len() as u64,
            Frame::Event(ExecEvent::Exit { .. }) => break,
            Frame::Event(ExecEvent::Error { message, .. }) => bail!("stream error: {message}"),
            _ => {}
        }
    }
    if got != bytes {
        bail!("streamed {got} bytes, expected {bytes}");
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
}

fn direct_throughput(head: &Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Read;
    let start = Instant::now();
    let mut child = Command::new(head)
        .args(["-c", &bytes.to_string(), "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().context("no stdout")?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = out.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    child.wait()?;
    if got != bytes {
        bail!("read {got} bytes, expected {bytes}");
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.invalid")
        .output()
        .context("running git (the bench compares against the git CLI)")?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

/// git diff of a work tree with `files` committed files, 50 modified and 10 new, through
/// the agent and through the git CLI (`add -A` into a throwaway index, then
/// `diff --cached --binary`, which is what the agent's diff is equivalent to).
async fn git_diff_bench(client: &AgentClient, files: usize) -> anyhow::Result<(f64, f64)> {
    let dir = std::env::temp_dir().join(format!("orchard-bench-git-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for i in 0..files {
        let sub = dir.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&sub)?;
        }
        std::fs::write(
            sub.join(format!("f{i}.txt")),
            format!("line one of {i}\nline two\n"),
        )?;
    }
    git(&dir, &["init", "-q"])?;
    git(&dir, &["add", "-A"])?;
    git(&dir, &["commit", "-q", "-m", "base"])?;
    for i in (0..files).step_by((files / 50).max(1)).take(50) {
        let path = dir.join(format!("d{:03}/f{i}.txt", i / 100));
        std::fs::write(path, format!("line one of {i}\nchanged\n"))?;
    }
    for i in 0..10 {
        std::fs::write(dir.join(format!("new{i}.txt")), "new\n")?;
    }
    let req = GitDiffRequest {
        repo: dir.display().to_string(),
        base: None,
        include_untracked: true,
        binary: true,
    };
    let body = serde_json::to_vec(&req)?;
    let index = dir.join(".git/index");
    let scratch = dir.join(".git/bench-index");
    let (mut ours, mut cli) = (Samples::default(), Samples::default());
    let mut patch_len = (0, 0);
    for _ in 0..11 {
        let t = Instant::now();
        let raw = client
            .send(
                Method::POST,
                "/v1/git/diff",
                Bytes::from(body.clone()),
                "application/json",
            )
            .await?;
        ours.push(t.elapsed());
        if !raw.status.is_success() {
            bail!(
                "git diff through the agent: {}",
                String::from_utf8_lossy(&raw.body)
            );
        }
        let diff: GitDiff = serde_json::from_slice(&raw.body)?;
        patch_len.0 = diff.patch.len();

        let t = Instant::now();
        std::fs::copy(&index, &scratch)?;
        let run = |args: &[&str]| {
            Command::new("git")
                .arg("-C")
                .arg(&dir)
                .args(args)
                .env("GIT_INDEX_FILE", &scratch)
                .output()
        };
        run(&["add", "-A"])?;
        let out = run(&["diff", "--cached", "--binary", "HEAD"])?;
        cli.push(t.elapsed());
        patch_len.1 = out.stdout.len();
    }
    let _ = std::fs::remove_dir_all(&dir);
    if patch_len.0 == 0 || patch_len.1 == 0 {
        bail!(
            "empty git diff (agent {} bytes, CLI {} bytes)",
            patch_len.0,
            patch_len.1
        );
    }
    Ok((ours.pct(0.5) / 1000.0, cli.pct(0.5) / 1000.0))
}

/// A results row: name, key in agent.json, value, unit, ratio to the floor, target.
type Row<'a> = (&'a str, &'a str, f64, &'a str, Option<f64>, &'a str);

fn previous(out: &Path) -> Value {
    std::fs::read_to_string(out.join("agent.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

// Over 100 lines because it is the benchmark's script: each measurement in turn, in the
// order of the results table it writes, reads best as one list.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let agent = start_agent(&args.agent, &args.agent_args)?;
    let unix = Arc::new(AgentClient::new(
        Endpoint::Unix(agent.unix.clone()),
        &agent.token,
    ));
    let tcp = Arc::new(AgentClient::new(Endpoint::Tcp(agent.tcp), &agent.token));
    wait_ready(&unix).await?;
    wait_ready(&tcp).await?;
    let idle_rss = rss_kib(agent.child.id());

    let true_bin = which("true");
    let req = ExecRequest {
        command: Cmd::Argv(vec![true_bin.display().to_string()]),
        ..Default::default()
    };
    for _ in 0..100 {
        exec_true(&unix, &req).await?;
        exec_true(&tcp, &req).await?;
        Command::new(&true_bin).status()?;
    }
    let (mut floor, mut over_unix, mut over_tcp) =
        (Samples::default(), Samples::default(), Samples::default());
    let mut http_only = Samples::default();
    let block = 100;
    let blocks = args.iterations.div_ceil(block);
    for _ in 0..blocks {
        for _ in 0..block {
            let t = Instant::now();
            let status = Command::new(&true_bin).status()?;
            floor.push(t.elapsed());
            if !status.success() {
                bail!("true failed");
            }
        }
        for _ in 0..block {
            let t = Instant::now();
            exec_true(&unix, &req).await?;
            over_unix.push(t.elapsed());
        }
        for _ in 0..block {
            let t = Instant::now();
            exec_true(&tcp, &req).await?;
            over_tcp.push(t.elapsed());
        }
        for _ in 0..block {
            let t = Instant::now();
            unix.send(Method::GET, "/livez", Bytes::new(), "text/plain")
                .await?;
            http_only.push(t.elapsed());
        }
    }
    let loaded_rss = rss_kib(agent.child.id());

    let session = unix.create_session(&SessionCreate::default()).await?;
    let mut in_session = Samples::default();
    let run = SessionRun {
        command: "true".into(),
        timeout_ms: None,
    };
    for i in 0..(blocks * block + 100) {
        let t = Instant::now();
        let r = unix.session_run(&session.id, &run).await?;
        if i >= 100 {
            in_session.push(t.elapsed());
        }
        if r.exit_code != Some(0) {
            bail!("session command exited {:?}", r.exit_code);
        }
    }
    unix.delete_session(&session.id).await?;

    let head = which("head");
    // Streaming on two cores swings by ±30% from one run to the next (three processes
    // share two cores): rounds interleaved, medians reported.
    let (mut direct, mut stream, mut frames, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.stream_rounds.max(1) {
        let d = direct_throughput(&head, args.stream_bytes)?;
        let f = frames_throughput(&unix, &head, args.stream_bytes).await?;
        direct.push(d);
        frames.push(f);
        ratios.push(f / d);
        stream.push(stream_throughput(&unix, &head, args.stream_bytes).await?);
    }
    let (direct_mbs, stream_mbs, frames_mbs) = (
        Pcts::of(&direct).p50,
        Pcts::of(&stream).p50,
        Pcts::of(&frames).p50,
    );
    let frame_ratios = Pcts::of(&ratios);
    let size = std::fs::metadata(&args.agent)?.len();
    let (git_ours_ms, git_cli_ms) = git_diff_bench(&unix, args.git_files).await?;

    let now = json!({
        "floor_p50_us": floor.pct(0.5), "floor_p99_us": floor.pct(0.99),
        "unix_p50_us": over_unix.pct(0.5), "unix_p99_us": over_unix.pct(0.99),
        "tcp_p50_us": over_tcp.pct(0.5), "tcp_p99_us": over_tcp.pct(0.99),
        "http_p50_us": http_only.pct(0.5),
        "session_p50_us": in_session.pct(0.5), "session_p99_us": in_session.pct(0.99),
        "direct_pipe_mb_s": direct_mbs, "stream_mb_s": stream_mbs, "frames_mb_s": frames_mbs,
        "git_cli_p50_ms": git_cli_ms, "git_ours_p50_ms": git_ours_ms,
        "idle_rss_kib": idle_rss, "loaded_rss_kib": loaded_rss, "binary_bytes": size,
        "iterations": blocks * block,
    });
    let prev = previous(&args.out);
    let f50 = floor.pct(0.5);
    let mut md = String::new();
    md += "# orchard-agent benchmark\n\n";
    md += &format!(
        "{} calls per series, interleaved in blocks of {block}; agent on the host (not in a sandbox), `{}`.\n",
        blocks * block,
        true_bin.display()
    );
    md += "Ratios are against the floor measured in this run; `prev` is the previous run's value.\n\n";
    md += "| measure | value | ratio to floor | target | prev |\n|---|---|---|---|---|\n";
    let prevv = |k: &str| {
        prev.get(k)
            .and_then(Value::as_f64)
            .map_or("–".to_string(), |v| format!("{v:.1}"))
    };
    // (name, key in agent.json, value, unit, ratio to the floor, target)
    let rows: Vec<Row> = vec![
        (
            "floor: spawn+wait `true`, p50",
            "floor_p50_us",
            f50,
            "µs",
            Some(1.0),
            "",
        ),
        (
            "floor: spawn+wait `true`, p99",
            "floor_p99_us",
            floor.pct(0.99),
            "µs",
            None,
            "",
        ),
        (
            "exec `true` over Unix socket, p50",
            "unix_p50_us",
            over_unix.pct(0.5),
            "µs",
            Some(over_unix.pct(0.5) / f50),
            "≤ 1.5x",
        ),
        (
            "exec `true` over Unix socket, p99",
            "unix_p99_us",
            over_unix.pct(0.99),
            "µs",
            Some(over_unix.pct(0.99) / floor.pct(0.99)),
            "",
        ),
        (
            "exec `true` over TCP, p50",
            "tcp_p50_us",
            over_tcp.pct(0.5),
            "µs",
            Some(over_tcp.pct(0.5) / f50),
            "≤ 1.5x",
        ),
        (
            "exec `true` over TCP, p99",
            "tcp_p99_us",
            over_tcp.pct(0.99),
            "µs",
            Some(over_tcp.pct(0.99) / floor.pct(0.99)),
            "",
        ),
        (
            "HTTP round trip without exec (`/livez`, Unix), p50",
            "http_p50_us",
            http_only.pct(0.5),
            "µs",
            None,
            "",
        ),
        (
            "session command `true`, p50",
            "session_p50_us",
            in_session.pct(0.5),
            "µs",
            None,
            "≤ 2000 µs",
        ),
        (
            "session command `true`, p99",
            "session_p99_us",
            in_session.pct(0.99),
            "µs",
            None,
            "",
        ),
        (
            "git diff, 20k-file repo, `git` CLI (floor), p50",
            "git_cli_p50_ms",
            git_cli_ms,
            "ms",
            Some(1.0),
            "",
        ),
        (
            "git diff, 20k-file repo, agent /v1/git/diff, p50",
            "git_ours_p50_ms",
            git_ours_ms,
            "ms",
            Some(git_ours_ms / git_cli_ms),
            "",
        ),
        (
            "floor: read a pipe directly",
            "direct_pipe_mb_s",
            direct_mbs,
            "MB/s",
            Some(1.0),
            "",
        ),
        (
            "streamed exec throughput, NDJSON (base64, the default)",
            "stream_mb_s",
            stream_mbs,
            "MB/s",
            Some(stream_mbs / direct_mbs),
            "",
        ),
        (
            "streamed exec throughput, binary frames",
            "frames_mb_s",
            frames_mbs,
            "MB/s",
            Some(frames_mbs / direct_mbs),
            "≥ 0.7x",
        ),
        (
            "agent idle RSS",
            "idle_rss_kib",
            idle_rss as f64,
            "KiB",
            None,
            "≤ 4096 KiB",
        ),
        (
            "agent RSS after the run",
            "loaded_rss_kib",
            loaded_rss as f64,
            "KiB",
            None,
            "",
        ),
        (
            "agent binary size",
            "binary_bytes",
            size as f64,
            "bytes",
            None,
            "≤ 12 MiB",
        ),
    ];
    for (name, key, value, unit, ratio, target) in rows {
        let ratio = ratio.map_or("–".to_string(), |r| format!("{r:.2}x"));
        md += &format!(
            "| {name} | {value:.1} {unit} | {ratio} | {target} | {} |\n",
            prevv(key)
        );
    }
    md += &format!(
        "\nStreaming: {} rounds of {} MiB from `head -c`, interleaved (pipe, frames, NDJSON); the rows give the medians. Binary frames against the pipe of the same round: median {:.2}x, from {:.2}x to {:.2}x.\n",
        ratios.len(),
        args.stream_bytes >> 20,
        frame_ratios.p50,
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        frame_ratios.max
    );
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("agent.md"), &md)?;
    std::fs::write(
        args.out.join("agent.json"),
        serde_json::to_string_pretty(&now)? + "\n",
    )?;
    print!("{md}");
    let unix_ratio = over_unix.pct(0.5) / f50;
    if unix_ratio > 1.5 {
        eprintln!(
            "bench: exec p50 over the Unix socket is {unix_ratio:.2}x the floor (target 1.5x)"
        );
    }
    drop(agent);
    Ok(())
}
