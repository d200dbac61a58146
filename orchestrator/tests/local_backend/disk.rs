//! A disk bound per sandbox (issue 31, point 4): on by default in `orchard serve`, made
//! ahead by the backend's pool, enforced as ENOSPC inside the sandbox for bytes and for
//! inodes, turned off with `--sandbox-disk none`, and leaving no loop device behind.

use std::fs;
use std::path::Path;
use std::time::Duration;

use orchard::backend::local::disk::DiskLimit;
use serde_json::{json, Value};

use crate::util::sandbox::*;
use crate::util::server::{image_layout, ServerProcess, KEY};

/// Backing files of the attached loop devices under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .map(|f| f.trim().to_string())
        .filter(|f| f.starts_with(&dir.to_string_lossy().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_disk_bound_is_enospc_for_bytes_and_inodes_and_leaves_no_loop_device() {
    orchard_test_support::require_runc!();
    let root = fresh_root();
    let mut config = test_config(&root);
    config.disk = Some(DiskLimit {
        bytes: 32 << 20,
        inodes: 2048,
    });
    config.disk_pool = 2;
    let tb = TestBackend::with_config(config);
    assert_eq!(tb.backend.wait_disk_pool(Duration::from_secs(60)), 2);
    let sb = tb.busybox().await;
    // The pool made the image: the create took one, and the pool makes it good again.
    assert_eq!(tb.backend.wait_disk_pool(Duration::from_secs(60)), 2);
    let r = sh(&sb, "dd if=/dev/zero of=/big bs=1M count=64").await;
    assert_ne!(r.exit_code, Some(0), "64 MiB fit a 32 MiB disk: {r:?}");
    assert!(
        r.stderr.text_lossy().contains("No space left on device"),
        "{r:?}"
    );
    sh_ok(&sb, "rm /big; mkdir /many").await;
    let r = sh(&sb, "cd /many && seq 1 4000 | xargs touch").await;
    assert_ne!(r.exit_code, Some(0), "4000 files on 2048 inodes: {r:?}");
    assert!(
        r.stderr.text_lossy().contains("No space left on device"),
        "{r:?}"
    );
    // Freed space is usable again.
    sh_ok(&sb, "rm -r /many; echo fine > /after").await;
    assert!(
        !loops_under(&tb.root).is_empty(),
        "the sandbox's disk is a loop device"
    );
    let root = tb.root.clone();
    tb.finish().await;
    assert_eq!(
        loops_under(&root),
        Vec::<String>::new(),
        "loop devices left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_disk_bound_a_sandbox_writes_past_it() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    assert_eq!(tb.backend.wait_disk_pool(Duration::from_secs(1)), 0);
    let sb = tb.busybox().await;
    sh_ok(
        &sb,
        "dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null; rm /big",
    )
    .await;
    assert!(loops_under(&tb.root).is_empty());
    tb.finish().await;
}

/// `df -k /` inside a busybox sandbox of a real `orchard serve` started with `extra`:
/// the size of the writable layer's filesystem, in KiB.
async fn root_size_kib_under_serve(extra: &[&str]) -> u64 {
    let data = tempfile::Builder::new()
        .prefix("orchard-disk-")
        .tempdir()
        .unwrap();
    let srv = ServerProcess::start(data.path(), extra);
    let mut tar = tar::Builder::new(Vec::new());
    tar.append_dir_all(".", image_layout("busybox")).unwrap();
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/images/import?name=busybox:latest", srv.url))
        .header("X-API-Key", KEY)
        .body(tar.into_inner().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sb: Value = http
        .post(format!("{}/v1/sandboxes", srv.url))
        .header("X-API-Key", KEY)
        .json(&json!({"image": "busybox:latest"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = sb["id"].as_str().unwrap_or_else(|| panic!("{sb}"));
    let job: Value = http
        .post(format!("{}/sandboxes/{id}/exec", srv.url))
        .header("X-API-Key", KEY)
        .json(&json!({"command": "df -k / | tail -1", "wait": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(job["status"], "succeeded", "{job}");
    let line = job["stdout"].as_str().unwrap_or_default().to_string();
    let r = http
        .delete(format!("{}/v1/sandboxes/{id}", srv.url))
        .header("X-API-Key", KEY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    line.split_whitespace()
        .nth(1)
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("no size in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchard_serve_bounds_each_sandbox_disk_by_default_and_none_turns_it_off() {
    orchard_test_support::require_runc!();
    let bounded = root_size_kib_under_serve(&[]).await;
    // 10 GiB less ext4's own metadata.
    assert!(
        (9 << 20..=10 << 20).contains(&bounded),
        "a default sandbox's / is {bounded} KiB, not 10 GiB"
    );
    let unbounded = root_size_kib_under_serve(&["--sandbox-disk", "none"]).await;
    assert_ne!(unbounded, bounded, "--sandbox-disk none still bounded it");
}

/// Create-to-ready time of a busybox sandbox without a disk bound, with the default
/// bound and its pool, and with the bound but no pool (every create runs mkfs), the
/// three interleaved round by round so that drift of the machine hits them alike. By
/// hand: `cargo test -p orchard --test integration bench_create_with_the_disk_bound --
/// --ignored --nocapture` (figures in docs/sandbox-disk.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark, run by hand"]
async fn bench_create_with_the_disk_bound() {
    orchard_test_support::require_runc!();
    let rounds: usize = std::env::var("ORCHARD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let bound = DiskLimit {
        bytes: 10 << 30,
        inodes: 1 << 20,
    };
    let backend = |disk: Option<DiskLimit>, pool: usize| {
        let mut config = test_config(&fresh_root());
        config.disk = disk;
        config.disk_pool = pool;
        TestBackend::with_config(config)
    };
    let variants = [
        ("no bound", backend(None, 0)),
        ("10 GiB, pool of 4", backend(Some(bound), 4)),
        ("10 GiB, no pool", backend(Some(bound), 0)),
    ];
    for (_, tb) in &variants {
        tb.backend.wait_disk_pool(Duration::from_secs(60));
        // Warm-up: the first create pays for caches.
        let sb = tb.busybox().await;
        tb.backend.delete(&sb.id).await.unwrap();
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (i, (_, tb)) in variants.iter().enumerate() {
            let t0 = std::time::Instant::now();
            let sb = tb.busybox().await;
            times[i].push(t0.elapsed().as_secs_f64() * 1000.0);
            tb.backend.delete(&sb.id).await.unwrap();
        }
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let base = pct(&mut times[0].clone(), 0.5);
    println!("| variant | create p50 ms | p90 ms | p50 vs no bound |");
    println!("|---|---|---|---|");
    for ((name, _), t) in variants.iter().zip(times.iter_mut()) {
        let (p50, p90) = (pct(t, 0.5), pct(t, 0.9));
        println!(
            "| {name} | {p50:.1} | {p90:.1} | {:+.1} % |",
            (p50 / base - 1.0) * 100.0
        );
    }
    for (_, tb) in variants {
        tb.finish().await;
    }
}
