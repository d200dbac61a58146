//! `bench_snapshots`: what snapshots and forks cost, measured side by side with their
//! floors in one run.
//!
//! - Snapshot time against the bytes captured (a sandbox that wrote 64 MiB, 256 MiB and
//!   1 GiB), next to `cp -a` of the same upper directory on the same disk, each after a
//!   `sync`. The copy is bound by the disk's write speed (`cp` uses `copy_file_range`,
//!   the snapshot reads, hashes and writes); the sandbox is frozen for all of it.
//! - Fork of the 1 GiB snapshot: one fork at a time against one plain `/v1` create at a
//!   time (interleaved, medians), then k = 16 in one call against 16 concurrent
//!   creates; and the disk each fork holds of its own (its bundle, not crossing the
//!   rootfs mount).
//! - The point of it: k = 8 continuations from turn t of a scripted prefix (a package
//!   unpacked, an index built, files edited) by running the prefix once and forking,
//!   against running the prefix in 8 sandboxes.
//!
//! Writes `ORCHARD_BENCH_OUT` (default `bench/results/snapshots.md`); the "prev" column
//! reads the previous table. Nothing about times is asserted.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};

use crate::util::bench::{change, out_path, pcts, previous};
use crate::util::server::TestServer;

/// Single forks and creates measured, interleaved.
const ROUNDS: usize = 12;

async fn run(srv: &TestServer, id: &str, command: &str) -> String {
    let (s, out) = srv
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": command, "timeout_ms": 600_000 }),
        )
        .await;
    assert_eq!(s, 200, "{command}: {out}");
    assert_eq!(out["exit_code"], 0, "{command}: {out}");
    out["stdout"]["data"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn create(srv: &TestServer) -> (String, f64) {
    let t = Instant::now();
    let id = srv.sandbox().await;
    (id, t.elapsed().as_secs_f64() * 1e3)
}

async fn snapshot(srv: &TestServer, id: &str) -> (Value, f64) {
    let t = Instant::now();
    let snap = super::snapshots::snapshot(srv, id).await;
    (snap, t.elapsed().as_secs_f64() * 1e3)
}

async fn fork(srv: &TestServer, sid: &str, count: u32) -> (Vec<String>, f64) {
    let t = Instant::now();
    let ids = super::snapshots::fork(srv, sid, count).await;
    (ids, t.elapsed().as_secs_f64() * 1e3)
}

async fn delete_all(srv: &TestServer, ids: &[String]) {
    for id in ids {
        super::snapshots::delete_ok(srv, &format!("/v1/sandboxes/{id}")).await;
    }
}

/// Allocated bytes under `dir`, not crossing into other filesystems (the rootfs
/// overlay, which is the shared layers).
fn own_disk(dir: &Path) -> u64 {
    fn walk(path: &Path, dev: u64) -> u64 {
        let Ok(m) = path.symlink_metadata() else {
            return 0;
        };
        if m.dev() != dev {
            return 0;
        }
        let mut n = m.blocks() * 512;
        if m.is_dir() {
            if let Ok(entries) = std::fs::read_dir(path) {
                n += entries.flatten().map(|e| walk(&e.path(), dev)).sum::<u64>();
            }
        }
        n
    }
    let dev = dir.symlink_metadata().map(|m| m.dev()).unwrap_or(0);
    walk(dir, dev)
}

/// The prefix of a rollout: "installs a package" (3,000 files unpacked from an archive
/// it builds), builds an index of it, edits files.
const PREFIX: &str = "mkdir -p /opt/src && cd /opt/src && i=0; \
    while [ $i -lt 1500 ]; do head -c 2048 /dev/urandom > m$i.py; i=$((i+1)); done; \
    tar czf /opt/pkg.tgz -C /opt src && rm -rf /opt/src && mkdir -p /opt/pkg && \
    tar xzf /opt/pkg.tgz -C /opt/pkg && md5sum /opt/pkg/src/* > /opt/index && \
    for f in /opt/pkg/src/m1*.py; do sed -i 's/a/b/g' $f; done";
/// One continuation: a small edit and a check.
const CONTINUATION: &str = "echo turn >> /opt/pkg/src/m1.py && md5sum /opt/pkg/src/m1.py /opt/index >/dev/null && wc -l < /opt/index";

/// `cargo test --release -p orchard --test integration bench_snapshots -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by make bench"]
async fn bench_snapshots() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let mut md = String::new();
    let out = out_path("snapshots.md");
    let prev = std::fs::read_to_string(&out).unwrap_or_default();

    // Snapshot time against bytes, with `cp -a` of the same upper directory as floor.
    let parent = srv.sandbox().await;
    let bundle = srv.backend.inner.get(&parent).unwrap().bundle;
    let upper = bundle.join("disk/upper");
    let mut rows = Vec::new();
    let mut big = None;
    for mib in [64u64, 256, 1024] {
        run(&srv, &parent, "rm -f /big").await;
        run(
            &srv,
            &parent,
            &format!("dd if=/dev/zero of=/big bs=1M count={mib} 2>/dev/null && sync"),
        )
        .await;
        // The floor first, each after a `sync`: neither pays for the other's dirty
        // pages (this disk writes a few hundred MB/s; the copies fit in memory).
        let sync = || {
            assert!(std::process::Command::new("sync")
                .status()
                .unwrap()
                .success())
        };
        sync();
        let copy_to = tempfile::tempdir_in(srv.backend.inner.root()).unwrap();
        let t = Instant::now();
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(&upper)
            .arg(copy_to.path().join("c"))
            .status()
            .unwrap();
        assert!(status.success());
        let cp_ms = t.elapsed().as_secs_f64() * 1e3;
        drop(copy_to);
        sync();
        let (snap, ms) = snapshot(&srv, &parent).await;
        let bytes = snap["size_bytes"].as_u64().unwrap();
        rows.push((mib, bytes, ms, snap["frozen_ms"].as_f64().unwrap(), cp_ms));
        let sid = snap["snapshot_id"].as_str().unwrap().to_string();
        if mib == 1024 {
            big = Some(sid);
        } else {
            super::snapshots::delete_ok(&srv, &format!("/v1/snapshots/{sid}")).await;
        }
    }
    let big = big.unwrap();
    writeln!(md, "# Snapshots and forks\n").unwrap();
    writeln!(
        md,
        "`make bench` → `bench_snapshots` (orchestrator/tests/server/bench_snapshots.rs), \
         busybox sandboxes through the `/v1` API of an in-process server on the local \
         backend; one run, floors measured in the same run.\n"
    )
    .unwrap();
    writeln!(md, "## Snapshot time against the bytes captured\n").unwrap();
    writeln!(
        md,
        "| written | captured bytes | snapshot ms | frozen ms | MiB/s | `cp -a` of the upper ms | vs `cp -a` | prev snapshot ms |"
    )
    .unwrap();
    writeln!(md, "|---|---|---|---|---|---|---|---|").unwrap();
    for (mib, bytes, ms, frozen, cp) in &rows {
        let label = format!("{mib} MiB");
        writeln!(
            md,
            "| {label} | {bytes} | {ms:.0} | {frozen:.0} | {:.0} | {cp:.0} | {:.2}x | {} |",
            *bytes as f64 / (1 << 20) as f64 / (ms / 1e3),
            ms / cp,
            change(*ms, previous(&prev, &label, 4)),
        )
        .unwrap();
    }

    // One fork at a time against one create at a time, interleaved.
    let (mut fork_ms, mut create_ms) = (Vec::new(), Vec::new());
    let mut disks = Vec::new();
    for _ in 0..ROUNDS {
        let (ids, ms) = fork(&srv, &big, 1).await;
        fork_ms.push(ms);
        let b = srv.backend.inner.get(&ids[0]).unwrap().bundle;
        disks.push(own_disk(&b) as f64);
        assert_eq!(
            run(&srv, &ids[0], "wc -c < /big").await.trim(),
            "1073741824"
        );
        delete_all(&srv, &ids).await;
        let (id, ms) = create(&srv).await;
        create_ms.push(ms);
        delete_all(&srv, &[id]).await;
    }
    // k = 16 in one call against 16 concurrent creates.
    let (forks16, k16_ms) = fork(&srv, &big, 16).await;
    let per_fork_disk: Vec<f64> = forks16
        .iter()
        .map(|id| own_disk(&srv.backend.inner.get(id).unwrap().bundle) as f64)
        .collect();
    delete_all(&srv, &forks16).await;
    let t = Instant::now();
    let made = futures_util::future::join_all((0..16).map(|_| srv.sandbox())).await;
    let c16_ms = t.elapsed().as_secs_f64() * 1e3;
    delete_all(&srv, &made).await;
    let (f, c) = (pcts(&fork_ms), pcts(&create_ms));
    let disk = pcts(&per_fork_disk);
    let disk1 = pcts(&disks);
    writeln!(
        md,
        "\n## Forks of the 1 GiB snapshot against plain creates\n"
    )
    .unwrap();
    writeln!(md, "| measure | n | p50 | vs plain create | prev p50 |").unwrap();
    writeln!(md, "|---|---|---|---|---|").unwrap();
    let row = |md: &mut String, label: &str, n: usize, v: f64, floor: f64, unit: &str| {
        writeln!(
            md,
            "| {label} | {n} | {v:.1} {unit} | {:.2}x | {} |",
            v / floor,
            change(v, previous(&prev, label, 3)),
        )
        .unwrap();
    };
    row(
        &mut md,
        "plain create, one at a time",
        c.n,
        c.p50,
        c.p50,
        "ms",
    );
    row(&mut md, "fork k=1, one at a time", f.n, f.p50, c.p50, "ms");
    row(
        &mut md,
        "16 concurrent plain creates, per sandbox",
        16,
        c16_ms / 16.0,
        c16_ms / 16.0,
        "ms",
    );
    row(
        &mut md,
        "fork k=16 in one call, per fork",
        16,
        k16_ms / 16.0,
        c16_ms / 16.0,
        "ms",
    );
    writeln!(
        md,
        "\nDisk each fork holds of its own (its bundle: state, config, empty upper, agent \
         log; allocated blocks, not crossing the rootfs mount): p50 {:.0} KiB, max {:.0} KiB over \
         the 16 forks of one call; p50 {:.0} KiB over the single forks (each ran `wc -c` on \
         the 1 GiB file). The 1 GiB layer is on disk once.",
        disk.p50 / 1024.0,
        per_fork_disk.iter().cloned().fold(0.0, f64::max) / 1024.0,
        disk1.p50 / 1024.0,
    )
    .unwrap();
    super::snapshots::delete_ok(&srv, &format!("/v1/snapshots/{big}")).await;
    delete_all(&srv, &[parent]).await;

    // k = 8 continuations from turn t: fork against replay.
    let t = Instant::now();
    let base = srv.sandbox().await;
    run(&srv, &base, PREFIX).await;
    let prefix_ms = t.elapsed().as_secs_f64() * 1e3;
    let (snap, _) = snapshot(&srv, &base).await;
    let sid = snap["snapshot_id"].as_str().unwrap().to_string();
    let (forks, _) = fork(&srv, &sid, 8).await;
    let outs =
        futures_util::future::join_all(forks.iter().map(|f| run(&srv, f, CONTINUATION))).await;
    let fork_total = t.elapsed().as_secs_f64() * 1e3;
    delete_all(&srv, &forks).await;
    delete_all(&srv, &[base]).await;
    super::snapshots::delete_ok(&srv, &format!("/v1/snapshots/{sid}")).await;
    let t = Instant::now();
    let replays = futures_util::future::join_all((0..8).map(|_| async {
        let id = srv.sandbox().await;
        run(&srv, &id, PREFIX).await;
        let out = run(&srv, &id, CONTINUATION).await;
        (id, out)
    }))
    .await;
    let replay_total = t.elapsed().as_secs_f64() * 1e3;
    for (id, out) in &replays {
        assert_eq!(out, &outs[0], "a replay and a fork ended differently");
        delete_all(&srv, std::slice::from_ref(id)).await;
    }
    writeln!(md, "\n## k = 8 continuations from turn t\n").unwrap();
    writeln!(
        md,
        "The prefix: 1,500 files written, packed, unpacked (a package install), indexed \
         with `md5sum`, a third of them edited with `sed`; it took {prefix_ms:.0} ms once. \
         Each continuation appends to a file and checks the index.\n"
    )
    .unwrap();
    writeln!(md, "| way | wall ms | vs replay | prev wall ms |").unwrap();
    writeln!(md, "|---|---|---|---|").unwrap();
    for (label, v) in [
        ("prefix once, snapshot, fork 8, 8 continuations", fork_total),
        (
            "8 sandboxes each running the prefix and a continuation",
            replay_total,
        ),
    ] {
        writeln!(
            md,
            "| {label} | {v:.0} | {:.2}x | {} |",
            v / replay_total,
            change(v, previous(&prev, label, 2)),
        )
        .unwrap();
    }
    print!("{md}");
    std::fs::write(&out, &md).expect("writing the benchmark table");
    srv.finish().await;
}
