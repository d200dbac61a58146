//! Leak audit: everything on the host that belongs to this backend (by its root, its
//! runc state directory, its cgroup names `orchard-<tag>-*`, its slirp4netns marker)
//! but to no live sandbox. Tests run it after every scenario and expect it empty; an
//! operator can run it on a live system, where live sandboxes are not leaks.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::path::PathBuf;

use crate::backend::local::error::LocalError;
use crate::backend::local::inner::Inner;
use crate::backend::local::network::MARKER_ENV;
use crate::backend::local::process::{self, ProcRef};
use crate::backend::local::{cgroup, diskpool};

/// A process that should not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakedProcess {
    /// Host pid.
    pub pid: i32,
    /// Its command name.
    pub comm: String,
    /// Why it is ours.
    pub reason: String,
}

/// What [`crate::backend::local::LocalBackend::audit`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Processes of sandboxes that are gone (container processes, slirp4netns).
    pub processes: Vec<LeakedProcess>,
    /// Mounts under the backend root that no live sandbox uses.
    pub mounts: Vec<PathBuf>,
    /// cgroups named after our sandboxes that are gone.
    pub cgroups: Vec<PathBuf>,
    /// Network namespaces kept alive by leaked processes.
    pub network_namespaces: Vec<String>,
    /// Sandbox and runc state directories of sandboxes that are gone, layer copies of
    /// snapshots whose process died mid-capture, and disk pools of processes that are
    /// gone.
    pub directories: Vec<PathBuf>,
    /// Containers runc still lists that are not live sandboxes.
    pub runc_containers: Vec<String>,
}

impl AuditReport {
    /// Whether nothing leaked.
    pub fn is_clean(&self) -> bool {
        self.processes.is_empty()
            && self.mounts.is_empty()
            && self.cgroups.is_empty()
            && self.network_namespaces.is_empty()
            && self.directories.is_empty()
            && self.runc_containers.is_empty()
    }
}

impl fmt::Display for AuditReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return write!(f, "no leaks");
        }
        for p in &self.processes {
            writeln!(f, "process {} ({}): {}", p.pid, p.comm, p.reason)?;
        }
        for m in &self.mounts {
            writeln!(f, "mount {}", m.display())?;
        }
        for c in &self.cgroups {
            writeln!(f, "cgroup {}", c.display())?;
        }
        for n in &self.network_namespaces {
            writeln!(f, "network namespace {n}")?;
        }
        for d in &self.directories {
            writeln!(f, "directory {}", d.display())?;
        }
        for c in &self.runc_containers {
            writeln!(f, "runc container {c}")?;
        }
        Ok(())
    }
}

pub use super::sys::mounts_under;

fn marker_of(pid: i32) -> Option<String> {
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let key = format!("{MARKER_ENV}=");
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(key.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Every running process carrying a slirp4netns marker, with the marker.
pub fn all_marked_processes() -> Vec<(ProcRef, String)> {
    process::all_pids()
        .into_iter()
        .filter_map(|pid| {
            let marker = marker_of(pid)?;
            let p = ProcRef::of(pid)?;
            p.is_running().then_some((p, marker))
        })
        .collect()
}

/// Running processes carrying `marker`.
pub fn marked_processes(marker: &str) -> Vec<ProcRef> {
    all_marked_processes()
        .into_iter()
        .filter(|(_, m)| m == marker)
        .map(|(p, _)| p)
        .collect()
}

fn netns(pid: i32) -> Option<String> {
    fs::read_link(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

/// The disk pool directories of live processes, and those of processes that are gone
/// (or of this process, with no running pool).
fn pools(inner: &Inner, own_pid: i32) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let own = inner
        .disk_pool
        .as_ref()
        .filter(|p| p.is_running())
        .map(|p| p.dir().to_path_buf());
    let (live, dead): (Vec<_>, Vec<_>) = diskpool::pool_dirs(&inner.root, own_pid as u32)
        .into_iter()
        .partition(|(dir, alive)| *alive || Some(dir) == own.as_ref());
    (
        live.into_iter().map(|(d, _)| d).collect(),
        dead.into_iter().map(|(d, _)| d).collect(),
    )
}

/// The audit (see the module doc).
pub(super) async fn audit(inner: &Inner) -> Result<AuditReport, LocalError> {
    let live: HashSet<String> = inner.lock_table().keys().cloned().collect();
    let mut report = AuditReport::default();
    let own_pid = process::own_pid();

    // runc's view (its root may be gone after destroy).
    if inner.runc.root().exists() {
        for c in inner.runc.list().await? {
            if !live.contains(&c.id) {
                report.runc_containers.push(c.id);
            }
        }
    }
    for dir in [inner.sandboxes_dir.clone(), inner.runc.root().to_path_buf()] {
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !live.contains(&name) {
                    report.directories.push(e.path());
                }
            }
        }
    }
    // A capture's copy whose process died (a snapshot killed half-way).
    report.directories.extend(inner.stale_captures());

    // A live sandbox's overlay and disk, and the live disk pools: this process's, and
    // those of other processes sharing the root.
    let expected: HashSet<PathBuf> = live
        .iter()
        .flat_map(|id| {
            let p = inner.paths(id);
            [p.rootfs, p.disk]
        })
        .collect();
    let (pools, dead_pools) = pools(inner, own_pid);
    report.directories.extend(dead_pools);
    report.directories.sort();
    report.mounts = mounts_under(&inner.root)
        .map_err(|source| LocalError::Io {
            op: "reading",
            path: "/proc/self/mountinfo".into(),
            source,
        })?
        .into_iter()
        .filter(|m| !expected.contains(m) && !pools.iter().any(|p| m.starts_with(p)))
        .collect();

    let prefix = inner.cgroup_prefix();
    let gone = |id: &str| !live.contains(id);
    for name in cgroup::names_with_prefix(&inner.cgroup_parents, &prefix) {
        if name.strip_prefix(&prefix).is_some_and(gone) {
            report
                .cgroups
                .extend(cgroup::dirs_named(&inner.cgroup_parents, &name));
        }
    }

    (report.processes, report.network_namespaces) = leaked_processes(inner, &live, own_pid);
    Ok(report)
}

/// The audit's process step: processes in a gone sandbox's cgroup or marked as its
/// slirp4netns, and the network namespaces they hold.
fn leaked_processes(
    inner: &Inner,
    live: &HashSet<String>,
    own_pid: i32,
) -> (Vec<LeakedProcess>, Vec<String>) {
    let prefix = inner.cgroup_prefix();
    let gone = |id: &str| !live.contains(id);
    let own_netns = netns(own_pid);
    let marker_prefix = format!("{}/", inner.tag);
    let mut namespaces = Vec::new();
    let mut processes = Vec::new();
    for pid in process::all_pids() {
        let Ok(Some(stat)) = process::stat(pid) else {
            continue;
        };
        // A zombie holds no resources; one re-parented to a PID 1 that reaps late is
        // not ours to reap. Our own unreaped children are leaks.
        if stat.state == 'Z' && stat.ppid != own_pid {
            continue;
        }
        let mut reason = None;
        for path in cgroup::process_cgroup_paths(pid) {
            let last = path.rsplit('/').next().unwrap_or("");
            if let Some(id) = last.strip_prefix(&prefix) {
                if gone(id) {
                    reason = Some(format!("in cgroup {path} of gone sandbox {id}"));
                    break;
                }
            }
        }
        if reason.is_none() {
            if let Some(id) =
                marker_of(pid).and_then(|m| m.strip_prefix(&marker_prefix).map(String::from))
            {
                if gone(&id) {
                    reason = Some(format!("slirp4netns of gone sandbox {id}"));
                }
            }
        }
        if let Some(reason) = reason {
            if let Some(ns) = netns(pid).filter(|n| Some(n) != own_netns.as_ref()) {
                let entry = format!("{ns} (held by pid {pid})");
                if !namespaces.contains(&entry) {
                    namespaces.push(entry);
                }
            }
            processes.push(LeakedProcess {
                pid,
                comm: stat.comm,
                reason,
            });
        }
    }
    (processes, namespaces)
}
