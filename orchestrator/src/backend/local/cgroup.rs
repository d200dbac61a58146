//! Where runc puts a sandbox's cgroups, finding ours, and removing them when runc could
//! not (a crash between `runc create` and `runc delete`).
//!
//! The spec gives runc a *relative* `cgroupsPath`, `orchard-<tag>-<id>`: runc's cgroupfs
//! driver places it under runc's own cgroup in every hierarchy, i.e. under the
//! backend's cgroup (runc is our child). Sandboxes are thereby accounted inside the
//! orchestrator's cgroup, no write access at the hierarchy roots is needed, and the
//! `<tag>` (one per backend root) keeps two backends on one host apart.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// `/proc/self/cgroup` or `/proc/self/mountinfo` could not be read.
    #[error("reading {what}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// A cgroup could not be removed.
    #[error("removing cgroup {path}: {reason}")]
    Remove {
        /// The cgroup directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The directories, one per mounted hierarchy, under which runc (our child) creates
/// cgroups with relative paths: our own cgroup in each.
pub fn parents() -> Result<Vec<PathBuf>, CgroupError> {
    let own = fs::read_to_string("/proc/self/cgroup").map_err(|source| CgroupError::Read {
        what: "/proc/self/cgroup",
        source,
    })?;
    let mountinfo =
        fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Read {
            what: "/proc/self/mountinfo",
            source,
        })?;
    Ok(parents_from(&own, &mountinfo))
}

fn parents_from(own: &str, mountinfo: &str) -> Vec<PathBuf> {
    struct Mount<'a> {
        root: &'a str,
        point: PathBuf,
        v2: bool,
        options: Vec<&'a str>,
    }
    let mounts: Vec<Mount> = mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            let fstype = *f.get(dash + 1)?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(Mount {
                root: f.get(3)?,
                point: PathBuf::from(f.get(4)?),
                v2: fstype == "cgroup2",
                options: f.get(dash + 3)?.split(',').collect(),
            })
        })
        .collect();
    let mut out = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let mount = mounts.iter().find(|m| {
            if ctrls.is_empty() {
                m.v2
            } else {
                !m.v2 && ctrls.split(',').all(|c| m.options.contains(&c))
            }
        });
        let Some(mount) = mount else { continue };
        // Inside a cgroup namespace the mount root is our cgroup, not "/".
        let rel = if mount.root == "/" {
            Some(path)
        } else {
            path.strip_prefix(mount.root)
        };
        let Some(rel) = rel else { continue };
        let dir = mount.point.join(rel.trim_start_matches('/'));
        if !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// Every existing cgroup directory named `name` under the [`parents`].
pub fn dirs_named(parents: &[PathBuf], name: &str) -> Vec<PathBuf> {
    parents
        .iter()
        .map(|p| p.join(name))
        .filter(|d| d.is_dir())
        .collect()
}

/// Names of the cgroups under the [`parents`] starting with `prefix`.
pub fn names_with_prefix(parents: &[PathBuf], prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = parents
        .iter()
        .filter_map(|p| fs::read_dir(p).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Pids in a cgroup (its `cgroup.procs`).
pub fn procs(dir: &Path) -> Vec<i32> {
    ids(dir, &["cgroup.procs"])
}

/// Threads in a cgroup (v1 `tasks`, v2 `cgroup.threads`).
pub fn threads(dir: &Path) -> Vec<i32> {
    ids(dir, &["tasks", "cgroup.threads"])
}

/// The ids listed in the first of `files` in `dir` that can be read, one per line.
fn ids(dir: &Path, files: &[&str]) -> Vec<i32> {
    files
        .iter()
        .find_map(|f| fs::read_to_string(dir.join(f)).ok())
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The CPU weight (v1 `cpu.shares`) a sandbox starts with, until its agent answers,
/// where its cgroup cannot be made idle (see [`start_idle`]): the weight of nice 10
/// (110 against nice 0's 1024). runc turns it into a v2 `cpu.weight` itself.
pub const STARTING_CPU_SHARES: u64 = 110;
/// The kernel's default CPU weight of a cgroup, v1 and v2.
const NORMAL_CPU_SHARES: &str = "1024";
const NORMAL_CPU_WEIGHT: &str = "100";

/// Makes the sandbox's CPU cgroup (among `dirs`) before runc does, marked idle
/// (`cpu.idle` 1, kernel 5.15 and later): its start (runc's init, the agent's, their
/// mounts) is background work like runc itself (see `background.rs`). Each sandbox is
/// a cgroup beside the running ones; at a low weight (110) tenant A's starting
/// sandboxes still held the CPU for whole 4 ms ticks while tenant B's agent waited to
/// run its exec (6 to 16 ms, issue 30). An idle group weighs 3 and, above all, any
/// waking task of a non-idle group preempts it at once. runc reuses a cgroup it finds
/// (runc 1.1 does not write `cpu.idle` on v1 itself), and it must then not be given
/// a weight: the kernel refuses one on an idle group. Returns whether one was made
/// idle; where none can be, the caller starts the sandbox at [`STARTING_CPU_SHARES`].
/// The directory is removed with the sandbox's other cgroups.
pub fn start_idle(dirs: &[PathBuf]) -> bool {
    let mut idle = false;
    for dir in dirs {
        let Some(parent) = dir.parent() else { continue };
        if !parent.join("cpu.idle").exists() {
            continue;
        }
        let made = fs::create_dir(dir)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| fs::write(dir.join("cpu.idle"), "1"));
        match made {
            Ok(()) => idle = true,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "a starting sandbox's cgroup could not be made idle")
            }
        }
    }
    idle
}

/// A ready sandbox runs at normal priority: every thread in the cgroups `dirs` under
/// the normal policy at nice 0 (runc started it idle and niced, see `background.rs`)
/// and the cgroup no longer idle, at the
/// default CPU weight (see [`start_idle`]). Best effort: a thread that exited
/// meanwhile is gone anyway, and a hierarchy without the CPU controller has no weight.
pub fn run_at_normal_priority(dirs: &[PathBuf]) {
    let mut seen = std::collections::HashSet::new();
    for dir in dirs {
        // Idle first: the kernel refuses a weight while the group is idle.
        for (file, value) in [
            ("cpu.idle", "0"),
            ("cpu.shares", NORMAL_CPU_SHARES),
            ("cpu.weight", NORMAL_CPU_WEIGHT),
        ] {
            let path = dir.join(file);
            if path.exists() {
                if let Err(e) = fs::write(&path, value) {
                    tracing::warn!(path = %path.display(), error = %e, "could not restore a sandbox's CPU weight");
                }
            }
        }
        for tid in threads(dir) {
            if seen.insert(tid) {
                // SAFETY: sched_param is plain integers, and all zeros is priority 0
                // (musl's has more fields than glibc's, so no struct literal).
                let normal: libc::sched_param = unsafe { std::mem::zeroed() };
                // SAFETY: both only change the scheduling of thread `tid`; `normal`
                // outlives the call.
                unsafe {
                    libc::sched_setscheduler(tid, libc::SCHED_OTHER, &normal);
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 0);
                }
            }
        }
    }
}

/// Thaws a frozen cgroup (v1 `freezer.state`, v2 `cgroup.freeze`), so that processes
/// sent SIGKILL while frozen die; a cgroup without a freezer is left alone.
pub fn thaw(dir: &Path) {
    let v1 = dir.join("freezer.state");
    if v1.exists() {
        let _ = fs::write(v1, "THAWED");
    }
    let v2 = dir.join("cgroup.freeze");
    if v2.exists() {
        let _ = fs::write(v2, "0");
    }
}

/// Whether the cgroup is frozen or freezing.
pub fn frozen(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("freezer.state")) {
        Ok(s) => s.trim() != "THAWED",
        Err(_) => fs::read_to_string(dir.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1"),
    }
}

/// Kills whatever still runs in `dir` (and its children cgroups) and removes it. A
/// missing directory is fine.
pub async fn remove(dir: &Path, limit: Duration) -> Result<(), CgroupError> {
    if !dir.is_dir() {
        return Ok(());
    }
    let err = |reason: String| CgroupError::Remove {
        path: dir.to_path_buf(),
        reason,
    };
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                Box::pin(remove(&e.path(), limit)).await?;
            }
        }
    }
    let deadline = Instant::now() + limit;
    loop {
        let pids = procs(dir);
        if pids.is_empty() {
            match fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                // EBUSY: a process is still leaving.
                Err(e) if Instant::now() >= deadline => return Err(err(e.to_string())),
                Err(_) => {}
            }
        } else {
            // These pids are in the sandbox's cgroup, so they are the sandbox's
            // processes. One already gone is fine.
            for pid in pids.iter().filter_map(|&p| Pid::from_raw(p.max(0))) {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            if Instant::now() >= deadline {
                return Err(err(format!("processes {pids:?} do not die")));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The cgroup names a process is in, one per hierarchy (last path component).
pub fn process_cgroup_paths(pid: i32) -> Vec<String> {
    fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| {
            t.lines()
                .filter_map(|l| l.splitn(3, ':').nth(2).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 /ns /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
";

    #[test]
    fn parents_join_our_cgroup_to_each_hierarchy() {
        let own = "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n\
                   8:pids:/ns/x\n7:blkio:/\n0::/\n";
        let got = parents_from(own, MOUNTINFO);
        let want: Vec<PathBuf> = [
            "/sys/fs/cgroup/systemd",
            "/sys/fs/cgroup/memory/process_api/abc",
            "/sys/fs/cgroup/cpuacct",
            "/sys/fs/cgroup/cpu",
            "/sys/fs/cgroup/pids/x",
            "/sys/fs/cgroup/unified",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
    }
}
