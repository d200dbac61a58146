//! `GET /v1/health`: version, uptime, and what the sandbox is using.
//!
//! Usage comes from the sandbox's cgroup when it is mounted (cgroup v2 or v1), since
//! that is what limits are enforced on; otherwise it is summed from `/proc`.
//!
//! Its state, [`HealthState`], is read only: the start time, the [`Commands`] (limits
//! and exec slots in use) and the table of background processes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{FromRef, State};
use axum::routing::get;
use axum::{Json, Router};
use orchard_protocol::health::Health;

use crate::api::exec::Commands;
use crate::api::process::ProcessTable;
use crate::proc::procfs;

/// The health capability's state: when the agent started, the commands (for the
/// limits and the exec slots in use) and the table of background processes (for its
/// size). It reads them, never changes them.
#[derive(Clone)]
pub struct HealthState {
    /// When the agent started.
    pub started: Instant,
    /// The limits and the exec slots.
    pub commands: Commands,
    /// Background processes.
    pub processes: Arc<ProcessTable>,
}

/// Routes of the health capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    HealthState: FromRef<S>,
{
    Router::new().route("/v1/health", get(health))
}

/// `GET /v1/health`.
async fn health(State(state): State<HealthState>) -> Json<Health> {
    // Inline, not on the blocking pool: health must answer even when a fork bomb has
    // used up the pids limit and no new thread can start.
    let usage = usage();
    let limits = state.commands.limits();
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_ms: state.started.elapsed().as_millis() as u64,
        pid1: crate::pid1::init::owns_pid1(),
        processes: usage.processes,
        running_execs: state.commands.running(),
        tracked_processes: state.processes.len() as u64,
        memory_bytes: usage.memory_bytes,
        cpu_ms: usage.cpu_ms,
        usage_source: usage.source.into(),
        limits: limits.clone(),
    })
}

/// Resource usage of the sandbox.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Processes in /proc.
    pub processes: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// CPU time in milliseconds.
    pub cpu_ms: u64,
    /// `"cgroup"` or `"procfs"`.
    pub source: &'static str,
}

/// Reads the sandbox's usage.
pub fn usage() -> Usage {
    let procs = procfs::all();
    let processes = procs.len() as u64;
    if let Some((memory_bytes, cpu_ms)) = cgroup_usage() {
        return Usage {
            processes,
            memory_bytes,
            cpu_ms,
            source: "cgroup",
        };
    }
    let page = page_size();
    let ticks = clock_ticks();
    let mut memory_bytes = 0u64;
    for p in &procs {
        if let Ok(statm) = std::fs::read_to_string(format!("/proc/{}/statm", p.pid)) {
            let rss: u64 = statm
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            memory_bytes += rss * page;
        }
    }
    let cpu_ticks: u64 = procs.iter().map(|p| p.cpu_ticks).sum();
    Usage {
        processes,
        memory_bytes,
        cpu_ms: cpu_ticks * 1000 / ticks.max(1),
        source: "procfs",
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 {
        v as u64
    } else {
        100
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Candidate directories of our cgroup under a controller mount: the path from
/// /proc/self/cgroup (host view), then the mount root (a container's own view).
fn cgroup_dirs(mount: &str, controller: Option<&str>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") {
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let matches = match controller {
                None => controllers == Some(""),
                Some(c) => controllers.is_some_and(|cs| cs.split(',').any(|x| x == c)),
            };
            if let (true, Some(path)) = (matches, path) {
                dirs.push(Path::new(mount).join(path.trim_start_matches('/')));
            }
        }
    }
    dirs.push(PathBuf::from(mount));
    dirs
}

fn cgroup_usage() -> Option<(u64, u64)> {
    // cgroup v2.
    for dir in cgroup_dirs("/sys/fs/cgroup", None) {
        if let Some(mem) = read_u64(&dir.join("memory.current")) {
            let cpu_us = std::fs::read_to_string(dir.join("cpu.stat"))
                .ok()
                .and_then(|s| {
                    s.lines().find_map(|l| {
                        l.strip_prefix("usage_usec ")
                            .and_then(|v| v.trim().parse::<u64>().ok())
                    })
                })
                .unwrap_or(0);
            return Some((mem, cpu_us / 1000));
        }
    }
    // cgroup v1.
    let mem = cgroup_dirs("/sys/fs/cgroup/memory", Some("memory"))
        .into_iter()
        .find_map(|d| read_u64(&d.join("memory.usage_in_bytes")))?;
    let cpu_ns = cgroup_dirs("/sys/fs/cgroup/cpuacct", Some("cpuacct"))
        .into_iter()
        .find_map(|d| read_u64(&d.join("cpuacct.usage")))
        .unwrap_or(0);
    Some((mem, cpu_ns / 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_reports_this_process() {
        let u = usage();
        assert!(u.processes >= 1);
        assert!(u.memory_bytes > 0);
    }
}
