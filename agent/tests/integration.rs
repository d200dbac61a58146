//! Integration tests of `orchard-agent`: the static musl binary running as PID 1 of a
//! runc sandbox (see `util`), driven over its Unix socket with `orchard-client`.
//!
//! Every test starts its own sandbox and tears it down with `Sandbox::stop`, which also
//! asserts that no container, mount or cgroup was left behind.
//!
//! They need root and runc: as another user every test starts with
//! `orchard_test_support::require_runc!()`, which prints `skipped: <test> needs root and
//! runc` and passes.

mod adversarial;
mod agent_only;
mod exec;
mod files;
mod frames;
mod health;
mod kept;
mod pid1;
mod placement;
mod process;
mod routes;
mod session;
mod session_state;
mod terminal;
mod util;

use std::collections::BTreeSet;
use std::io::Read;
use std::time::{Duration, Instant};

use axum::http::Method;
use bytes::Bytes;
use orchard_client::ClientError;
use orchard_protocol::exec::ExitInfo;
use orchard_protocol::files::FileKind;
use orchard_protocol::openapi::{agent_routes, Body};
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::process::{ProcessState, SignalRequest, StdinWrite};
use orchard_protocol::session::{SessionInfo, SessionRunResult};
use orchard_protocol::signal::Signal;
use orchard_protocol::{Encoding, ErrorBody, ErrorCode, ExecEvent};
use orchard_test_support::tar_gz;
use util::*;

/// The agent's version, which its health must report.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn text(data_b64: &str) -> String {
    String::from_utf8(b64_decode(data_b64).expect("base64 chunk")).expect("utf-8 chunk")
}

/// `(state, comm, ppid)` of every process in the sandbox, from `/proc/*/stat`.
async fn sandbox_processes(sb: &Sandbox) -> Vec<(char, String, u32)> {
    let r = sb.sh("cat /proc/[0-9]*/stat 2>/dev/null").await;
    r.stdout
        .text_lossy()
        .lines()
        .filter_map(|line| {
            let open = line.find('(')?;
            let close = line.rfind(')')?;
            let comm = line[open + 1..close].to_string();
            let mut rest = line[close + 1..].split_whitespace();
            let state = rest.next()?.chars().next()?;
            let ppid = rest.next()?.parse().ok()?;
            Some((state, comm, ppid))
        })
        .collect()
}

fn error_body(raw: &orchard_client::RawResponse) -> ErrorBody {
    serde_json::from_slice(&raw.body).unwrap_or_else(|e| {
        panic!(
            "status {} without an error body ({e}): {}",
            raw.status,
            String::from_utf8_lossy(&raw.body)
        )
    })
}
