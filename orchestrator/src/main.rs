//! `orchard`: the orchestrator (`orchard serve`, the library of this crate) and the CLI
//! for people (`orchard sandbox ...`, `orchard image ...`, `orchard snapshot ...`, the
//! `orchard-cli` crate). A thin layer over the two.

use clap::{Parser, Subcommand};

use orchard::config::{Config, ServeArgs};
use orchard_cli::{self as cli, Connect, ImageCommand, SandboxCommand, SnapshotCommand};

/// mimalloc rather than glibc's malloc: under exec load the server's allocations
/// (request and job records, HTTP buffers, futures) freed on other threads than they
/// were made on cost glibc about 15% of the server's CPU in `malloc`, `free` and their
/// arena locks and consolidation (measured with perf, `docs/scale.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Orchard Env: sandboxes from any container image, driven turn by turn.
#[derive(Parser, Debug)]
#[command(name = "orchard", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the REST API (Orchard-compatible routes and /v1).
    Serve(Box<ServeArgs>),
    /// Sandboxes on a server: create, ls, exec, rm, shell, pause, resume, snapshot.
    Sandbox {
        #[command(flatten)]
        connect: Connect,
        #[command(subcommand)]
        command: SandboxCommand,
    },
    /// Snapshots on a server: ls, get, rm, fork.
    Snapshot {
        #[command(flatten)]
        connect: Connect,
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// Images on a server: pull, import, ls, rm.
    Image {
        #[command(flatten)]
        connect: Connect,
        #[command(subcommand)]
        command: ImageCommand,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Command::Serve(args) = &cli.command {
        builder.worker_threads(args.workers.unwrap_or(1).max(1));
        // Before the runtime starts: its threads inherit the slice.
        let slice = std::time::Duration::from_micros(args.latency_slice_us.unwrap_or(100));
        if !slice.is_zero() {
            if let Err(e) = orchard_sched::set_thread_slice(slice) {
                eprintln!("orchard: could not ask for a short scheduler slice: {e}");
            }
        }
        let nice = args.group_nice.unwrap_or(orchard_sched::SERVER_GROUP_NICE);
        if nice != 0 {
            if let Err(e) = orchard_sched::set_autogroup_nice(nice) {
                eprintln!(
                    "orchard: could not set the server's scheduling group to nice {nice}: {e}"
                );
            }
        }
    }
    let runtime = builder.enable_all().build()?;
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => {
                let config = Config::resolve(*args)?;
                orchard::serve::serve(config).await?;
                Ok::<i32, anyhow::Error>(0)
            }
            Command::Sandbox { connect, command } => Ok(cli::sandbox(&connect, command).await?),
            Command::Image { connect, command } => Ok(cli::image(&connect, command).await?),
            Command::Snapshot { connect, command } => Ok(cli::snapshot(&connect, command).await?),
        }
    });
    // Sandboxes' streams and terminals may hold tasks open; the answer is final.
    runtime.shutdown_background();
    match code {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("orchard: {e}");
            std::process::exit(1);
        }
    }
}
