//! Sandbox fixtures of the local backend tests: image layers built by hand (no image
//! store needed), a [`TestBackend`] per test on its own temporary root, and the leak
//! audit run at the end of every scenario.
//!
//! Dropping a [`TestBackend`] (also when its test failed) destroys every sandbox, mount,
//! cgroup and directory it made; [`TestBackend::finish`] does the same and asserts that
//! the audit is empty before and after.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use orchard::backend::local::disk::DiskLimit;
use orchard::backend::local::{LocalBackend, LocalConfig, SandboxInfo, SandboxSpec};
use orchard::image::{Image, ImageConfig, ImageStore, StoreConfig};
use orchard_protocol::{ExecRequest, ExecResult};
use orchard_test_support::rootfs::install_busybox;
use orchard_test_support::{block_on_own_runtime, image_layout, scratch_dir};

pub use orchard_test_support::{agent_binary, argv, shell, unique_id, within, CALL_LIMIT};

/// Layer directories shared by every test of this process (read-only overlay lowers).
pub struct Layers {
    /// Where they live.
    pub base: PathBuf,
    /// /bin/busybox with its applets, /etc/passwd and /etc/group (root and `app`).
    pub busybox: PathBuf,
    /// An empty directory.
    pub empty: PathBuf,
    /// A layer for on top of `busybox`: /workspace, /etc/motd.
    pub top: PathBuf,
}

static LAYERS: OnceLock<Layers> = OnceLock::new();

/// Env naming the layers of a parent test process, for a child it re-invokes (a child
/// killed with SIGKILL could not remove its own).
pub const LAYERS_ENV: &str = "ORCHARD_TEST_LAYERS";

/// The shared layers, built on first use.
pub fn layers() -> &'static Layers {
    LAYERS.get_or_init(|| {
        if let Some(base) = std::env::var_os(LAYERS_ENV).map(PathBuf::from) {
            return Layers {
                busybox: base.join("busybox"),
                empty: base.join("empty"),
                top: base.join("top"),
                base,
            };
        }
        let base = scratch_dir("orchard-layers-");
        let busybox = base.join("busybox");
        install_busybox(&busybox);
        let etc = busybox.join("etc");
        fs::create_dir_all(&etc).unwrap();
        fs::write(
            etc.join("passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        fs::write(
            etc.join("group"),
            "root:x:0:\napp:x:1000:\nstaff:x:50:app\n",
        )
        .unwrap();
        fs::write(etc.join("motd"), "bottom\n").unwrap();
        fs::write(etc.join("only-bottom"), "from the bottom layer\n").unwrap();
        fs::create_dir_all(busybox.join("root")).unwrap();
        let empty = base.join("empty");
        fs::create_dir_all(&empty).unwrap();
        let top = base.join("top");
        fs::create_dir_all(top.join("workspace")).unwrap();
        fs::create_dir_all(top.join("etc")).unwrap();
        fs::write(top.join("etc/motd"), "top\n").unwrap();
        Layers {
            base,
            busybox,
            empty,
            top,
        }
    })
}

/// An image of `layers` (bottom first) with `config`.
pub fn image(name: &str, layers: Vec<PathBuf>, config: ImageConfig) -> Image {
    Image {
        reference: format!("test.local/{name}:latest"),
        digest: format!("sha256:{:064x}", layers.len()),
        layers,
        config,
    }
}

/// The busybox image.
pub fn busybox_image() -> Image {
    image(
        "busybox",
        vec![layers().busybox.clone()],
        ImageConfig::default(),
    )
}

/// A spec of `image` whose id is a fresh one from `name`.
pub fn spec_of(image: Image, name: &str) -> SandboxSpec {
    let mut spec = SandboxSpec::new(image);
    spec.id = Some(unique_id(name));
    spec
}

/// A spec of the busybox image whose id is a fresh one from `name`.
pub fn busybox_spec(name: &str) -> SandboxSpec {
    spec_of(busybox_image(), name)
}

/// A backend on its own temporary root, destroyed on drop.
pub struct TestBackend {
    /// The backend.
    pub backend: LocalBackend,
    /// Its root.
    pub root: PathBuf,
    finished: bool,
}

/// A fresh short root directory (the agent's socket path must stay under 108 bytes).
pub fn fresh_root() -> PathBuf {
    tempfile::Builder::new()
        .prefix("orb-")
        .tempdir()
        .expect("creating a backend root")
        .keep()
}

/// The config every test backend uses on `root`.
pub fn test_config(root: &Path) -> LocalConfig {
    let mut config = LocalConfig::new(root, agent_binary());
    config.ready_timeout = Duration::from_secs(60);
    config
}

impl TestBackend {
    /// A backend on a fresh root.
    pub fn new() -> TestBackend {
        Self::with_config(test_config(&fresh_root()))
    }

    /// A backend with `config`.
    pub fn with_config(config: LocalConfig) -> TestBackend {
        let root = config.root.clone();
        let backend = LocalBackend::open(config).expect("opening the backend");
        TestBackend {
            backend,
            root,
            finished: false,
        }
    }

    /// Creates a sandbox, failing the test with the backend's error.
    pub async fn create(&self, spec: SandboxSpec) -> SandboxInfo {
        match within(Duration::from_secs(120), self.backend.create(spec)).await {
            Ok(info) => info,
            Err(e) => panic!("creating a sandbox failed: {e}"),
        }
    }

    /// A busybox sandbox with default options.
    pub async fn busybox(&self) -> SandboxInfo {
        self.create(busybox_spec("bb")).await
    }

    /// Deletes every sandbox, asserts the audit is empty, destroys the backend and
    /// asserts again.
    pub async fn finish(mut self) {
        for sb in self.backend.list() {
            if let Err(e) = self.backend.delete(&sb.id).await {
                panic!("deleting {} failed: {e}", sb.id);
            }
        }
        assert_clean(&self.backend).await;
        self.finished = true;
        self.backend
            .destroy()
            .await
            .expect("destroying the backend");
        assert_clean(&self.backend).await;
        assert!(!self.root.exists(), "{} left behind", self.root.display());
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Drop may run inside the test's runtime, where we cannot block.
        let backend = self.backend.clone();
        let root = backend.root().to_path_buf();
        if let Ok(Err(e)) = block_on_own_runtime(async move { backend.destroy().await }) {
            eprintln!("teardown of {}: {e}", root.display());
        }
    }
}

/// A backend on a fresh root whose sandboxes each get a disk of `bytes` and `inodes`,
/// `pool` of them made ahead.
pub fn backend_with_disk(bytes: u64, inodes: u64, pool: usize) -> TestBackend {
    let mut config = test_config(&fresh_root());
    config.disk = Some(DiskLimit { bytes, inodes });
    config.disk_pool = pool;
    TestBackend::with_config(config)
}

/// A backend on a fresh root whose harness bundle holds one tool, `bin/hello` (it prints
/// "hello from the harness"); answers it and the bundle's directory, for the caller to
/// remove after [`TestBackend::finish`].
pub fn backend_with_hello_harness() -> (TestBackend, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let root = fresh_root();
    let harness = root.with_extension("harness");
    fs::create_dir_all(harness.join("bin")).unwrap();
    fs::write(
        harness.join("bin/hello"),
        "#!/bin/sh\necho hello from the harness\n",
    )
    .unwrap();
    fs::set_permissions(harness.join("bin/hello"), fs::Permissions::from_mode(0o755)).unwrap();
    let mut config = test_config(&root);
    config.harness = Some(harness.clone());
    (TestBackend::with_config(config), harness)
}

/// A sandbox of the python:3.11-slim test image (Debian: python3, pip, git,
/// util-linux) with a fresh id from `name`; the image's store lives in the answered
/// directory, which must outlive the sandbox.
pub async fn python_sandbox(tb: &TestBackend, name: &str) -> (tempfile::TempDir, SandboxInfo) {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("store"), StoreConfig::default()).unwrap();
    store
        .import(&image_layout("python"), Some("python:3.11-slim"))
        .unwrap();
    let image = store.get("python:3.11-slim").unwrap().unwrap();
    let sb = tb.create(spec_of(image, name)).await;
    (dir, sb)
}

/// Asserts that the backend's audit finds nothing.
pub async fn assert_clean(backend: &LocalBackend) {
    let report = backend.audit().await.expect("running the audit");
    assert!(report.is_clean(), "leaks:\n{report}");
}

/// Runs `req` in the sandbox, failing the test on an API error.
pub async fn exec(sb: &SandboxInfo, req: ExecRequest) -> ExecResult {
    let what = format!("{:?}", req.command);
    match within(CALL_LIMIT, sb.client().exec(&req)).await {
        Ok(r) => r,
        Err(e) => panic!(
            "exec {what} in {} failed: {e}\n--- agent log ---\n{}",
            sb.id,
            fs::read_to_string(sb.bundle.join("agent.log")).unwrap_or_default()
        ),
    }
}

/// Runs a shell string.
pub async fn sh(sb: &SandboxInfo, script: &str) -> ExecResult {
    exec(sb, shell(script)).await
}

/// Runs a shell string that must succeed; answers its stdout.
pub async fn sh_ok(sb: &SandboxInfo, script: &str) -> String {
    let r = sh(sb, script).await;
    assert_eq!(r.exit_code, Some(0), "{script}: {r:?}");
    r.stdout.text_lossy()
}
