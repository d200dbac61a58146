//! The runtime's files and environment (issue 31) on the local backend: `/etc/hosts`,
//! `/etc/hostname`, `HOSTNAME` and, with egress, `/etc/resolv.conf`, on an image with
//! no `/etc` at all and on busybox's, which has one; the image's layers untouched, a
//! snapshot without them, a fork with its own.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use orchard::backend::local::{NetworkMode, SandboxInfo, SandboxSpec};
use orchard::backend::SnapshotSpec;
use orchard::image::ImageConfig;
use orchard_protocol::session::{SessionCreate, SessionRun};
use orchard_test_support::rootfs::install_busybox;

use crate::util::sandbox::*;

/// A layer of busybox and its applets, and nothing else: no `/etc` at all.
fn no_etc_layer() -> &'static PathBuf {
    static LAYER: OnceLock<PathBuf> = OnceLock::new();
    LAYER.get_or_init(|| {
        let dir = layers().base.join("no-etc");
        if !dir.exists() {
            install_busybox(&dir);
        }
        assert!(!dir.join("etc").exists());
        dir
    })
}

/// Every file and directory under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                todo.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().to_path_buf());
        }
    }
    out.sort();
    out
}

/// Checks what a program finds in sandbox `sb` named `host`, `own` being the address
/// its name resolves to.
async fn assert_runtime_files(sb: &SandboxInfo, host: &str, own: &str) {
    let hosts = sh_ok(sb, "cat /etc/hosts").await;
    assert!(hosts.starts_with("127.0.0.1\tlocalhost\n"), "{hosts}");
    assert!(
        hosts.contains("::1\tlocalhost ip6-localhost ip6-loopback\n"),
        "{hosts}"
    );
    assert!(hosts.contains(&format!("{own}\t{host}\n")), "{hosts}");
    assert_eq!(
        sh_ok(
            sb,
            "cat /etc/hostname; echo $HOSTNAME; hostname; hostname -i"
        )
        .await,
        format!("{host}\n{host}\n{host}\n{own}\n")
    );
    // A server on localhost, reached by that name and by the sandbox's (httpd has
    // bound its port when it returns: it forks into the background after).
    let served = sh_ok(
        sb,
        "mkdir -p /tmp/www && echo served > /tmp/www/x && httpd -p 8080 -h /tmp/www && \
         wget -qO- http://localhost:8080/x && wget -qO- http://$(hostname):8080/x",
    )
    .await;
    assert_eq!(served, "served\nserved\n");
    // A session's shell has the name too.
    let client = sb.client();
    let s = within(CALL_LIMIT, client.create_session(&SessionCreate::default()))
        .await
        .expect("a session");
    let run = SessionRun {
        command: "echo $HOSTNAME".into(),
        ..Default::default()
    };
    let r = within(CALL_LIMIT, client.session_run(&s.id, &run))
        .await
        .expect("a session command");
    assert_eq!(r.stdout.text_lossy(), format!("{host}\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_etc_gets_the_runtime_files_and_its_snapshot_and_forks_do_not_share_them()
{
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let layer = no_etc_layer().clone();
    let before = tree(&layer);
    let img = image("no-etc", vec![layer.clone()], ImageConfig::default());
    let mut spec = SandboxSpec::new(img.clone());
    let id = unique_id("noetc");
    spec.id = Some(id.clone());
    let sb = tb.create(spec).await;
    assert_runtime_files(&sb, &id, "127.0.1.1").await;
    // Without egress there is no resolver to name.
    assert_eq!(sh(&sb, "test -e /etc/resolv.conf").await.exit_code, Some(1));
    // Written to, the files stay the sandbox's.
    sh_ok(
        &sb,
        "echo '10.1.2.3 extra' >> /etc/hosts; echo data > /etc/mine",
    )
    .await;

    let snap = tb
        .backend
        .snapshot(SnapshotSpec {
            sandbox_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("a snapshot");
    let hex = snap.layers.last().unwrap().trim_start_matches("sha256:");
    let captured = tb.root.join("layers").join(hex);
    let files = tree(&captured);
    assert!(files.contains(&PathBuf::from("etc/mine")), "{files:?}");
    for f in ["etc/hosts", "etc/hostname", "etc/resolv.conf"] {
        assert!(
            !files.contains(&PathBuf::from(f)),
            "{f} captured: {files:?}"
        );
    }
    assert_eq!(tree(&layer), before, "the image's layer is untouched");

    let mut fork = SandboxSpec::new(img);
    let fork_id = unique_id("noetc-fork");
    fork.id = Some(fork_id.clone());
    fork.snapshot = Some(snap.id.clone());
    let forked = tb.create(fork).await;
    assert_eq!(sh_ok(&forked, "cat /etc/mine").await, "data\n");
    assert_runtime_files(&forked, &fork_id, "127.0.1.1").await;
    let hosts = sh_ok(&forked, "cat /etc/hosts").await;
    assert!(!hosts.contains("extra") && !hosts.contains(&id), "{hosts}");
    tb.backend
        .delete(&fork_id)
        .await
        .expect("deleting the fork");
    tb.backend
        .delete_snapshot(&snap.id)
        .await
        .expect("deleting the snapshot");
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_keeps_its_own_etc_files_under_the_runtimes_and_egress_names_a_resolver() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let mut spec = SandboxSpec::new(busybox_image());
    let id = unique_id("rtf-egress");
    spec.id = Some(id.clone());
    spec.network = NetworkMode::Egress {
        allow_host_loopback: false,
    };
    let sb = tb.create(spec).await;
    // With egress the name has the sandbox's own address, as a pod's has the pod IP.
    assert_runtime_files(&sb, &id, "10.0.2.100").await;
    assert_eq!(
        sh_ok(&sb, "cat /etc/resolv.conf").await,
        "nameserver 10.0.2.3\n"
    );
    // The image's own files are there as before, and nothing of the runtime's went
    // into the image's layer.
    assert_eq!(sh_ok(&sb, "cat /etc/motd").await, "bottom\n");
    for f in ["hosts", "hostname", "resolv.conf"] {
        assert!(!layers().busybox.join("etc").join(f).exists(), "{f}");
    }
    // What programs expect of /dev and the limits.
    let dev = sh_ok(
        &sb,
        "for d in null zero random urandom tty; do test -c /dev/$d || echo no $d; done; \
         test -e /dev/fd/0 || echo no fd; test -c /dev/pts/ptmx || echo no pts; \
         ulimit -n; df -k /dev/shm | tail -1",
    )
    .await;
    let mut lines = dev.lines();
    let nofile: u64 = lines.next().unwrap_or_default().parse().unwrap_or(0);
    assert!(nofile >= 1024, "{dev}");
    let shm: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(shm.get(1), Some(&"65536"), "/dev/shm of 64 MiB: {dev}");
    tb.finish().await;
}
