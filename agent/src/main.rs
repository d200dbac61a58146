//! `orchard-agent` command line: parses flags into a [`Config`] and runs the agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use orchard_agent::config::{self, Config};

/// The Orchard sandbox agent. Runs as PID 1 and serves exec, processes and files over
/// HTTP behind a token.
#[derive(Parser, Debug)]
#[command(name = "orchard-agent", version)]
struct Args {
    /// Unix socket to listen on.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Serve on this already-listening Unix socket descriptor (the sandbox backend binds
    /// the socket outside the sandbox and passes it in, e.g. as fd 3).
    #[arg(long)]
    listen_fd: Option<i32>,
    /// TCP address to listen on, e.g. 0.0.0.0:7070.
    #[arg(long)]
    tcp: Option<SocketAddr>,
    /// The sandbox token (prefer --token-file or ORCHARD_AGENT_TOKEN: argv is visible
    /// to every process in the sandbox).
    #[arg(long)]
    token: Option<String>,
    /// File holding the sandbox token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Largest JSON request body in bytes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: u64,
    /// Largest uploaded file or archive in bytes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_UPLOAD_BYTES)]
    max_upload_bytes: u64,
    /// Commands running at once.
    #[arg(long, default_value_t = config::DEFAULT_MAX_CONCURRENT_EXECS)]
    max_concurrent_execs: u64,
    /// Per-stream output cap of a sync exec in bytes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_OUTPUT_BYTES)]
    max_output_bytes: u64,
    /// Largest per-stream output cap a request may ask for, in bytes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_OUTPUT_CEILING_BYTES)]
    max_output_ceiling_bytes: u64,
    /// Ring buffer per stream of a background process in bytes.
    #[arg(long, default_value_t = config::DEFAULT_PROCESS_BUFFER_BYTES)]
    process_buffer_bytes: u64,
    /// Timeout of a command that sets none, in milliseconds.
    #[arg(long, default_value_t = config::DEFAULT_TIMEOUT_MS)]
    default_timeout_ms: u64,
    /// How long an exited background process stays retrievable, in milliseconds.
    #[arg(long, default_value_t = config::DEFAULT_PROCESS_RETENTION_MS)]
    process_retention_ms: u64,
    /// Milliseconds between keepalive frames of a quiet streamed exec.
    #[arg(long, default_value_t = 15_000)]
    keepalive_ms: u64,
    /// Run every command as this user: `UID:GID[,GROUP...]` (the image's `User`). The
    /// agent itself stays root.
    #[arg(long)]
    user: Option<orchard_agent::pid1::user::RunAs>,
    /// Publish the harness tools found in DIR/bin (a path inside the sandbox, e.g.
    /// /opt/sandbox-tools): shims in /usr/local/bin for tools the image lacks and an
    /// /etc/profile.d entry, before serving (see the `tools` module).
    #[arg(long, value_name = "DIR")]
    publish_tools: Option<String>,
    /// Async worker threads. One by default: with two, a request's task often moves
    /// to the other worker, whose thread must then be woken and scheduled, and on a
    /// machine whose cores are all busy that wait is a scheduler tick (4 ms) per hop;
    /// one worker measured p99 0.6 ms against 8 ms under such load (see
    /// `bench/results/scale.md`). Blocking work runs on its own pool either way.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Scheduler slice, in microseconds, asked for the agent's threads and inherited by
    /// the commands it starts (see the `orchard-sched` crate); 0 keeps the kernel's default.
    #[arg(long, default_value_t = 100)]
    latency_slice_us: u64,
    /// Milliseconds between SIGTERM and SIGKILL on timeout.
    #[arg(long, default_value_t = 500)]
    kill_grace_ms: u64,
    /// Write this process's environment as `NAME=VALUE\0...` to stdout and exit. Not
    /// the agent: the helper a session runs to capture its exported variables exactly
    /// (see the `session` module).
    #[arg(long, hide = true)]
    print_env0: bool,
}

/// `--print-env0`: the environment, byte for byte, and nothing else.
fn print_env0() -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (name, value) in std::env::vars_os() {
        out.write_all(name.as_bytes())?;
        out.write_all(b"=")?;
        out.write_all(value.as_bytes())?;
        out.write_all(b"\0")?;
    }
    out.flush().context("writing the environment")
}

fn token(args: &Args) -> anyhow::Result<String> {
    let token = if let Some(t) = &args.token {
        t.clone()
    } else if let Some(path) = &args.token_file {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading token file {}", path.display()))?
            .trim()
            .to_string()
    } else if let Ok(t) = std::env::var("ORCHARD_AGENT_TOKEN") {
        t
    } else {
        bail!("no token: give --token-file, --token or ORCHARD_AGENT_TOKEN");
    };
    if token.is_empty() {
        bail!("the token is empty");
    }
    Ok(token)
}

fn main() -> anyhow::Result<()> {
    // The init half of a split PID 1 (see the `init` module): it must stay dumpable, so
    // this comes before anything else.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv
        .get(1)
        .is_some_and(|a| a == orchard_agent::pid1::init::INIT_FLAG)
    {
        std::process::exit(orchard_agent::pid1::init::run_init(&argv));
    }
    // Not dumpable: processes of the sandbox, root included, cannot ptrace the agent,
    // take its descriptors (pidfd_getfd: the listening socket) or read its memory and
    // its first environment (/proc/1/environ still holds the token removed below);
    // all of that needs CAP_SYS_PTRACE now, which sandboxes do not have. Commands the
    // agent starts, and the init `split` re-executes, are dumpable again after execve.
    // Best effort: an agent that cannot clear the flag still serves.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    // As PID 1: leave PID 1 to a dumpable init holding the image's environment and
    // nothing secret, and go on as its non-dumpable child. Before the token is read.
    orchard_agent::pid1::init::split();
    let args = Args::parse();
    if args.print_env0 {
        return print_env0();
    }
    // JSON lines on stderr, warnings only unless asked: the agent is on every exec's
    // path and logs nothing per request. Commands do not inherit the setting.
    let level = std::env::var("ORCHARD_AGENT_LOG").unwrap_or_else(|_| "warn".into());
    std::env::remove_var("ORCHARD_AGENT_LOG");
    orchard_log::set_level(&level);
    let mut config = Config::new(token(&args)?);
    // Commands must not see the token in their environment.
    std::env::remove_var("ORCHARD_AGENT_TOKEN");
    if let Some(user) = args.user.clone() {
        orchard_agent::pid1::user::set_run_as(user);
    }
    if let Some(dir) = &args.publish_tools {
        let path = std::env::var("PATH").unwrap_or_default();
        let done = orchard_agent::pid1::tools::publish(std::path::Path::new("/"), dir, &path);
        for warning in &done.warnings {
            tracing::warn!(warning = %warning, "publishing the harness tools");
        }
    }
    config.unix = args.unix.clone();
    config.listen_fd = args.listen_fd;
    config.tcp = args.tcp;
    config.kill_grace = Duration::from_millis(args.kill_grace_ms);
    config.keepalive = Duration::from_millis(args.keepalive_ms.max(10));
    let l = &mut config.limits;
    l.max_body_bytes = args.max_body_bytes;
    l.max_upload_bytes = args.max_upload_bytes;
    l.max_concurrent_execs = args.max_concurrent_execs.max(1);
    l.max_output_bytes = args.max_output_bytes;
    l.max_output_ceiling_bytes = args.max_output_ceiling_bytes;
    l.process_buffer_bytes = args.process_buffer_bytes;
    l.default_timeout_ms = args.default_timeout_ms.max(1);
    l.process_retention_ms = args.process_retention_ms;

    // Before the runtime starts: its threads, and every command, inherit the slice.
    let slice = Duration::from_micros(args.latency_slice_us);
    if !slice.is_zero() {
        if let Err(e) = orchard_sched::set_thread_slice(slice) {
            tracing::warn!(error = %e, "could not ask for a short scheduler slice");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .max_blocking_threads(64)
        // Threads that stay alive keep the agent serving when a fork bomb has used up
        // the sandbox's pids limit and no new thread could be created.
        .thread_keep_alive(Duration::from_secs(365 * 24 * 3600))
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(orchard_agent::server::run(config))
        .context("orchard-agent")?;
    Ok(())
}
