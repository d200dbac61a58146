//! runc, driven as the command-line program it is, with a `--root` state directory of its
//! own per backend so two backends on one host never see each other's containers.
//!
//! A sandbox is `runc create` (detached; the container's stdio is a log file, the init
//! waits on runc's exec FIFO) then `runc start`; it ends with `runc kill` and
//! `runc delete --force`. Between create and start the backend attaches the network
//! (slirp4netns needs the init's pid and must be ready before the agent starts).
//! The agent's listening socket is made on the host and handed to the container's init
//! as its stdin (runc passes its stdio through), so nothing of it is visible inside the
//! sandbox; the agent moves it off fd 0 at once.
//!
//! runc is started with nothing run between fork and exec (no `pre_exec`), so the
//! standard library spawns it with `posix_spawn`, which shares the server's memory
//! until the exec instead of copying its page tables. A `fork` of the server holds the
//! server's memory map lock for writing while it copies them: issue 30 measured the
//! backend threads preempted 68 times in a second inside that copy during a burst of
//! creates, and the request thread, faulting a page meanwhile, waiting up to 11 ms for
//! the lock. runc's nice value and scheduler slice come from the thread that starts it
//! (the backend's threads, see `backend/offload.rs`).

use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::process::Command;

/// Longest any runc call may take (create on a loaded host included).
const CALL_LIMIT: Duration = Duration::from_secs(120);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    /// runc could not be started.
    #[error("cannot run {binary}: {source} (is runc installed?)")]
    Spawn {
        /// The runc binary.
        binary: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// runc answered an error.
    #[error("runc {command} {id} failed ({status}): {output}")]
    Failed {
        /// The subcommand.
        command: &'static str,
        /// The container.
        id: String,
        /// Its exit status.
        status: String,
        /// What it printed.
        output: String,
    },
    /// runc did not finish in time.
    #[error("runc {command} {id} did not finish within {limit:?}")]
    Timeout {
        /// The subcommand.
        command: &'static str,
        /// The container.
        id: String,
        /// The limit.
        limit: Duration,
    },
    /// `runc list` printed something else than JSON.
    #[error("runc list printed unexpected output: {0}")]
    Parse(String),
}

/// A container as `runc list` / `runc state` show it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Container {
    /// Its id.
    pub id: String,
    /// Host pid of its init (0 once stopped).
    pub pid: i32,
    /// `created`, `running`, `paused` or `stopped`.
    pub status: String,
    /// Its bundle directory.
    pub bundle: PathBuf,
}

/// runc with one state directory.
#[derive(Debug, Clone)]
pub struct Runc {
    binary: PathBuf,
    root: PathBuf,
}

fn not_found(output: &str) -> bool {
    output.contains("does not exist") || output.contains("not exist")
}

impl Runc {
    /// runc `binary` with state in `root`.
    pub fn new(binary: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            root: root.into(),
        }
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn command(&self) -> Command {
        // In a session and autogroup of its own, weighed at nice 19: see
        // `background.rs`.
        let mut cmd = super::background::command(&self.binary);
        cmd.arg("--root").arg(&self.root).stdin(Stdio::null());
        // A cancelled or timed-out call must not leave runc running on its own.
        cmd.kill_on_drop(true);
        // runc, and a sandbox's start until its agent answers, is background work: runc
        // inherits nice 10 and the kernel's default slice from the backend's thread that
        // starts it, so a tenant's 50 creates at once do not take the cores from another
        // tenant's calls (issue 30). The create sets the sandbox's threads back to nice
        // 0 once it is ready (`cgroup::run_at_normal_priority`); the agent asks for its
        // own short slice. No `pre_exec` here: see the module's header.
        cmd
    }

    /// Starts `cmd` (from [`Runc::command`]) as background work (`background.rs`).
    async fn spawn(&self, cmd: &mut Command) -> std::io::Result<tokio::process::Child> {
        super::background::check_runnable(&self.binary)?;
        let child = cmd.spawn()?;
        super::background::lower(child.id()).await;
        Ok(child)
    }

    /// `work` (starting runc `command` on container `id` and waiting for it), within
    /// [`CALL_LIMIT`]; a failure to start it is a spawn error.
    async fn bounded<T>(
        &self,
        command: &'static str,
        id: &str,
        work: impl std::future::Future<Output = std::io::Result<T>>,
    ) -> Result<T, RuncError> {
        tokio::time::timeout(CALL_LIMIT, work)
            .await
            .map_err(|_| RuncError::Timeout {
                command,
                id: id.to_string(),
                limit: CALL_LIMIT,
            })?
            .map_err(|source| RuncError::Spawn {
                binary: self.binary.clone(),
                source,
            })
    }

    async fn run(
        &self,
        command: &'static str,
        id: &str,
        mut cmd: Command,
    ) -> Result<String, RuncError> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = self
            .bounded(command, id, async {
                self.spawn(&mut cmd).await?.wait_with_output().await
            })
            .await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(RuncError::Failed {
                command,
                id: id.to_string(),
                status: out.status.to_string(),
                output: text.trim().to_string(),
            })
        }
    }

    /// `runc create`: sets the container up with its init waiting to be started. runc's
    /// and the init's output go to `log`, which is also where the agent will write.
    /// `listener` becomes the container's init's stdin (see the module's header).
    pub async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        log: &Path,
        listener: Option<BorrowedFd<'_>>,
    ) -> Result<(), RuncError> {
        self.create_or_run(false, id, bundle, pid_file, log, listener)
            .await
    }

    /// `runc run --detach`: create and start in one runc call, for sandboxes that need
    /// nothing done between the two (one fork/exec of runc less on every create).
    pub async fn run_detached(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        log: &Path,
        listener: Option<BorrowedFd<'_>>,
    ) -> Result<(), RuncError> {
        self.create_or_run(true, id, bundle, pid_file, log, listener)
            .await
    }

    async fn create_or_run(
        &self,
        run: bool,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        log: &Path,
        listener: Option<BorrowedFd<'_>>,
    ) -> Result<(), RuncError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| RuncError::Spawn {
                binary: log.to_path_buf(),
                source,
            })?;
        let file2 = file.try_clone().map_err(|source| RuncError::Spawn {
            binary: log.to_path_buf(),
            source,
        })?;
        let mut cmd = self.command();
        let verb = if run { "run" } else { "create" };
        cmd.arg(verb);
        if run {
            cmd.arg("--detach");
        }
        if let Some(fd) = listener {
            // runc's stdin becomes the init's (runc passes its stdio through).
            let socket = fd.try_clone_to_owned().map_err(|source| RuncError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
            cmd.stdin(Stdio::from(socket));
        }
        cmd.arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(pid_file)
            .arg(id)
            // Not pipes: the container keeps these open for its whole life.
            .stdout(file)
            .stderr(file2);
        let status = self
            .bounded(verb, id, async { self.spawn(&mut cmd).await?.wait().await })
            .await?;
        if status.success() {
            Ok(())
        } else {
            Err(RuncError::Failed {
                command: verb,
                id: id.to_string(),
                status: status.to_string(),
                output: tail(log, 4096),
            })
        }
    }

    /// `runc start`: lets the init exec the agent.
    pub async fn start(&self, id: &str) -> Result<(), RuncError> {
        let mut cmd = self.command();
        cmd.arg("start").arg(id);
        self.run("start", id, cmd).await.map(drop)
    }

    /// `runc pause`: freezes every process of the container (the freezer cgroup).
    pub async fn pause(&self, id: &str) -> Result<(), RuncError> {
        let mut cmd = self.command();
        cmd.arg("pause").arg(id);
        self.run("pause", id, cmd).await.map(drop)
    }

    /// `runc resume`: thaws a paused container.
    pub async fn resume(&self, id: &str) -> Result<(), RuncError> {
        let mut cmd = self.command();
        cmd.arg("resume").arg(id);
        self.run("resume", id, cmd).await.map(drop)
    }

    /// `runc kill ID SIGNAL` (`KILL`, `TERM`, ...); a missing container is fine.
    pub async fn kill(&self, id: &str, signal: &str) -> Result<(), RuncError> {
        let mut cmd = self.command();
        cmd.arg("kill").arg(id).arg(signal);
        match self.run("kill", id, cmd).await {
            Err(RuncError::Failed { output, .. })
                if not_found(&output) || output.contains("not running") =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// `runc delete --force`: kills what still runs and removes the container's state and
    /// cgroups. A missing container is fine.
    pub async fn delete(&self, id: &str) -> Result<(), RuncError> {
        let mut cmd = self.command();
        cmd.arg("delete").arg("--force").arg(id);
        match self.run("delete", id, cmd).await {
            Err(RuncError::Failed { output, .. }) if not_found(&output) => Ok(()),
            other => other.map(drop),
        }
    }

    /// `runc state`; `None` when runc knows no such container.
    pub async fn state(&self, id: &str) -> Result<Option<Container>, RuncError> {
        let mut cmd = self.command();
        cmd.arg("state").arg(id);
        match self.run("state", id, cmd).await {
            Ok(out) => serde_json::from_str(&out)
                .map(Some)
                .map_err(|e| RuncError::Parse(format!("{e}: {out}"))),
            Err(RuncError::Failed { output, .. }) if not_found(&output) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `runc list`: every container in this state directory.
    pub async fn list(&self) -> Result<Vec<Container>, RuncError> {
        // runc list fails when a container is deleted while it reads the state
        // directory; that is transient.
        let mut last = None;
        for _ in 0..20 {
            let mut cmd = self.command();
            cmd.args(["list", "--format", "json"]);
            match self.run("list", "", cmd).await {
                Ok(out) => {
                    let out = out.trim();
                    if out.is_empty() || out == "null" {
                        return Ok(Vec::new());
                    }
                    return serde_json::from_str(out)
                        .map_err(|e| RuncError::Parse(format!("{e}: {out}")));
                }
                Err(e @ RuncError::Failed { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(last.unwrap_or(RuncError::Parse("no answer".into())))
    }
}

/// The last `max` bytes of a file, as text (for error messages).
pub fn tail(path: &Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_output_parses() {
        let out = r#"[{"ociVersion":"1.0.2-dev","id":"a","pid":42,"status":"running",
            "bundle":"/b/a","rootfs":"/b/a/rootfs","created":"2024-01-01T00:00:00Z","owner":"root"}]"#;
        let list: Vec<Container> = serde_json::from_str(out).unwrap();
        assert_eq!(list[0].id, "a");
        assert_eq!((list[0].pid, list[0].status.as_str()), (42, "running"));
    }

    #[test]
    fn tail_keeps_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "0123456789").unwrap();
        assert_eq!(tail(&p, 4), "6789");
        assert_eq!(tail(&dir.path().join("none"), 4), "");
    }

    #[tokio::test]
    async fn a_missing_runc_is_a_clear_error() {
        let runc = Runc::new("/no/such/runc", "/tmp/none");
        let e = runc.start("x").await.unwrap_err();
        assert!(e.to_string().contains("is runc installed"), "{e}");
    }
}
