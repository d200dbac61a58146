//! A real registry for the image store tests: Debian's `docker-registry` (the CNCF
//! distribution registry) on a free loopback port, one per test process, holding what
//! the tests push into it with `skopeo` — the layouts `make images` leaves in
//! `images/out/`, and small OCI layouts the tests build themselves ([`Layout`]).
//!
//! The registry dies with the test process: an `atexit` handler kills it and removes its
//! storage (a directory under the system temp dir named after the test process), and in
//! case the process dies without running it (a signal), the registry is spawned with
//! `PR_SET_PDEATHSIG` from a thread that lives as long as the process (the signal follows
//! the spawning thread, so a test thread would kill it when that test ends); directories
//! of dead test processes are then removed when the next one starts.
//!
//! [`auth_registry`] is a second one that demands Basic auth from an `htpasswd` file
//! (bcrypt, written by Apache's `htpasswd`), as a private registry would.
//!
//! [`Proxy`] is a small HTTP server in front of the registry that counts requests and can
//! demand authentication: Basic, or the Bearer token flow with its own token endpoint.

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

/// How long the registry may take to answer `/v2/`.
const START_DEADLINE: Duration = Duration::from_secs(20);

pub use orchard_test_support::{image_layout, images_out};

/// The test process's registry.
pub struct Registry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// The registry's storage root.
    pub storage: PathBuf,
    /// Destinations already pushed (`repo:tag`), so each push happens once per process.
    pushed: Mutex<HashSet<String>>,
    /// The user and password it demands, if any.
    pub credentials: Option<(String, String)>,
}

/// The user of [`auth_registry`].
pub const AUTH_USER: &str = "orchard-tester";
/// The password of [`auth_registry`] (with the characters that break naive parsing).
pub const AUTH_PASSWORD: &str = "pa:ss=w0rd,x";

/// The registry of this test process, started on first use.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| start("plain", None))
}

/// A registry of this test process that demands [`AUTH_USER`] and [`AUTH_PASSWORD`]
/// (Basic auth checked against a bcrypt `htpasswd` file), started on first use.
pub fn auth_registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| start("auth", Some((AUTH_USER, AUTH_PASSWORD))))
}

fn start(kind: &str, credentials: Option<(&str, &str)>) -> Registry {
    for tool in ["/usr/bin/docker-registry", "/usr/bin/skopeo"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: run `make images` (or scripts/deps.sh)"
        );
    }
    let base = std::env::temp_dir().join("orchard-test-registry");
    fs::create_dir_all(&base).unwrap();
    for entry in fs::read_dir(&base).unwrap().flatten() {
        let alive = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    let dir = base.join(std::process::id().to_string()).join(kind);
    let _ = fs::remove_dir_all(&dir);
    let storage = dir.join("storage");
    fs::create_dir_all(&storage).unwrap();
    let port = free_port();
    let host = format!("127.0.0.1:{port}");
    let config = dir.join("config.yml");
    let mut yaml = format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
        storage.display()
    );
    if let Some((user, password)) = credentials {
        assert!(
            Path::new("/usr/bin/htpasswd").exists(),
            "/usr/bin/htpasswd is missing: run scripts/deps.sh (apache2-utils)"
        );
        let htpasswd = dir.join("htpasswd");
        let output = Command::new("/usr/bin/htpasswd")
            .args(["-B", "-b", "-n", user, password])
            .output()
            .expect("cannot run htpasswd");
        assert!(output.status.success(), "htpasswd failed");
        fs::write(&htpasswd, &output.stdout).unwrap();
        yaml.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: orchard-test\n    path: {}\n",
            htpasswd.display()
        ));
    }
    fs::write(&config, yaml).unwrap();
    let log = fs::File::create(dir.join("registry.log")).unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("registry".into())
        .spawn(move || {
            let mut command = Command::new("/usr/bin/docker-registry");
            command
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let spawned = command.spawn();
            match spawned {
                Ok(mut child) => {
                    let _ = sender.send(Ok(child.id()));
                    // Keep this thread (and so the death signal's anchor) alive.
                    let _ = child.wait();
                    loop {
                        std::thread::park();
                    }
                }
                Err(err) => {
                    let _ = sender.send(Err(err.to_string()));
                }
            }
        })
        .unwrap();
    let pid = receiver
        .recv()
        .unwrap()
        .expect("docker-registry did not start");
    {
        let mut started = CLEANUP.lock().unwrap_or_else(|e| e.into_inner());
        if started.is_empty() {
            // SAFETY: registering a plain extern "C" function without captured state.
            unsafe {
                libc::atexit(cleanup);
            }
        }
        started.push((pid, dir.clone()));
    }
    let deadline = Instant::now() + START_DEADLINE;
    let up = if credentials.is_some() { 401 } else { 200 };
    loop {
        if http_status(&host, "/v2/") == Some(up) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "docker-registry (pid {pid}) did not answer on {host}; see {}",
            dir.join("registry.log").display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Registry {
        host,
        storage,
        pushed: Mutex::new(HashSet::new()),
        credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
    }
}

/// The registries' pids and directories, for [`cleanup`].
static CLEANUP: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// Runs at process exit: kills the registries and removes their storage.
extern "C" fn cleanup() {
    let started = CLEANUP.lock().unwrap_or_else(|e| e.into_inner());
    for (pid, dir) in started.iter() {
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        unsafe {
            libc::kill(*pid as libc::pid_t, libc::SIGKILL);
        }
        let _ = fs::remove_dir_all(dir);
        if let Some(parent) = dir.parent() {
            let _ = fs::remove_dir(parent);
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status of a plain `GET`, or `None` when nothing answers.
fn http_status(host: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// How `skopeo` writes the image into the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushFormat {
    /// As it is in the layout (OCI).
    Oci,
    /// Converted to Docker v2 schema 2.
    Docker,
    /// Every manifest of an index (`--all`).
    All,
}

impl Registry {
    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.host)
    }

    /// Pushes `images/out/<layout>:<tag>` to `<dest>` (`repo:tag`), once per process.
    pub fn push_image(&self, layout: &str, tag: &str, dest: &str) {
        self.push(&image_layout(layout), tag, dest, PushFormat::Oci);
    }

    /// Pushes the layout at `path` (its `tag`) to `<dest>`, once per process and dest.
    pub fn push(&self, path: &Path, tag: &str, dest: &str, format: PushFormat) {
        let mut pushed = self.pushed.lock().unwrap_or_else(|e| e.into_inner());
        if pushed.contains(dest) {
            return;
        }
        let mut command = Command::new("/usr/bin/skopeo");
        command.args([
            "copy",
            "--quiet",
            "--insecure-policy",
            "--dest-tls-verify=false",
        ]);
        if let Some((user, password)) = &self.credentials {
            command.arg(format!("--dest-creds={user}:{password}"));
        }
        match format {
            PushFormat::Oci => {}
            PushFormat::Docker => {
                command.args(["--format", "v2s2"]);
            }
            PushFormat::All => {
                command.arg("--all");
            }
        }
        let output = command
            .arg(format!("oci:{}:{tag}", path.display()))
            .arg(format!("docker://{}/{dest}", self.host))
            .output()
            .expect("cannot run skopeo");
        assert!(
            output.status.success(),
            "skopeo copy to {dest} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        pushed.insert(dest.to_string());
    }

    /// The file holding a blob in the registry's storage (to tamper with).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

/// `sha256:<hex>` of bytes.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A tar of `(path, contents)` files (mode 0644, root, fixed mtime), with parents.
pub fn layer_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, *contents).unwrap();
    }
    builder.into_inner().unwrap()
}

/// Layer compression for [`Layout::image`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain tar.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

/// A descriptor of something written into a [`Layout`].
#[derive(Debug, Clone)]
pub struct Written {
    /// Digest.
    pub digest: String,
    /// Size.
    pub size: u64,
    /// Media type.
    pub media_type: String,
}

impl Written {
    fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// An OCI image layout built by hand in a temporary directory.
pub struct Layout {
    dir: tempfile::TempDir,
    index: Vec<Value>,
}

impl Default for Layout {
    fn default() -> Self {
        Self::new()
    }
}

impl Layout {
    /// An empty layout.
    pub fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
        fs::write(
            dir.path().join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        let layout = Layout {
            dir,
            index: Vec::new(),
        };
        layout.write_index();
        layout
    }

    /// The layout's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a blob.
    pub fn blob(&self, bytes: &[u8], media_type: &str) -> Written {
        let digest = sha256(bytes);
        fs::write(
            self.path()
                .join("blobs/sha256")
                .join(&digest["sha256:".len()..]),
            bytes,
        )
        .unwrap();
        Written {
            digest,
            size: bytes.len() as u64,
            media_type: media_type.to_string(),
        }
    }

    /// The JSON of `written` (a manifest, an index or a config), read back.
    pub fn json(&self, written: &Written) -> Value {
        let blob = self
            .path()
            .join("blobs/sha256")
            .join(&written.digest["sha256:".len()..]);
        serde_json::from_slice(&fs::read(blob).unwrap()).unwrap()
    }

    /// Writes an image (layers, config with `run_config` and `architecture`, manifest).
    pub fn image(
        &self,
        layers: &[(Vec<u8>, Compression)],
        run_config: Value,
        architecture: &str,
    ) -> Written {
        let mut descriptors = Vec::new();
        let mut diff_ids = Vec::new();
        for (tar, compression) in layers {
            diff_ids.push(sha256(tar));
            let (bytes, media_type) = match compression {
                Compression::None => (tar.clone(), "application/vnd.oci.image.layer.v1.tar"),
                Compression::Gzip => {
                    let mut encoder =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    encoder.write_all(tar).unwrap();
                    (
                        encoder.finish().unwrap(),
                        "application/vnd.oci.image.layer.v1.tar+gzip",
                    )
                }
                Compression::Zstd => (
                    zstd::encode_all(&tar[..], 3).unwrap(),
                    "application/vnd.oci.image.layer.v1.tar+zstd",
                ),
            };
            descriptors.push(self.blob(&bytes, media_type).descriptor());
        }
        let config = json!({
            "architecture": architecture,
            "os": "linux",
            "config": run_config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config = self.blob(
            &serde_json::to_vec(&config).unwrap(),
            "application/vnd.oci.image.config.v1+json",
        );
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config.descriptor(),
            "layers": descriptors,
        });
        self.blob(
            &serde_json::to_vec(&manifest).unwrap(),
            "application/vnd.oci.image.manifest.v1+json",
        )
    }

    /// Writes an image index of `(manifest, architecture)` entries.
    pub fn index(&self, entries: &[(&Written, &str)]) -> Written {
        let manifests: Vec<Value> = entries
            .iter()
            .map(|(written, architecture)| {
                let mut descriptor = written.descriptor();
                descriptor["platform"] = json!({"architecture": architecture, "os": "linux"});
                descriptor
            })
            .collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        });
        self.blob(
            &serde_json::to_vec(&index).unwrap(),
            "application/vnd.oci.image.index.v1+json",
        )
    }

    /// Names `written` as `tag` in index.json.
    pub fn tag(&mut self, tag: &str, written: &Written) {
        let mut descriptor = written.descriptor();
        descriptor["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        self.index.push(descriptor);
        self.write_index();
    }

    fn write_index(&self) {
        let index = json!({"schemaVersion": 2, "manifests": self.index});
        fs::write(
            self.path().join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }
}

/// What a [`Proxy`] demands before it forwards a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyAuth {
    /// Nothing.
    None,
    /// `Authorization: Basic` with this user and password.
    Basic(String, String),
    /// The Bearer challenge flow: the token endpoint `/token` wants this user and
    /// password as basic auth and hands out a token the registry routes then require.
    Bearer(String, String),
    /// The Bearer flow with an OAuth2 refresh token (Docker's `identitytoken`): the
    /// token endpoint wants a `POST` form with `grant_type=refresh_token` and this
    /// `refresh_token`, and answers an `access_token`.
    Refresh(String),
}

/// One request a [`Proxy`] saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The status the proxy answered.
    pub status: u16,
}

/// An HTTP proxy in front of the registry, counting requests and checking auth. It
/// runs on the calling test's tokio runtime and stops with it.
pub struct Proxy {
    /// `127.0.0.1:<port>`.
    pub host: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// The token the fake token server hands out.
pub const TOKEN: &str = "orchard-test-token";

impl Proxy {
    /// Starts a proxy to `upstream` (`127.0.0.1:<port>`).
    pub async fn start(upstream: &str, auth: ProxyAuth) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(ProxyState {
            upstream: upstream.to_string(),
            host: host.clone(),
            auth,
            seen: seen.clone(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        });
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let _ = state.serve(stream).await;
                });
            }
        });
        Proxy { host, seen }
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many `GET`s of the blob `digest` were forwarded.
    pub fn blob_gets(&self, digest: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| {
                s.method == "GET"
                    && s.status == 200
                    && s.path.ends_with(&format!("/blobs/{digest}"))
            })
            .count()
    }
}

struct ProxyState {
    upstream: String,
    host: String,
    auth: ProxyAuth,
    seen: Arc<Mutex<Vec<Seen>>>,
    http: reqwest::Client,
}

impl ProxyState {
    async fn serve(&self, mut stream: tokio::net::TcpStream) -> std::io::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 || head.len() > 64 << 10 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&head).to_string();
        let mut lines = text.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let method = first.next().unwrap_or("").to_string();
        let path = first.next().unwrap_or("/").to_string();
        let mut authorization = None;
        let mut accept = None;
        let mut length = 0usize;
        for line in lines {
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "authorization" => authorization = Some(value.trim().to_string()),
                    "accept" => accept = Some(value.trim().to_string()),
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let start = head
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(head.len(), |i| i + 4);
        let mut form = head[start..].to_vec();
        while form.len() < length.min(64 << 10) {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            form.extend_from_slice(&buf[..n]);
        }
        let form = String::from_utf8_lossy(&form).to_string();
        let (status, headers, body) = self
            .answer(
                &method,
                &path,
                authorization.as_deref(),
                accept.as_deref(),
                &form,
            )
            .await;
        self.seen.lock().unwrap().push(Seen {
            method: method.clone(),
            path,
            authorization,
            status,
        });
        let mut response = format!(
            "HTTP/1.1 {status} X\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            response.push_str(&format!("{name}: {value}\r\n"));
        }
        response.push_str("\r\n");
        stream.write_all(response.as_bytes()).await?;
        if method != "HEAD" {
            stream.write_all(&body).await?;
        }
        stream.shutdown().await
    }

    async fn answer(
        &self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        accept: Option<&str>,
        form: &str,
    ) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let basic = |user: &str, password: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )
        };
        let unauthorized = |challenge: String| {
            (
                401,
                vec![
                    ("WWW-Authenticate".to_string(), challenge),
                    ("Content-Type".to_string(), "application/json".to_string()),
                ],
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                    .to_vec(),
            )
        };
        match &self.auth {
            ProxyAuth::None => {}
            ProxyAuth::Basic(user, password) => {
                if authorization != Some(basic(user, password).as_str()) {
                    return unauthorized(r#"Basic realm="orchard-test""#.to_string());
                }
            }
            ProxyAuth::Refresh(refresh) => {
                if path.starts_with("/token") {
                    let fields: Vec<&str> = form.split('&').collect();
                    let wanted = format!("refresh_token={refresh}");
                    if method != "POST"
                        || !fields.contains(&"grant_type=refresh_token")
                        || !fields.contains(&wanted.as_str())
                    {
                        return (401, Vec::new(), br#"{"error":"invalid_grant"}"#.to_vec());
                    }
                    let body = json!({"access_token": TOKEN, "expires_in": 300}).to_string();
                    return (
                        200,
                        vec![("Content-Type".into(), "application/json".into())],
                        body.into_bytes(),
                    );
                }
                if authorization != Some(format!("Bearer {TOKEN}").as_str()) {
                    return unauthorized(format!(
                        r#"Bearer realm="http://{}/token",service="orchard-test""#,
                        self.host
                    ));
                }
            }
            ProxyAuth::Bearer(user, password) => {
                if path.starts_with("/token") {
                    if authorization != Some(basic(user, password).as_str()) {
                        return (
                            401,
                            Vec::new(),
                            br#"{"details":"bad credentials"}"#.to_vec(),
                        );
                    }
                    let body = json!({"token": TOKEN, "expires_in": 300}).to_string();
                    return (
                        200,
                        vec![("Content-Type".into(), "application/json".into())],
                        body.into_bytes(),
                    );
                }
                if authorization != Some(format!("Bearer {TOKEN}").as_str()) {
                    let repository = path
                        .strip_prefix("/v2/")
                        .and_then(|rest| rest.split("/manifests/").next())
                        .and_then(|rest| rest.split("/blobs/").next())
                        .unwrap_or("");
                    return unauthorized(format!(
                        r#"Bearer realm="http://{}/token",service="orchard-test",scope="repository:{repository}:pull""#,
                        self.host
                    ));
                }
            }
        }
        let url = format!("http://{}{path}", self.upstream);
        let mut request = if method == "HEAD" {
            self.http.head(&url)
        } else {
            self.http.get(&url)
        };
        if let Some(accept) = accept {
            request = request.header("Accept", accept);
        }
        let Ok(response) = request.send().await else {
            return (502, Vec::new(), Vec::new());
        };
        let status = response.status().as_u16();
        let mut headers = Vec::new();
        for name in ["content-type", "docker-content-digest", "www-authenticate"] {
            if let Some(value) = response.headers().get(name).and_then(|v| v.to_str().ok()) {
                headers.push((name.to_string(), value.to_string()));
            }
        }
        let body = response
            .bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        (status, headers, body)
    }
}

/// The address of a loopback port nothing listens on.
pub fn dead_endpoint() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
