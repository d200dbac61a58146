//! What the scale benchmark needs of the host: a real `orchard serve` on a temporary
//! data directory, the floors (`runc run` of `true` from the same image layers, a bare
//! fork/exec of `true`), a CPU hog on every core, the machine's pressure, and an audit
//! of what a run left behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A running `orchard serve` on its own data directory; stopped (SIGTERM, which deletes
/// its sandboxes) and removed on drop.
pub struct Server {
    child: Child,
    /// Its data directory.
    pub data: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its API key.
    pub key: String,
}

impl Server {
    /// Starts `orchard` (`serve`) with `extra` flags and imports the OCI layout at
    /// `image_dir` as `busybox:latest`.
    pub fn start(
        orchard: &Path,
        agent: &Path,
        image_dir: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Server> {
        let data = std::env::temp_dir().join(format!("orchard-scale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let key = format!("scale-{}", std::process::id());
        let log = std::fs::File::create(data.join("server.log"))?;
        let mut cmd = Command::new(orchard);
        // A session of its own, as a service started by systemd would be: with
        // autogroup scheduling a session is its own scheduling group, and sharing the
        // bench's (whose floor spawns and clients are busy) would charge the server for
        // the bench's CPU time.
        // SAFETY: `setsid` and `prctl` are async-signal-safe system calls; nothing is
        // allocated between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                let _ = rustix::process::setsid();
                // Out of the terminal's process group, Ctrl-C no longer reaches the
                // server: it ends with this process instead.
                let _ = rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::TERM,
                ));
                Ok(())
            });
        }
        let child = cmd
            .args(["serve", "--listen", "127.0.0.1:0", "--log-level", "warn"])
            .arg("--data-dir")
            .arg(&data)
            .arg("--api-key")
            .arg(&key)
            .arg("--ready-file")
            .arg(data.join("url"))
            .args(extra)
            .env("ORCHARD_AGENT_BIN", agent)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", orchard.display()))?;
        let mut server = Server {
            child,
            data,
            url: String::new(),
            key,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(u) = std::fs::read_to_string(server.data.join("url")) {
                if !u.trim().is_empty() {
                    server.url = u.trim().to_string();
                    break;
                }
            }
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "orchard serve exited ({status}); see {}",
                    server.data.join("server.log").display()
                );
            }
            if Instant::now() > deadline {
                bail!("orchard serve did not start within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let tar = Command::new("tar")
            .arg("-C")
            .arg(image_dir)
            .args(["-cf", "-", "."])
            .output()?;
        if !tar.status.success() {
            bail!("tar of {} failed", image_dir.display());
        }
        let status = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", "-H"])
            .arg(format!("X-API-Key: {}", server.key))
            .args(["--data-binary", "@-"])
            .arg(format!(
                "{}/v1/images/import?name=busybox:latest",
                server.url
            ))
            .stdin(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().map(|mut i| i.write_all(&tar.stdout));
                c.wait()
            })?;
        if !status.success() {
            bail!("importing the image failed ({status})");
        }
        Ok(server)
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server and waits for it (it deletes its sandboxes first).
    pub fn stop(&mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        self.child.wait()?;
        Ok(t.elapsed())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.stop();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// An OCI bundle running `true` in the server's unpacked image (an overlay of its
/// layers, as a sandbox's root), for `runc run`: the floor of a create.
pub struct FloorBundle {
    dir: PathBuf,
    rootfs: PathBuf,
    runc_root: PathBuf,
    n: usize,
}

impl FloorBundle {
    /// Builds the bundle under `server`'s data directory from the image `reference`.
    pub fn new(server: &Server) -> anyhow::Result<FloorBundle> {
        let images = server.data.join("images");
        let record = std::fs::read_dir(images.join("images"))?
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().contains("busybox"))
            .context("no busybox image record")?;
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(record.path())?)?;
        let mut lower: Vec<String> = v["diff_ids"]
            .as_array()
            .context("no diff_ids")?
            .iter()
            .filter_map(|d| d.as_str()?.strip_prefix("sha256:"))
            .map(|h| images.join("layers").join(h).display().to_string())
            .collect();
        lower.reverse();
        let dir = server.data.join("floor");
        let (rootfs, upper, work, runc_root) = (
            dir.join("rootfs"),
            dir.join("upper"),
            dir.join("work"),
            dir.join("runc"),
        );
        for d in [&rootfs, &upper, &work, &runc_root] {
            std::fs::create_dir_all(d)?;
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            work.display()
        );
        let st = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&rootfs)
            .status()?;
        if !st.success() {
            bail!("mounting the floor's overlay failed");
        }
        // From here the guard unmounts and removes the bundle on any error.
        let bundle = FloorBundle {
            dir,
            rootfs,
            runc_root,
            n: 0,
        };
        let st = Command::new("runc")
            .args(["spec", "--bundle"])
            .arg(&bundle.dir)
            .status()?;
        if !st.success() {
            bail!("runc spec failed");
        }
        let path = bundle.dir.join("config.json");
        let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = serde_json::json!(["true"]);
        spec["root"]["readonly"] = true.into();
        std::fs::write(&path, serde_json::to_vec(&spec)?)?;
        Ok(bundle)
    }

    /// One `runc run` of `true`; its wall time.
    pub async fn run(&mut self) -> anyhow::Result<Duration> {
        self.n += 1;
        let id = format!("orchard-scale-floor-{}-{}", std::process::id(), self.n);
        run_once(&self.dir, &self.runc_root, &id).await
    }

    /// `n` `runc run`s of `true` at once; the wall time of each.
    pub async fn run_many(&mut self, n: usize) -> anyhow::Result<Vec<Duration>> {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                self.n += 1;
                let id = format!("orchard-scale-floor-{}-{}", std::process::id(), self.n);
                let (dir, root) = (self.dir.clone(), self.runc_root.clone());
                tokio::spawn(async move { run_once(&dir, &root, &id).await })
            })
            .collect();
        let mut out = Vec::new();
        let mut failed = None;
        // Every task is awaited even after a failure: none is left running detached.
        for t in tasks {
            match t.await {
                Ok(Ok(d)) => out.push(d),
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(e) => failed = failed.or(Some(e.into())),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

async fn run_once(bundle: &Path, root: &Path, id: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let status = tokio::process::Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await?;
    if !status.success() {
        bail!("runc run failed ({status})");
    }
    Ok(t.elapsed())
}

impl Drop for FloorBundle {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.rootfs).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A busy loop on every core (one pinned to each), at the default nice level, policy and
/// slice, in a session of its own; stopped on drop.
pub struct Hog {
    children: Vec<Child>,
}

impl Hog {
    /// One `sh` busy loop per core, each bounded by `limit` in case this process dies.
    pub fn start(limit: Duration) -> anyhow::Result<Hog> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        // The guard exists before the first loop starts: a failed spawn stops the
        // loops already running.
        let mut hog = Hog {
            children: Vec::new(),
        };
        // The CPUs this process may use, by number (not 0..cores: they need not be).
        let allowed = rustix::thread::sched_getaffinity(None)?;
        let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|c| allowed.is_set(*c))
            .take(cores)
            .collect();
        for core in cpus {
            let mut cmd = Command::new("timeout");
            cmd.arg(format!("{}", limit.as_secs().max(1)))
                .args(["sh", "-c", "while :; do :; done"])
                .stdin(Stdio::null());
            // SAFETY: between fork and exec the hook makes three system calls and
            // allocates nothing. It puts the hog back on the kernel's default slice
            // (this process asks for a short one): a hog is an ordinary task. And it
            // starts a session of its own, as a build started from another shell or
            // by a service would be: with autogroup scheduling a session is its own
            // group, so the hog does not share this process's group with the server.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(move || {
                    let _ = orchard_sched::set_thread_slice(Duration::ZERO);
                    let _ = rustix::process::setsid();
                    // One loop on each core, kept there: left alone, the kernel
                    // sometimes puts both loops on one core (by weight that is
                    // balanced: each loop is a group of its own) and the other core
                    // is then free for the measured calls, which is no hog at all.
                    let mut one = rustix::thread::CpuSet::new();
                    one.set(core);
                    let _ = rustix::thread::sched_setaffinity(None, &one);
                    Ok(())
                });
            }
            hog.children.push(cmd.spawn()?);
        }
        Ok(hog)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        // SIGTERM, which `timeout` passes on to its loop; SIGKILL would kill `timeout`
        // alone and leave the loop running (found the hard way: a later run measured
        // next to two orphaned loops).
        for c in &mut self.children {
            let pid = rustix::process::Pid::from_child(c);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let _ = c.wait();
        }
    }
}

/// Wall times of `n` spawn-and-wait of `true` on the host, one after another: the
/// floor of an exec.
pub fn spawn_floor(n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let st = Command::new("true").status()?;
        out.push(t.elapsed());
        if !st.success() {
            bail!("true failed");
        }
    }
    Ok(out)
}

/// Like [`spawn_floor`], from `orchard-floor` (next to this program) in a session of
/// its own. Why: with autogroup scheduling a session is one scheduling group, and a
/// client that spawns the floor's children itself is charged for their CPU time and
/// then waits longer to be woken for its own calls, which measured the floor into the
/// client's latency.
pub fn spawn_floor_apart(n: usize) -> anyhow::Result<Vec<Duration>> {
    let exe = std::env::current_exe()?.with_file_name("orchard-floor");
    let mut cmd = Command::new(&exe);
    cmd.arg(n.to_string()).stdin(Stdio::null());
    // SAFETY: `setsid` is a single async-signal-safe system call; nothing is
    // allocated between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let _ = rustix::process::setsid();
            Ok(())
        });
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.parse().ok())
        .map(Duration::from_nanos)
        .collect())
}

/// Spawn-and-wait of `true` per second with `tasks` concurrent spawners for `dur`:
/// the floor of exec throughput.
pub async fn spawn_throughput(tasks: usize, dur: Duration) -> f64 {
    let started = Instant::now();
    let deadline = started + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    if let Ok(s) = tokio::process::Command::new("true").status().await {
                        n += u64::from(s.success());
                    }
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap_or(0);
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// `MemAvailable` in bytes.
pub fn mem_available() -> u64 {
    meminfo("MemAvailable:")
}

/// `MemTotal` in bytes.
pub fn mem_total() -> u64 {
    meminfo("MemTotal:")
}

fn meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// The machine's pressure now: load average and the PSI `some avg10` of CPU, memory
/// and I/O where the kernel has them.
pub fn pressure() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let psi = |what: &str| {
        std::fs::read_to_string(format!("/proc/pressure/{what}"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .next()?
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("avg10=").map(str::to_string))
            })
            .unwrap_or_else(|| "n/a".into())
    };
    format!(
        "load {} | PSI avg10 cpu {}% memory {}% io {}% | MemAvailable {:.1} GiB",
        load.join(" "),
        psi("cpu"),
        psi("memory"),
        psi("io"),
        mem_available() as f64 / (1u64 << 30) as f64
    )
}

/// Resident set of `pid` in bytes.
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Open descriptors of `pid`.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// What is left of a server's sandboxes under `data`: mounts below it, runc
/// containers in its roots, and `orchard-agent` processes. Empty when clean. The disk
/// pool's mounts (images made ahead for the next creates, `diskpool/`) are the running
/// server's own, not a sandbox's: they go when it stops.
pub fn leftovers(data: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let prefix = data.display().to_string();
    if let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") {
        let n = m
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .nth(4)
                    .is_some_and(|p| p.starts_with(&prefix) && !p.contains("/diskpool/"))
            })
            .count();
        if n > 0 {
            out.push(format!("{n} mounts under {prefix}"));
        }
    }
    if let Ok(rd) = std::fs::read_dir(data.join("backend").join("runc")) {
        let n = rd.count();
        if n > 0 {
            out.push(format!("{n} runc container states"));
        }
    }
    let agents = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "orchard-agent")
                })
                .count()
        })
        .unwrap_or(0);
    if agents > 0 {
        out.push(format!("{agents} orchard-agent processes"));
    }
    out
}
