//! The runc fixture: a [`Runc`] on its own `--root` (so tests never see each other's
//! containers, nor the host's), unique container ids, reaping a container's init, the
//! cgroups runc makes for it, and scratch directories that go when the test process
//! exits, also after a failed test.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// runc with its own state directory.
#[derive(Debug, Clone)]
pub struct Runc {
    /// runc's `--root`.
    pub root: PathBuf,
}

impl Runc {
    /// runc keeping its state in `root` (created if missing).
    pub fn new(root: PathBuf) -> Runc {
        fs::create_dir_all(&root).expect("creating runc's root");
        Runc { root }
    }

    /// `runc --root <root>`, for the caller to add arguments and run.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(&self.root).stdin(Stdio::null());
        cmd
    }

    /// Runs `runc --root <root> ARGS`; answers (success, stdout + stderr).
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        match self.command().args(args).output() {
            Ok(out) => (
                out.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            ),
            Err(e) => (false, format!("cannot run runc: {e}")),
        }
    }

    /// Ids of the containers runc knows. `runc list` fails when another test deletes a
    /// container while it reads the state directory; that is transient, so it is
    /// retried.
    pub fn list(&self) -> Vec<String> {
        let mut attempts = 0;
        loop {
            let (ok, list) = self.run(&["list", "-q"]);
            if ok {
                return list.lines().map(|l| l.trim().to_string()).collect();
            }
            attempts += 1;
            assert!(attempts < 20, "runc list keeps failing: {list}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A container or sandbox id unique in this test run: `<prefix>-<pid>-<n>`.
pub fn unique_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Directories removed when the test process exits.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_scratch_at_exit() {
    if let Ok(dirs) = SCRATCH.lock() {
        for dir in dirs.iter() {
            let _ = remove_tree(dir);
        }
    }
}

/// A fresh temporary directory named `<prefix>…` that lives until the test process
/// exits (a `TempDir` in a static would never be dropped).
pub fn scratch_dir(prefix: &str) -> PathBuf {
    static REGISTER: Once = Once::new();
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("creating a scratch directory")
        .keep();
    REGISTER.call_once(|| {
        // SAFETY: registers a plain extern "C" function that takes nothing.
        unsafe {
            libc::atexit(remove_scratch_at_exit);
        }
    });
    if let Ok(mut dirs) = SCRATCH.lock() {
        dirs.push(dir.clone());
    }
    dir
}

/// Makes every directory under `path` writable, then removes the tree (a test may
/// leave read-only directories behind).
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    fn make_writable(path: &Path) {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return;
        };
        if meta.is_dir() {
            let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
            if let Ok(entries) = fs::read_dir(path) {
                for e in entries.flatten() {
                    make_writable(&e.path());
                }
            }
        }
    }
    if !path.exists() {
        return Ok(());
    }
    make_writable(path);
    fs::remove_dir_all(path)
}

/// Makes this process the child subreaper, once: a container's init is reparented to
/// us when `runc run --detach` exits, so we can reap it and leave no zombie behind.
pub fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .expect("prctl(PR_SET_CHILD_SUBREAPER) failed");
    });
}

/// Reaps child `pid` if it has exited, without blocking: `Ok(Some(raw wait status))`
/// once reaped, `Ok(None)` while it runs, an error when it is not our child.
pub fn try_reap(pid: i32) -> std::io::Result<Option<i32>> {
    use rustix::process::{waitpid, Pid, WaitOptions};
    let pid = Pid::from_raw(pid).ok_or_else(|| std::io::Error::other("pid 0 is no child"))?;
    match waitpid(Some(pid), WaitOptions::NOHANG)? {
        None => Ok(None),
        Some((_, status)) => Ok(Some(status.as_raw())),
    }
}

/// Waits up to `timeout` for child `pid` to exit and reaps it; see [`try_reap`].
pub fn reap_within(pid: i32, timeout: Duration) -> std::io::Result<Option<i32>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = try_reap(pid)? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Our cgroup path in `controller`'s hierarchy, from /proc/self/cgroup.
fn own_cgroup(controller: &str) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// Where runc (cgroupfs driver, no cgroupsPath) puts the cgroups of container `id`.
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    ["memory", "pids", "cpu", "freezer"]
        .iter()
        .filter_map(|c| {
            let mount = Path::new("/sys/fs/cgroup").join(c);
            let own = own_cgroup(c)?;
            mount
                .is_dir()
                .then(|| mount.join(own.trim_start_matches('/')).join(id))
        })
        .collect()
}
