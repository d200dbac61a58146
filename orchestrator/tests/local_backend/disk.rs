//! A disk bound per sandbox (issue 31, point 4): on by default in `orchard serve`, made
//! and mounted ahead by the backend's pool, enforced as ENOSPC inside the sandbox for
//! bytes and for inodes, turned off with `--sandbox-disk none`, and leaving no mount and
//! no loop device behind.

use std::fs;
use std::path::Path;
use std::time::Duration;

use orchard::backend::local::disk::DiskLimit;

use crate::util::mounts_under;
use crate::util::sandbox::*;
use crate::util::server::{busybox_server, exec_waited, sandbox, send, KEY};

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
    let tb = backend_with_disk(32 << 20, 2048, 2);
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

/// Lines of `losetup -a` naming a file under `dir` (empty where losetup is missing).
fn losetup_under(dir: &Path) -> Vec<String> {
    let Ok(out) = std::process::Command::new("losetup").arg("-a").output() else {
        return Vec::new();
    };
    let dir = dir.to_string_lossy().into_owned();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&dir))
        .map(str::to_string)
        .collect()
}

/// Waits until no loop device backs a file under `dir`: an autoclear device detaches
/// right after its last user goes, not within the unmount.
async fn assert_no_loops_under(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !loops_under(dir).is_empty() || !losetup_under(dir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "loop devices left: {:?} {:?}",
            loops_under(dir),
            losetup_under(dir)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_sandboxes_and_a_destroyed_backend_leave_no_mount_or_loop_device_of_the_pool() {
    orchard_test_support::require_runc!();
    let tb = backend_with_disk(32 << 20, 2048, 2);
    let pool = tb
        .root
        .join("diskpool")
        .join(std::process::id().to_string());
    assert_eq!(tb.backend.wait_disk_pool(Duration::from_secs(60)), 2);
    // Mounted ahead: the pool's private mount and one per ready image, which the audit
    // accounts for.
    assert_eq!(mounts_under(&pool).len(), 3, "{:?}", mounts_under(&pool));
    assert_eq!(loops_under(&pool).len(), 2);
    assert_clean(&tb.backend).await;
    // The pool of a process that is gone, still mounted, is a leak (a new backend on the
    // root would clear it).
    let dead = tb.root.join("diskpool/999999999");
    fs::create_dir_all(dead.join("mnt")).unwrap();
    let run = |cmd: &[&str]| {
        let ok = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{cmd:?}");
    };
    let dead_mnt = dead.join("mnt");
    let dead_mnt_str = dead_mnt.to_string_lossy().into_owned();
    run(&["mount", "-t", "tmpfs", "orchard-test", &dead_mnt_str]);
    let report = tb.backend.audit().await.unwrap();
    assert_eq!(report.mounts, vec![dead_mnt.clone()], "{report}");
    assert_eq!(report.directories, vec![dead.clone()], "{report}");
    run(&["umount", &dead_mnt_str]);
    fs::remove_dir_all(&dead).unwrap();

    let a = tb.busybox().await;
    let b = tb.busybox().await;
    for sb in [&a, &b] {
        // One mount per sandbox disk, moved from the pool, on a loop device of its own.
        let disk = sb.bundle.join("disk").to_string_lossy().into_owned();
        let of_disk = mounts_under(&sb.bundle)
            .into_iter()
            .filter(|m| *m == disk)
            .count();
        assert_eq!(of_disk, 1, "{:?}", mounts_under(&sb.bundle));
        assert_eq!(loops_under(&sb.bundle).len(), 1);
    }
    sh_ok(&a, "echo kept > /file && cat /file").await;
    assert_eq!(tb.backend.wait_disk_pool(Duration::from_secs(60)), 2);
    assert_clean(&tb.backend).await;

    tb.backend.delete(&a.id).await.unwrap();
    assert_eq!(mounts_under(&a.bundle), Vec::<String>::new());
    assert_no_loops_under(&a.bundle).await;
    assert!(
        !loops_under(&b.bundle).is_empty(),
        "the other sandbox keeps its disk"
    );

    let root = tb.root.clone();
    // Deletes b, audits, destroys (the pool's mounted images too), audits again.
    tb.finish().await;
    assert_eq!(mounts_under(&root), Vec::<String>::new());
    assert_no_loops_under(&root).await;
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
    let (data, srv) = busybox_server("orchard-disk-", extra).await;
    let http = reqwest::Client::new();
    let id = "disk";
    sandbox(&http, &srv.url, KEY, id).await;
    let (_, job) = exec_waited(&http, &srv.url, KEY, id, "df -k / | tail -1").await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let line = job["stdout"].as_str().unwrap_or_default().to_string();
    let (s, v) = send(
        http.delete(format!("{}/v1/sandboxes/{id}", srv.url))
            .header("X-API-Key", KEY),
    )
    .await;
    assert!((200..300).contains(&s), "{s} {v}");
    // A stopped server leaves neither its pool's mounts nor their loop devices (mounts
    // outlive their process).
    drop(srv);
    assert_eq!(mounts_under(data.path()), Vec::<String>::new());
    assert_no_loops_under(data.path()).await;
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
    // Creates that found the pool empty (and made their image on their path).
    let mut pool_empty = 0;
    for _ in 0..rounds {
        for (i, (_, tb)) in variants.iter().enumerate() {
            if i == 1 && tb.backend.wait_disk_pool(Duration::ZERO) == 0 {
                pool_empty += 1;
            }
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
    // Round by round against the unbounded create of the same round: less sensitive to
    // a load that changes between rounds than the ratio of the medians.
    let paired = |t: &[f64]| {
        let mut d: Vec<f64> = t.iter().zip(&times[0]).map(|(a, b)| a - b).collect();
        pct(&mut d, 0.5)
    };
    let paired: Vec<f64> = times.iter().map(|t| paired(t)).collect();
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("{rounds} rounds; pool empty at {pool_empty} creates; load {load}");
    println!(
        "| variant | create p50 ms | p90 ms | p50 vs no bound | median of paired differences |"
    );
    println!("|---|---|---|---|---|");
    for (((name, _), t), d) in variants.iter().zip(times.iter_mut()).zip(paired) {
        let (p50, p90) = (pct(t, 0.5), pct(t, 0.9));
        println!(
            "| {name} | {p50:.1} | {p90:.1} | {:+.1} % | {d:+.1} ms |",
            (p50 / base - 1.0) * 100.0
        );
    }
    for (_, tb) in variants {
        tb.finish().await;
    }
}
