//! A sandbox's network.
//!
//! Every sandbox has its own network namespace. By default it holds nothing but `lo`
//! (runc brings it up): there is no route out, so egress is denied without any firewall
//! rule. On request, slirp4netns gives it egress: user-mode TCP/IP attached to a `tap0`
//! in the sandbox (10.0.2.100/24, gateway 10.0.2.2, DNS 10.0.2.3); connections leave
//! through ordinary sockets of the slirp4netns process on the host, so no bridge, veth
//! or iptables rule is involved. slirp4netns is attached after `runc create` and before
//! `runc start`, so the agent starts with the network already up.
//!
//! 10.0.2.2 reaches the host's loopback only with `allow_host_loopback`: it is off by
//! default because the orchestrator and other local services listen there. Private,
//! link-local and the host's own addresses are refused by a filter in the sandbox's
//! namespace, loaded before slirp4netns attaches (see `egress`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::local::process::ProcRef;
use crate::backend::local::runc::tail;

/// Environment variable naming the sandbox on every slirp4netns we start, so an audit
/// can attribute a stray one to its backend and sandbox.
pub const MARKER_ENV: &str = "ORCHARD_SANDBOX";
/// MTU of the tap device (slirp4netns' recommended maximum for throughput).
const MTU: u32 = 65520;
/// The fd slirp4netns writes to once the network is configured.
const READY_FD: i32 = 3;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// slirp4netns could not be started.
    #[error("cannot run {binary}: {source} (install slirp4netns for sandboxes with egress)")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The egress filter could not be loaded.
    #[error(transparent)]
    Firewall(#[from] super::egress::FirewallError),
    /// slirp4netns exited or hung before configuring the network.
    #[error("slirp4netns did not configure the network: {reason}; its log: {log}")]
    NotReady {
        /// Why.
        reason: String,
        /// Its log.
        log: String,
    },
}

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only: no egress.
    #[default]
    None,
    /// Egress through slirp4netns.
    Egress {
        /// Whether 10.0.2.2 reaches the host's 127.0.0.1.
        allow_host_loopback: bool,
    },
}

impl NetworkMode {
    /// Short text for labels: `none`, `egress`, `egress+host-loopback`.
    pub fn label(&self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Egress {
                allow_host_loopback: false,
            } => "egress",
            NetworkMode::Egress {
                allow_host_loopback: true,
            } => "egress+host-loopback",
        }
    }
}

/// `/etc/resolv.conf` of a sandbox with egress: slirp4netns' DNS forwarder.
pub const SLIRP_RESOLV_CONF: &str = "nameserver 10.0.2.3\n";

/// The slirp4netns argv for the network namespace of `pid`.
pub fn slirp_args(pid: i32, allow_host_loopback: bool) -> Vec<String> {
    let mut args = vec![
        "--configure".to_string(),
        format!("--mtu={MTU}"),
        format!("--ready-fd={READY_FD}"),
        // Its own mount namespace and no capabilities but NET_BIND_SERVICE: the process
        // that parses the sandbox's packets keeps as little as possible.
        "--enable-sandbox".into(),
        "--enable-seccomp".into(),
    ];
    if !allow_host_loopback {
        args.push("--disable-host-loopback".into());
    }
    args.push(pid.to_string());
    args.push("tap0".into());
    args
}

/// Starts slirp4netns on the network namespace of `pid` and waits until it has
/// configured `tap0`. `marker` goes into its environment as [`MARKER_ENV`].
pub async fn start_slirp(
    binary: &Path,
    pid: i32,
    allow_host_loopback: bool,
    log: &Path,
    marker: &str,
    limit: Duration,
) -> Result<ProcRef, NetworkError> {
    let spawn_err = |source| NetworkError::Spawn {
        binary: binary.to_path_buf(),
        source,
    };
    let log_file = std::fs::File::create(log).map_err(spawn_err)?;
    let log_file2 = log_file.try_clone().map_err(spawn_err)?;
    let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| spawn_err(e.into()))?;
    let write_raw = write_end.as_raw_fd();
    let mut cmd = Command::new(binary);
    cmd.args(slirp_args(pid, allow_host_loopback))
        .env(MARKER_ENV, marker)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_file2);
    // SAFETY: only dup2 and fcntl, which are async-signal-safe, runs between fork and exec. The
    // duplicate does not carry O_CLOEXEC, so slirp4netns inherits it as fd 3.
    unsafe {
        cmd.pre_exec(move || {
            if write_raw == READY_FD {
                // dup2 onto itself keeps O_CLOEXEC: clear it instead.
                if libc::fcntl(READY_FD, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(write_raw, READY_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(spawn_err)?;
    drop(write_end);
    let pid_of_slirp = child.id() as i32;
    // The Child handle is dropped without waiting: the process is tracked by ProcRef and
    // reaped by whoever stops it.
    drop(child);
    let proc_ref = ProcRef::of(pid_of_slirp).unwrap_or(ProcRef {
        pid: pid_of_slirp,
        start_time: 0,
    });
    let ready = tokio::task::spawn_blocking(move || wait_ready(&read_end, limit))
        .await
        .unwrap_or_else(|e| Err(format!("waiting task failed: {e}")));
    match ready {
        Ok(()) => Ok(proc_ref),
        Err(reason) => {
            let _ = proc_ref
                .terminate(
                    Duration::from_millis(200),
                    Duration::from_secs(5),
                    "slirp4netns",
                )
                .await;
            Err(NetworkError::NotReady {
                reason,
                log: tail(log, 2048),
            })
        }
    }
}

/// Blocks until slirp4netns writes to its ready fd, closes it, or `limit` passes.
fn wait_ready(fd: &OwnedFd, limit: Duration) -> Result<(), String> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut pfd = [PollFd::new(fd, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: limit.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: limit.subsec_nanos().into(),
    };
    match rustix::event::poll(&mut pfd, Some(&timeout)) {
        Ok(0) => return Err(format!("no answer within {limit:?}")),
        Ok(_) => {}
        Err(e) => return Err(format!("poll: {}", io::Error::from(e))),
    }
    let mut buf = [0u8; 8];
    match rustix::io::read(fd, &mut buf) {
        Ok(n) if n > 0 => Ok(()),
        _ => Err("it exited before configuring tap0".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_loopback_is_disabled_unless_asked() {
        let args = slirp_args(42, false);
        assert!(args.contains(&"--disable-host-loopback".to_string()));
        assert_eq!(&args[args.len() - 2..], ["42", "tap0"]);
        assert!(!slirp_args(42, true).contains(&"--disable-host-loopback".to_string()));
    }

    #[test]
    fn modes_serialize_with_a_tag() {
        let v = serde_json::to_value(NetworkMode::Egress {
            allow_host_loopback: true,
        })
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"mode": "egress", "allow_host_loopback": true})
        );
        assert_eq!(NetworkMode::default().label(), "none");
    }

    #[tokio::test]
    async fn a_missing_binary_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = start_slirp(
            Path::new("/no/such/slirp4netns"),
            1,
            false,
            &dir.path().join("log"),
            "t/x",
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("install slirp4netns"), "{e}");
    }
}
