//! The Redis state store against a real `redis-server` (Debian's, installed by
//! `make deps`), started and stopped by each test on its own Unix socket: the
//! conformance checks every store passes, the guarantees that only matter across
//! processes (two stores are two replicas), and Redis going away and coming back.

mod bench;
mod chaos;
mod replicas;
mod servers;
mod shared_root;
mod store;
mod takeover;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::server::{send, KEY};

/// A `redis-server` of one test: its socket in a private directory, no persistence
/// unless asked for. Killed and reaped on drop.
pub struct RedisServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    aof: bool,
}

impl RedisServer {
    /// Starts one without persistence.
    pub fn start() -> RedisServer {
        Self::start_with(false)
    }

    /// Starts one; `aof`: with an append-only file (`appendfsync always`), so a restart
    /// keeps every write.
    pub fn start_with(aof: bool) -> RedisServer {
        let mut s = RedisServer {
            dir: tempfile::tempdir().unwrap(),
            child: None,
            aof,
        };
        s.up();
        s
    }

    /// The socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The URL the store connects to.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    /// (Re)starts the server; returns once it accepts connections (it says so on its
    /// standard output).
    pub fn up(&mut self) {
        assert!(self.child.is_none(), "already up");
        let bin = which("redis-server");
        let mut cmd = Command::new(bin);
        cmd.arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(self.socket())
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", ""])
            .args(["--loglevel", "notice"]);
        if self.aof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        // Killed with the test process if it dies first (a killed test binary must not
        // leave redis-servers behind; Drop does not run then).
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (make deps installs it)");
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let ready = lines.by_ref().map_while(Result::ok).any(|l| {
            l.to_ascii_lowercase()
                .contains("ready to accept connections")
        });
        assert!(ready, "redis-server did not start");
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        self.child = Some(child);
    }

    /// Kills the server (as a crash would) and waits for it.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.down();
    }
}

fn which(bin: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let p = PathBuf::from(dir).join(bin);
        if p.exists() {
            return p;
        }
    }
    panic!("{bin} not found: run `make deps`");
}

/// A request to a server at `url` with the test key.
fn req(method: reqwest::Method, url: &str, path: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method, format!("{url}{path}"))
        .header("X-API-Key", KEY)
        .timeout(Duration::from_secs(60))
}

async fn post(url: &str, path: &str, body: Value) -> (u16, Value) {
    send(req(reqwest::Method::POST, url, path).json(&body)).await
}

async fn get(url: &str, path: &str) -> (u16, Value) {
    send(req(reqwest::Method::GET, url, path)).await
}

/// Imports the test busybox image through the replica at `url`.
async fn import_busybox(url: &str) {
    let layout = orchard_test_support::images::image_layout("busybox");
    let mut tar = tar::Builder::new(Vec::new());
    tar.append_dir_all(".", &layout).unwrap();
    let (s, body) = crate::util::server::send(
        req(
            reqwest::Method::POST,
            url,
            "/v1/images/import?name=busybox:latest",
        )
        .body(tar.into_inner().unwrap()),
    )
    .await;
    assert_eq!(s, 200, "{body}");
}
