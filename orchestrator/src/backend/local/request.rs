//! What a caller asks of the local backend and what it gets back: [`LocalConfig`],
//! [`SandboxSpec`] with its [`Limits`] (in `limits.rs`, a leaf the state file uses too), [`SandboxInfo`], [`RecoverReport`], and the
//! checks and defaults applied to a request before anything is created (ids,
//! hostnames, labels, the environment).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use orchard_client::{AgentClient, Endpoint};

use crate::backend::local::error::LocalError;
use crate::backend::local::network::NetworkMode;
use crate::image::Image;

/// PATH of a sandbox whose image sets none (Docker's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The harness commands, appended to PATH when a harness is injected: the `bin/` of
/// the tools' read-only mount (`spec::TOOLS_MOUNT`), where Orchard users find them.
pub const HARNESS_BIN: &str = "/opt/sandbox-tools/bin";

pub use super::limits::Limits;

/// Where crash tests stop a create (hidden: for the recovery tests only).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    /// After `runc create` (and slirp4netns), before `runc start`: writes `failpoint`
    /// in the sandbox directory and never returns.
    HangAfterRuncCreate,
}

/// How a backend is set up.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The backend's directory (created if missing).
    pub root: PathBuf,
    /// The static agent binary to inject.
    pub agent: PathBuf,
    /// The harness bundle to inject, if any.
    pub harness: Option<PathBuf>,
    /// The runc binary.
    pub runc: PathBuf,
    /// The slirp4netns binary (only needed for sandboxes with egress).
    pub slirp4netns: PathBuf,
    /// The nft binary: loads the egress filter of sandboxes with egress.
    pub nft: PathBuf,
    /// Non-public ranges sandboxes with egress may reach anyway (see `crate::egress`).
    pub egress: crate::egress::EgressPolicy,
    /// How long a create waits for the agent to answer.
    pub ready_timeout: Duration,
    /// Extra arguments of every agent.
    pub agent_args: Vec<String>,
    /// Limits of sandboxes that set none.
    pub default_limits: Limits,
    /// Let sandboxes make user namespaces (the seccomp filter refuses them by default).
    pub allow_user_namespaces: bool,
    /// A size-limited filesystem per sandbox for its writable layer (`disk`); `None`:
    /// writes land on the backend root's filesystem unbounded.
    pub disk: Option<super::disk::DiskLimit>,
    /// Disk images kept ready ahead of creates when `disk` is set (see `diskpool`); 0
    /// makes each create make its own (about 20 ms more per create).
    pub disk_pool: usize,
    /// How long `open` waits for the root's lock: a server killed with SIGKILL holds
    /// it until the kernel has torn the process down, which takes a while when it held
    /// much memory. A delete waits as long for a sandbox's own lock (held by a create
    /// or delete of the same id in another process of a shared root).
    pub lock_wait: Duration,
    /// Share the root with other processes (`orchard serve` replicas over one Redis):
    /// the root's lock is taken shared instead of exclusive, each sandbox's create and
    /// delete hold its own lock (`<root>/locks/<id>.lock`) that recovery respects, and
    /// `list` and `delete` see the running sandboxes the other processes created.
    pub shared: bool,
    /// Test hook.
    #[doc(hidden)]
    pub fail_point: Option<FailPoint>,
}

impl LocalConfig {
    /// A config with defaults: `runc` and `slirp4netns` from PATH, 30 s to become ready,
    /// [`Limits::DEFAULT`].
    pub fn new(root: impl Into<PathBuf>, agent: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            agent: agent.into(),
            harness: None,
            runc: "runc".into(),
            slirp4netns: "slirp4netns".into(),
            nft: "nft".into(),
            egress: crate::egress::EgressPolicy::default(),
            ready_timeout: Duration::from_secs(30),
            agent_args: Vec::new(),
            default_limits: Limits::DEFAULT,
            allow_user_namespaces: false,
            disk: None,
            disk_pool: super::diskpool::DEFAULT_SIZE,
            lock_wait: Duration::from_secs(30),
            shared: false,
            fail_point: None,
        }
    }
}

/// What to create.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Its id; generated (`sb-` and 12 hex digits) when `None`.
    pub id: Option<String>,
    /// The image.
    pub image: Image,
    /// Limits; unset ones take the backend's defaults.
    pub limits: Limits,
    /// Network.
    pub network: NetworkMode,
    /// Hostname; the id when `None`.
    pub hostname: Option<String>,
    /// `KEY=value` entries added to (or replacing) the image's Env.
    pub env: Vec<String>,
    /// Labels, recorded as `org.orchard.label.<key>` annotations and in the state file.
    pub labels: BTreeMap<String, String>,
    /// The snapshot to fork: its layers go above the image's (`image` is the
    /// snapshot's).
    pub snapshot: Option<String>,
}

impl SandboxSpec {
    /// A sandbox of `image` with default everything.
    pub fn new(image: Image) -> Self {
        Self {
            id: None,
            image,
            limits: Limits::default(),
            network: NetworkMode::None,
            hostname: None,
            env: Vec::new(),
            labels: BTreeMap::new(),
            snapshot: None,
        }
    }
}

/// A sandbox as the backend reports it.
#[derive(Clone, PartialEq)]
pub struct SandboxInfo {
    /// Its id.
    pub id: String,
    /// Image reference.
    pub image: String,
    /// Creation time, RFC 3339 UTC.
    pub created_at: String,
    /// Limits in force.
    pub limits: Limits,
    /// Network.
    pub network: NetworkMode,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The agent's socket on the host.
    pub socket: PathBuf,
    /// The agent's token.
    pub token: String,
    /// Host pid of the agent (the container's init).
    pub init_pid: i32,
    /// Whether the agent process is still running (as far as can be told).
    pub liveness: crate::backend::Liveness,
    /// The bundle directory.
    pub bundle: PathBuf,
    /// Its cgroup directories on the host (one per hierarchy).
    pub cgroup_dirs: Vec<PathBuf>,
}

impl std::fmt::Debug for SandboxInfo {
    // The token stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxInfo")
            .field("id", &self.id)
            .field("image", &self.image)
            .field("created_at", &self.created_at)
            .field("limits", &self.limits)
            .field("network", &self.network)
            .field("labels", &self.labels)
            .field("socket", &self.socket)
            .field("init_pid", &self.init_pid)
            .field("liveness", &self.liveness)
            .finish_non_exhaustive()
    }
}

impl SandboxInfo {
    /// The agent's endpoint.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.socket.clone())
    }

    /// A client of the agent.
    pub fn client(&self) -> AgentClient {
        AgentClient::new(self.endpoint(), self.token.clone())
    }

    /// The cgroup directory of `controller` (`memory`, `cpuacct`, `pids`, ...).
    pub fn cgroup_dir(&self, controller: &str) -> Option<&Path> {
        self.cgroup_dirs
            .iter()
            .find(|d| {
                d.components().any(|c| {
                    c.as_os_str()
                        .to_str()
                        .is_some_and(|s| s.split(',').any(|x| x == controller))
                })
            })
            .map(PathBuf::as_path)
    }
}

/// What [`crate::backend::local::LocalBackend::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoverReport {
    /// Sandboxes adopted (running, agent healthy).
    pub adopted: Vec<String>,
    /// Sandboxes removed (half-created, dead or unhealthy).
    pub removed: Vec<String>,
    /// Sandboxes left alone: another process of a shared root holds their lock (it is
    /// creating or deleting them).
    pub skipped: Vec<String>,
    /// What could not be cleaned.
    pub problems: Vec<String>,
}

pub use crate::backend::valid_id;

pub(super) fn valid_hostname(h: &str) -> bool {
    let b = h.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// The environment of the agent (and so of its commands): the image's, the request's on
/// top, PATH and HOME defaulted, the harness on PATH, the token last.
pub(super) fn build_env(
    image_env: &[String],
    extra: &[String],
    home: &str,
    hostname: &str,
    harness: bool,
    token: &str,
) -> Result<Vec<String>, LocalError> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for entry in image_env.iter().chain(extra) {
        let Some((k, v)) = entry.split_once('=') else {
            return Err(LocalError::Invalid(format!(
                "environment entry {entry:?} is not KEY=value"
            )));
        };
        if k.is_empty() || entry.contains('\0') {
            return Err(LocalError::Invalid(format!(
                "environment entry {entry:?} has an empty key or a NUL byte"
            )));
        }
        if k == "ORCHARD_AGENT_TOKEN" {
            return Err(LocalError::Invalid(
                "ORCHARD_AGENT_TOKEN is reserved".into(),
            ));
        }
        match vars.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.to_string(),
            None => vars.push((k.to_string(), v.to_string())),
        }
    }
    let mut set_default = |k: &str, v: &str| {
        if !vars.iter().any(|(key, _)| key == k) {
            vars.push((k.to_string(), v.to_string()));
        }
    };
    set_default("PATH", DEFAULT_PATH);
    set_default("HOME", home);
    set_default("HOSTNAME", hostname);
    if harness {
        if let Some(path) = vars.iter_mut().find(|(k, _)| k == "PATH") {
            path.1 = format!("{}:{HARNESS_BIN}", path.1);
        }
    }
    let mut env: Vec<String> = vars.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.push(format!("ORCHARD_AGENT_TOKEN={token}"));
    Ok(env)
}

pub(super) fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), LocalError> {
    for (k, v) in labels {
        let ok_key = !k.is_empty()
            && k.len() <= 128
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'/'));
        if !ok_key {
            return Err(LocalError::Invalid(format!(
                "label key {k:?}: use 1-128 characters of A-Z, a-z, 0-9, '.', '_', '-', '/'"
            )));
        }
        if v.len() > 1024 {
            return Err(LocalError::Invalid(format!(
                "label {k:?}: the value is longer than 1024 bytes"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_hostnames_are_checked() {
        for ok in ["a", "sb-0123", "x.y_z-1", &"a".repeat(63)] {
            assert!(valid_id(ok), "{ok}");
        }
        for bad in ["", "-a", "A", "a/b", "a b", "..", &"a".repeat(64)] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert!(valid_hostname("Sandbox-1"));
        assert!(!valid_hostname("a.b"));
    }

    #[test]
    fn env_merges_image_request_defaults_and_the_token() {
        let env = build_env(
            &["PATH=/opt/bin".into(), "A=1".into(), "B=x=y".into()],
            &["A=2".into()],
            "/root",
            "sb",
            true,
            "tok",
        )
        .unwrap();
        assert_eq!(
            env,
            [
                "PATH=/opt/bin:/opt/sandbox-tools/bin",
                "A=2",
                "B=x=y",
                "HOME=/root",
                "HOSTNAME=sb",
                "ORCHARD_AGENT_TOKEN=tok"
            ]
        );
        let env = build_env(&[], &[], "/root", "sb", false, "t").unwrap();
        assert_eq!(env[0], format!("PATH={DEFAULT_PATH}"));
        for bad in ["NOEQUALS", "=v", "ORCHARD_AGENT_TOKEN=x", "A=\0"] {
            let e = build_env(&[bad.into()], &[], "/", "h", false, "t").unwrap_err();
            assert!(matches!(e, LocalError::Invalid(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn labels_are_checked() {
        let ok = BTreeMap::from([("team/name".to_string(), "x".to_string())]);
        validate_labels(&ok).unwrap();
        let bad = BTreeMap::from([("a b".to_string(), "x".to_string())]);
        assert!(validate_labels(&bad).is_err());
    }
}
