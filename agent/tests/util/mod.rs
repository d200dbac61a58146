//! The sandbox fixture of the agent's integration tests: a real `orchard-agent` (the
//! static musl build) running as PID 1 of a `runc` container, reached over its Unix
//! socket with [`orchard_client::AgentClient`].
//!
//! Every test process gets one temporary directory (runc's `--root` state, the agent
//! binary, the bundles) and every sandbox a unique id, so tests run in parallel threads
//! safely. Dropping a [`Sandbox`] kills and deletes its container, reaps its init and
//! removes its bundle, also when the test failed; [`Sandbox::stop`] does the same and
//! then asserts that nothing was left behind.

#![allow(dead_code)]

use std::fs;
use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use orchard_client::{AgentClient, ClientError, Endpoint};
use orchard_protocol::{ErrorCode, ExecRequest, ExecResult};
use orchard_test_support::rootfs::install_busybox;
use orchard_test_support::runc::{become_subreaper, reap_within, try_reap};
use orchard_test_support::{agent_binary, remove_tree, scratch_dir, unique_id, Runc};
use serde_json::{json, Value};

pub use orchard_test_support::{argv, cgroup_dirs, shell, within, CALL_LIMIT};

/// Bit of CAP_SYS_RESOURCE in a capability mask.
const CAP_SYS_RESOURCE: u32 = 24;
/// Where the agent listens inside the sandbox.
const SOCKET_IN_SANDBOX: &str = "/.orchard/run/agent.sock";
/// How long a sandbox may take to answer `/livez`.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// What the sandbox's root filesystem holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootfsKind {
    /// Host busybox with a symlink per applet in /bin, /etc/passwd, /workspace.
    Busybox,
    /// Nothing but the directories runc mounts on: no shell, no libc.
    AgentOnly,
    /// [`RootfsKind::Busybox`] plus the host's bash (with the libraries it links) as
    /// /bin/bash, which sessions then default to.
    BusyboxBash,
}

/// Options of a sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxOpts {
    /// `linux.resources.pids.limit`.
    pub pids_limit: Option<i64>,
    /// `linux.resources.memory.limit`, bytes.
    pub memory_limit: Option<i64>,
    /// Extra arguments of the agent, e.g. `["--max-body-bytes", "1024"]`.
    pub agent_args: Vec<String>,
    /// Capabilities added to runc's default set (which has no CAP_SETUID, so `--user`
    /// needs them), e.g. `["CAP_SETUID", "CAP_SETGID"]`.
    pub capabilities: Vec<String>,
}

impl SandboxOpts {
    /// Options with extra agent arguments.
    pub fn agent_args(args: &[&str]) -> Self {
        Self {
            agent_args: args.iter().map(|s| s.to_string()).collect(),
            ..Self::default()
        }
    }
}

/// What every sandbox of this test process shares.
struct Env {
    /// Per-process scratch directory holding the bundles; removed at exit.
    base: PathBuf,
    /// runc on its own `--root`.
    runc: Runc,
    /// Directory holding only `orchard-agent`, bind-mounted read-only at /.orchard/bin.
    bin_dir: PathBuf,
}

static ENV: OnceLock<Env> = OnceLock::new();

fn env() -> &'static Env {
    ENV.get_or_init(|| {
        let agent = agent_binary();
        become_subreaper();
        let base = scratch_dir("orchard-itest-");
        let runc = Runc::new(base.join("runc"));
        let bin_dir = base.join("bin");
        fs::create_dir_all(&bin_dir).unwrap();
        let bin = bin_dir.join("orchard-agent");
        fs::copy(&agent, &bin).expect("copying the agent binary");
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        Env {
            base,
            runc,
            bin_dir,
        }
    })
}

/// Runs `runc --root R ARGS` and returns (success, stdout + stderr).
fn runc(args: &[&str]) -> (bool, String) {
    env().runc.run(args)
}

/// 16 random bytes as hex.
fn random_token() -> String {
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("reading /dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn build_rootfs(kind: RootfsKind, rootfs: &Path) {
    // Mount points of runc's default spec and ours.
    for dir in ["proc", "dev", "sys", "tmp", ".orchard/bin", ".orchard/run"] {
        fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    if kind == RootfsKind::AgentOnly {
        return;
    }
    install_busybox(rootfs);
    fs::create_dir_all(rootfs.join("etc")).unwrap();
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    fs::write(rootfs.join("etc/group"), "root:x:0:\n").unwrap();
    fs::create_dir_all(rootfs.join("root")).unwrap();
    fs::create_dir_all(rootfs.join("workspace")).unwrap();
    if kind == RootfsKind::BusyboxBash {
        install_host_program(rootfs, Path::new("/bin/bash"), "bin/bash");
    }
}

/// Copies the host's dynamically linked `program` to `rootfs/dest`, and every library
/// `ldd` says it loads to the same path under `rootfs`.
fn install_host_program(rootfs: &Path, program: &Path, dest: &str) {
    let ldd = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .unwrap_or_else(|e| panic!("running ldd {}: {e}", program.display()));
    assert!(ldd.status.success(), "ldd {} failed", program.display());
    // `name => /path (addr)` or `/path (addr)`; the vDSO has no path.
    let libraries = String::from_utf8_lossy(&ldd.stdout)
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| path.to_string())
        })
        .collect::<Vec<_>>();
    for lib in libraries {
        let to = rootfs.join(lib.trim_start_matches('/'));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(&lib, &to).unwrap_or_else(|e| panic!("copying {lib}: {e}"));
    }
    let to = rootfs.join(dest);
    // Not through a busybox applet's link of the same name.
    let _ = fs::remove_file(&to);
    fs::copy(program, &to).unwrap_or_else(|e| panic!("copying {}: {e}", program.display()));
    fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Whether this test process may grant CAP_SYS_RESOURCE (some hosts, this CI machine
/// among them, do not have it at all).
pub fn host_has_cap_sys_resource() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

fn write_config(bundle: &Path, run_dir: &Path, token: &str, opts: &SandboxOpts) {
    let (ok, out) = runc(&["spec", "--bundle", bundle.to_str().unwrap()]);
    assert!(ok, "runc spec failed: {out}");
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let mut args = vec![
        "/.orchard/bin/orchard-agent".to_string(),
        "--unix".into(),
        SOCKET_IN_SANDBOX.into(),
    ];
    args.extend(opts.agent_args.iter().cloned());
    let process = &mut config["process"];
    process["terminal"] = json!(false);
    process["args"] = json!(args);
    process["env"] = json!([
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        format!("ORCHARD_AGENT_TOKEN={token}"),
    ]);
    process["cwd"] = json!("/");
    // The agent lowers its own OOM score below its children's, which needs
    // CAP_SYS_RESOURCE; grant it when we have it to give.
    let mut extra = opts.capabilities.clone();
    if host_has_cap_sys_resource() {
        extra.push("CAP_SYS_RESOURCE".into());
    }
    for set in ["bounding", "effective", "permitted"] {
        if let Some(caps) = process["capabilities"][set].as_array_mut() {
            caps.extend(extra.iter().map(|c| json!(c)));
        }
    }
    config["root"] = json!({"path": "rootfs", "readonly": true});
    config["hostname"] = json!("orchard-itest");
    let mounts = config["mounts"].as_array_mut().unwrap();
    mounts.push(json!({
        "destination": "/tmp",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=1777", "size=256m"],
    }));
    mounts.push(json!({
        "destination": "/.orchard/bin",
        "type": "bind",
        "source": env().bin_dir,
        "options": ["bind", "ro"],
    }));
    mounts.push(json!({
        "destination": "/.orchard/run",
        "type": "bind",
        "source": run_dir,
        "options": ["bind", "rw"],
    }));
    let resources = &mut config["linux"]["resources"];
    if let Some(limit) = opts.pids_limit {
        resources["pids"] = json!({ "limit": limit });
    }
    if let Some(limit) = opts.memory_limit {
        resources["memory"] = json!({ "limit": limit });
    }
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

/// One running sandbox.
pub struct Sandbox {
    /// Container id.
    pub id: String,
    /// Bundle directory on the host.
    pub bundle: PathBuf,
    /// The agent's socket on the host.
    pub socket: PathBuf,
    /// The token.
    pub token: String,
    client: AgentClient,
    /// Host pid of the container's init (the agent), once known.
    init_pid: Option<i32>,
    /// Set once the init was reaped.
    reaped: bool,
}

impl Sandbox {
    /// Creates and starts a sandbox and waits until its agent answers `/livez`.
    pub fn start(kind: RootfsKind, opts: SandboxOpts) -> Sandbox {
        let env = env();
        let id = unique_id("orchard-itest");
        let bundle = env.base.join(&id);
        let run_dir = bundle.join("run");
        let socket = run_dir.join("agent.sock");
        let token = random_token();
        fs::create_dir_all(&run_dir).unwrap();
        // From here on, Drop cleans up whatever was created.
        let mut sandbox = Sandbox {
            client: AgentClient::new(Endpoint::Unix(socket.clone()), token.clone()),
            id: id.clone(),
            bundle: bundle.clone(),
            socket,
            token: token.clone(),
            init_pid: None,
            reaped: false,
        };
        build_rootfs(kind, &bundle.join("rootfs"));
        write_config(&bundle, &run_dir, &token, &opts);
        let log = fs::File::create(bundle.join("agent.log")).unwrap();
        let status = env
            .runc
            .command()
            .args(["run", "--detach", "--bundle"])
            .arg(&bundle)
            .arg("--pid-file")
            .arg(bundle.join("pid"))
            .arg(&id)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .expect("running runc (is runc installed?)");
        sandbox.init_pid = fs::read_to_string(bundle.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok());
        if !status.success() {
            panic!(
                "runc run failed ({status}) for {id}:\n{}",
                sandbox.diagnostics()
            );
        }
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(resp) = raw_request(&sandbox.socket, "GET", "/livez", &[], b"") {
                if resp.status == 200 {
                    break;
                }
            }
            if let Some(pid) = sandbox.init_pid {
                if let Ok(Some(status)) = try_reap(pid) {
                    sandbox.reaped = true;
                    panic!(
                        "the agent of {id} exited before answering /livez (wait status \
                         {status:#x}):\n{}",
                        sandbox.diagnostics()
                    );
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "the agent of {id} did not answer /livez within {START_DEADLINE:?}:\n{}",
                    sandbox.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        sandbox
    }

    /// A busybox sandbox with default options.
    pub fn busybox() -> Sandbox {
        Self::start(RootfsKind::Busybox, SandboxOpts::default())
    }

    /// The agent log and `runc state`, for failure messages.
    pub fn diagnostics(&self) -> String {
        let log = fs::read_to_string(self.bundle.join("agent.log")).unwrap_or_default();
        let (_, state) = runc(&["state", &self.id]);
        format!("--- agent/runc log ---\n{log}\n--- runc state ---\n{state}")
    }

    /// The client of this sandbox's agent.
    pub fn client(&self) -> &AgentClient {
        &self.client
    }

    /// Host pid of the agent (the container's init).
    pub fn pid1_host_pid(&self) -> i32 {
        self.init_pid.expect("the container's init pid is unknown")
    }

    /// Sends `signal` (a name like "TERM" or a number) to the container's init.
    pub fn kill(&self, signal: &str) {
        let (ok, out) = runc(&["kill", &self.id, signal]);
        assert!(ok, "runc kill {} {signal} failed: {out}", self.id);
    }

    /// Waits up to `timeout` for the container's init to exit and reaps it; answers its
    /// raw wait status, or `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let pid = self.pid1_host_pid();
        assert!(!self.reaped, "the init of {} was already reaped", self.id);
        match reap_within(pid, timeout) {
            Ok(status) => {
                self.reaped = status.is_some();
                status
            }
            Err(e) => {
                panic!("waitpid({pid}) failed: {e} (is the test process the init's subreaper?)")
            }
        }
    }

    /// `runc state` status ("running", "stopped", ...), or None if runc knows no such
    /// container.
    pub fn runc_status(&self) -> Option<String> {
        let (ok, out) = runc(&["state", &self.id]);
        if !ok {
            return None;
        }
        let v: Value = serde_json::from_str(&out).ok()?;
        v["status"].as_str().map(String::from)
    }

    /// Host cgroup directories of this sandbox for the controllers we use.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        cgroup_dirs(&self.id)
    }

    /// Tears the sandbox down and asserts that no container, mount or cgroup is left.
    pub fn stop(self) {
        let id = self.id.clone();
        let bundle = self.bundle.clone();
        drop(self);
        assert_no_leak(&id, &bundle);
    }

    fn teardown(&mut self) {
        let _ = runc(&["kill", &self.id, "KILL"]);
        let _ = runc(&["delete", "--force", &self.id]);
        if let (Some(pid), false) = (self.init_pid, self.reaped) {
            // An error means it is not our child (never was, or gone): nothing to reap.
            let _ = reap_within(pid, Duration::from_secs(10));
            self.reaped = true;
        }
        let _ = remove_tree(&self.bundle);
    }

    // ---- conveniences over the client ----

    /// `POST /v1/exec`, failing the test on an error or after [`CALL_LIMIT`].
    pub async fn exec(&self, req: ExecRequest) -> ExecResult {
        let what = format!("{:?}", req.command);
        match within(CALL_LIMIT, self.client.exec(&req)).await {
            Ok(r) => r,
            Err(e) => panic!("exec {what} failed: {e}\n{}", self.diagnostics()),
        }
    }

    /// `POST /v1/exec` that must fail: its error.
    pub async fn exec_err(&self, req: ExecRequest) -> ClientError {
        match within(CALL_LIMIT, self.client.exec(&req)).await {
            Ok(r) => panic!("exec {:?} should have failed, got {r:?}", req.command),
            Err(e) => e,
        }
    }

    /// Runs a shell string with default options.
    pub async fn sh(&self, script: &str) -> ExecResult {
        self.exec(shell(script)).await
    }

    /// Asserts that the agent still runs commands: `echo ok` answers "ok".
    pub async fn assert_still_serving(&self) {
        let r = self.sh("echo ok").await;
        assert_eq!(r.exit_code, Some(0), "follow-up exec: {r:?}");
        assert_eq!(r.stdout.text_lossy(), "ok\n", "follow-up exec: {r:?}");
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Asserts that container `id` left nothing behind: runc does not list it, no mount
/// mentions its bundle, and its cgroups are gone.
pub fn assert_no_leak(id: &str, bundle: &Path) {
    assert!(
        !env().runc.root.join(id).exists(),
        "runc still has state for {id}"
    );
    let list = env().runc.list();
    assert!(
        !list.iter().any(|l| l == id),
        "container {id} is still known to runc:\n{list:?}"
    );
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let bundle = bundle.to_string_lossy();
    let leaked: Vec<&str> = mountinfo
        .lines()
        .filter(|l| l.contains(bundle.as_ref()))
        .collect();
    assert!(leaked.is_empty(), "mounts of {id} left behind: {leaked:#?}");
    for dir in cgroup_dirs(id) {
        assert!(!dir.exists(), "cgroup {} left behind", dir.display());
    }
    assert!(
        !Path::new(bundle.as_ref()).exists(),
        "bundle {bundle} left behind"
    );
}

/// Awaits an API call that must succeed within [`CALL_LIMIT`].
pub async fn ok<T, F>(what: &str, fut: F) -> T
where
    F: Future<Output = Result<T, ClientError>>,
{
    match within(CALL_LIMIT, fut).await {
        Ok(v) => v,
        Err(e) => panic!("{what} failed: {e}"),
    }
}

/// Awaits an API call that must fail within [`CALL_LIMIT`]; answers its error.
pub async fn fails<T: std::fmt::Debug, F>(what: &str, fut: F) -> ClientError
where
    F: Future<Output = Result<T, ClientError>>,
{
    match within(CALL_LIMIT, fut).await {
        Ok(v) => panic!("{what} should have failed, got {v:?}"),
        Err(e) => e,
    }
}

/// Polls `check` every 50 ms until it answers `Some`, failing after `limit` with
/// `what` and the last value seen.
pub async fn poll_until<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() > deadline {
            panic!("{what}: not reached within {limit:?}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `err` is the agent answering `code` with `status`.
#[track_caller]
pub fn assert_api_error(err: &ClientError, status: u16, code: ErrorCode) {
    match err {
        ClientError::Api { status: s, body } => {
            assert_eq!(
                (s.as_u16(), body.code),
                (status, code),
                "unexpected error: {err}"
            );
        }
        other => panic!("expected the agent to answer {status} {code:?}, got {other}"),
    }
}

/// A response read by [`raw_request`].
#[derive(Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Header lines, lower-cased names.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The body as JSON, or Null.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// One HTTP/1.1 request over a fresh connection to `socket`, with `Connection: close`
/// and exactly the given extra headers (so a test can leave the token out). With a
/// `Transfer-Encoding: chunked` header the body is sent chunked, without a length.
pub fn raw_request(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<RawResponse> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(CALL_LIMIT))?;
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n");
    if !chunked {
        req += &format!("Content-Length: {}\r\n", body.len());
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    let mut bytes = req.into_bytes();
    if chunked {
        // Several chunks, so a limit cannot be checked from the first one alone.
        for part in body.chunks(512) {
            bytes.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            bytes.extend_from_slice(part);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"0\r\n\r\n");
    } else {
        bytes.extend_from_slice(body);
    }
    // One write; and a server that answers (401, 413) and closes before reading the
    // whole body is not an error: its answer is what we want.
    match stream.write_all(&bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad HTTP response"))
}

fn parse_response(raw: &[u8]) -> Option<RawResponse> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n")?;
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..nl]).ok()?.trim(), 16).ok()?;
            rest = &rest[nl + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(rest.get(..size)?);
            rest = rest.get(size + 2..)?;
        }
        body = out;
    }
    Some(RawResponse {
        status,
        headers,
        body,
    })
}
