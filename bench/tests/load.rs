//! The load generator against a real `orchard serve` (the workspace's debug build) with
//! real sandboxes: every operation of the mix runs without an error, the binary prints
//! and writes its table and plot, and it deletes what it created.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use orchard_bench::host::{self, Server};
use orchard_bench::load::{self, Api, LoadConfig, Op};

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The server binary and agent `make test` builds, and the busybox image.
fn parts() -> (PathBuf, PathBuf, PathBuf) {
    let t = top();
    let agent = std::env::var_os("ORCHARD_AGENT_BIN").map_or_else(
        || t.join("target/x86_64-unknown-linux-musl/release/orchard-agent"),
        PathBuf::from,
    );
    (
        t.join("target/debug/orchard"),
        agent,
        t.join("images/out/busybox"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_of_the_mix_runs_and_the_binary_reports_and_cleans_up() {
    orchard_test_support::require_runc!();
    let (orchard, agent, image) = parts();
    for p in [&orchard, &agent, &image] {
        assert!(
            p.exists(),
            "{} is missing: `make agent images` and a workspace build",
            p.display()
        );
    }
    let mut server = Server::start(&orchard, &agent, &image, &[]).unwrap();
    let api = Api::new(&server.url, &server.key).unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(api.create_ready("busybox:latest").await.unwrap());
    }
    let cfg = LoadConfig {
        clients: 3,
        duration: Duration::from_millis(1500),
        mix: "exec=1,v1=1,file=1,session=1".parse().unwrap(),
        file_bytes: 10_000,
    };
    let r = load::run(&api, &ids, &cfg).await;
    assert_eq!(r.error_count(), 0, "{}", r.table());
    for op in Op::ALL {
        assert!(
            r.samples.iter().any(|s| s.op == op && s.ok),
            "no successful {} call:\n{}",
            op.key(),
            r.table()
        );
    }
    let out = tempfile::tempdir().unwrap();
    let png = out.path().join("t.png");
    orchard_bench::plot::latency_png(&png, "test", &r).unwrap();
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");

    // The binary: its own sandboxes, table on stdout, files in --out, all deleted.
    let bin = Command::new(env!("CARGO_BIN_EXE_orchard-load"))
        .args(["--sandboxes", "2", "--clients", "2", "--duration-s", "1"])
        .args(["--mix", "exec=2,session=1", "--name", "smoke", "--out"])
        .arg(out.path())
        .env("SANDBOX_BASE_URL", &server.url)
        .env("SANDBOX_API_KEY", &server.key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&bin.stdout);
    assert!(
        bin.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&bin.stderr)
    );
    assert!(
        stdout.contains("| exec |") && stdout.contains("| session |"),
        "{stdout}"
    );
    assert!(out.path().join("smoke.md").exists() && out.path().join("smoke.png").exists());
    let listed = api.get("/v1/sandboxes").await.unwrap();
    let n = listed
        .as_array()
        .or_else(|| listed["sandboxes"].as_array())
        .map_or(0, Vec::len);
    assert_eq!(n, 2, "only the test's own two sandboxes are left: {listed}");
    for id in &ids {
        api.delete(&format!("/v1/sandboxes/{id}")).await.unwrap();
    }
    assert!(
        host::leftovers(&server.data).is_empty(),
        "{:?}",
        host::leftovers(&server.data)
    );
    // Stopped, the server leaves no mount at all, its disk pool's included.
    let data = server.data.display().to_string();
    server.stop().unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|p| p.starts_with(&data))
        })
        .collect();
    assert!(left.is_empty(), "a stopped server left mounts: {left:?}");
}
