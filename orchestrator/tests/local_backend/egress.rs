//! Issue 30, point 8: egress means the internet only. A sandbox allowed egress reaches
//! through slirp4netns whatever the host reaches; it must not reach private ranges,
//! link-local (the cloud's metadata service) or the host's own addresses unless the
//! operator allowed them.
//!
//! The "host" here is a network namespace the test makes for itself: the scenario runs
//! on a thread moved into a fresh namespace, so the backend's slirp4netns starts there
//! and the addresses the test adds to a veth pair in that namespace play the host's
//! networks.
//! Nothing of the machine's own network is touched.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use orchard::backend::local::{NetworkMode, SandboxInfo};
use orchard::egress::EgressPolicy;

use crate::util::sandbox::*;

/// A responder on `addr` (answers `reached` and closes) counting the connections it accepted.
struct Responder {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Responder {
    fn start(ip: &str) -> Responder {
        let listener = TcpListener::bind((ip, 0)).expect("binding a responder");
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                h.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(b"reached");
            }
        });
        Responder {
            addr,
            hits,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        // Wakes the accept loop so it sees the flag.
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `ip` in the current thread's network namespace.
fn ip(args: &str) {
    let status = std::process::Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .expect("running ip");
    assert!(status.success(), "ip {args}: {status}");
}

/// What `nc` in `sb` gets from `to`: `reached`, or its error. The responder answers
/// and closes at once, so nc returns; `-w` only bounds a broken run.
async fn fetch(sb: &SandboxInfo, to: SocketAddr) -> String {
    let mut req = shell(&format!(
        "echo hello | nc -w 10 {} {} 2>&1; echo \" rc=$?\"",
        to.ip(),
        to.port()
    ));
    req.timeout_ms = Some(30_000);
    exec(sb, req).await.stdout.text_lossy()
}

async fn scenario() {
    // The "host's" networks: a private address, the metadata address, a public one
    // that is only the host's own, and a private one the operator allows.
    // On a veth pair, as on a real host's interface: slirp4netns' own loopback check
    // (`--disable-host-loopback`) refuses some addresses of `lo` by itself, which
    // would hide whether the filter works.
    ip("link set lo up");
    ip("link add orch-e0 type veth peer name orch-e1");
    for addr in [
        "10.77.0.1/32",
        "169.254.169.254/32",
        "192.0.2.77/32",
        "10.78.0.1/32",
    ] {
        ip(&format!("addr add {addr} dev orch-e0"));
    }
    ip("link set orch-e1 up");
    ip("link set orch-e0 up");
    let private = Responder::start("10.77.0.1");
    let metadata = Responder::start("169.254.169.254");
    let host_own = Responder::start("192.0.2.77");
    let allowed = Responder::start("10.78.0.1");

    let mut config = test_config(&fresh_root());
    config.egress = EgressPolicy::parse(&["10.78.0.0/16"]).unwrap();
    let tb = TestBackend::with_config(config);
    let mut spec = busybox_spec("egress-inet");
    spec.network = NetworkMode::Egress {
        allow_host_loopback: false,
    };
    let sb = tb.create(spec).await;

    // The operator's range is reached: egress works through the filter.
    let got = fetch(&sb, allowed.addr).await;
    assert!(got.starts_with("reached"), "{got}");
    assert_eq!(allowed.hits.load(Ordering::SeqCst), 1);
    for (what, r) in [
        ("a private address", &private),
        ("the metadata address", &metadata),
        ("the host's own address", &host_own),
    ] {
        let got = fetch(&sb, r.addr).await;
        assert!(!got.contains("reached"), "{what}: {got}");
        assert!(!got.ends_with(" rc=0\n"), "{what}: {got}");
        assert_eq!(
            r.hits.load(Ordering::SeqCst),
            0,
            "{what} was reached: {got}"
        );
    }
    // Rules and routes are the namespace's own: root in the sandbox cannot drop them.
    let r = exec(&sb, shell("ip route add 10.77.0.0/16 dev tap0 2>&1; nft flush ruleset 2>&1; ip addr add 10.77.0.9/32 dev tap0 2>&1")).await;
    assert!(
        r.stdout.text_lossy().contains("Operation not permitted")
            || r.stdout.text_lossy().contains("not found"),
        "{r:?}"
    );
    assert_eq!(private.hits.load(Ordering::SeqCst), 0);
    tb.finish().await;
}

#[test]
fn regression_egress_reaches_neither_private_nor_link_local_nor_host_addresses() {
    orchard_test_support::require_runc!();
    // A thread of its own moved into a fresh network namespace: only this thread and
    // what it starts (slirp4netns, the responders' sockets) live there.
    std::thread::spawn(|| {
        // SAFETY: unshare changes only this thread's namespaces.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare: {}", std::io::Error::last_os_error());
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario());
    })
    .join()
    .expect("the scenario failed");
}
