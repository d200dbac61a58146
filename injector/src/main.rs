//! `orchard-injector`: the init-container program. Copies the agent (and the harness
//! bundle) into the sandbox volume, verifies the copies and writes `manifest.json`; or,
//! with `--verify`, re-checks a volume against its manifest. Exits non-zero with the
//! reason when anything is missing or wrong. The work is in the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use orchard_injector::{inject, verify, InjectRequest, MANIFEST_NAME};

/// Copies orchard-agent (and the harness bundle) into the sandbox volume and verifies it.
#[derive(Parser, Debug)]
#[command(name = "orchard-injector", version)]
struct Args {
    /// The static orchard-agent binary to inject.
    #[arg(long, required_unless_present = "verify")]
    agent: Option<PathBuf>,
    /// The harness bundle directory (copied to TARGET/harness).
    #[arg(long)]
    harness: Option<PathBuf>,
    /// The volume to fill (created if missing).
    #[arg(long)]
    target: PathBuf,
    /// Only check TARGET against its manifest.
    #[arg(long, conflicts_with_all = ["agent", "harness"])]
    verify: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let manifest = if args.verify {
        verify(&args.target).with_context(|| format!("verifying {}", args.target.display()))?
    } else {
        let req = InjectRequest {
            // clap guarantees --agent without --verify.
            agent: args.agent.context("--agent is required")?,
            harness: args.harness,
            target: args.target.clone(),
        };
        inject(&req).with_context(|| format!("injecting into {}", args.target.display()))?
    };
    println!(
        "orchard-injector: {} {} files ({} bytes{}); manifest {}",
        if args.verify { "verified" } else { "injected" },
        manifest.files.len(),
        manifest.total_bytes,
        if manifest.harness {
            ", harness included"
        } else {
            ""
        },
        args.target.join(MANIFEST_NAME).display()
    );
    Ok(())
}
