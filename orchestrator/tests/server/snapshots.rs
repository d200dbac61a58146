//! Stateful sandboxes over a real server and real runc sandboxes: pause and resume
//! (CPU measured in the sandbox's cgroup), snapshots under concurrent writes, 16 forks
//! that diverge and outlive their parent, sessions restored in forks, snapshot chains,
//! deletion refused while in use and layers collected after, quotas, and nothing left
//! on the host.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::server::{Options, TestServer, OTHER_KEY};

/// Runs `command`, which must exit 0; answers its stdout.
async fn run(srv: &TestServer, id: &str, command: &str) -> String {
    let (s, out) = srv
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": command }),
        )
        .await;
    assert_eq!(
        (s, out["exit_code"].as_i64()),
        (200, Some(0)),
        "{command}: {out}"
    );
    out["stdout"]["data"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// DELETE `path`, which must answer 200.
pub(super) async fn delete_ok(srv: &TestServer, path: &str) {
    let (s, body) = srv.delete(path).await;
    assert_eq!(s, 200, "DELETE {path}: {body}");
}

pub(super) async fn snapshot(srv: &TestServer, id: &str) -> Value {
    let (s, snap) = srv
        .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
        .await;
    assert_eq!(s, 201, "{snap}");
    snap
}

pub(super) async fn fork(srv: &TestServer, sid: &str, count: u32) -> Vec<String> {
    let (s, forks) = srv
        .post(
            &format!("/v1/snapshots/{sid}/fork"),
            json!({ "count": count }),
        )
        .await;
    assert_eq!(s, 201, "{forks}");
    let list = forks["sandboxes"].as_array().unwrap();
    assert_eq!(list.len(), count as usize);
    list.iter()
        .map(|f| {
            assert_eq!(f["status"], "running", "{f}");
            assert!(f["agent"]["token"].is_string(), "{f}");
            f["id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// A new sandbox in which `command` has run (and exited 0).
async fn sandbox_after(srv: &TestServer, command: &str) -> String {
    let id = srv.sandbox().await;
    run(srv, &id, command).await;
    id
}

/// Starts `command` as a background process in `id`; answers the process.
async fn start_process(srv: &TestServer, id: &str, command: &str) -> Value {
    let (s, p) = srv
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({ "command": command }),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    p
}

/// Pauses `id`, which must answer 200; answers the sandbox.
async fn pause(srv: &TestServer, id: &str) -> Value {
    let (s, paused) = srv
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(s, 200, "{paused}");
    paused
}

/// The id of snapshot `snap`.
fn snapshot_id(snap: &Value) -> String {
    snap["snapshot_id"].as_str().unwrap().to_string()
}

/// Deletes the sandboxes `ids`, then snapshot `sid`.
async fn delete_all(srv: &TestServer, ids: &[&str], sid: &str) {
    for id in ids {
        delete_ok(srv, &format!("/v1/sandboxes/{id}")).await;
    }
    delete_ok(srv, &format!("/v1/snapshots/{sid}")).await;
}

/// The backend's root (where `layers/` and `snapshots/` live).
fn root(srv: &TestServer) -> PathBuf {
    srv.backend.inner.root().to_path_buf()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// CPU time used by sandbox `id`'s cgroup, in nanoseconds.
fn cpu_ns(srv: &TestServer, id: &str) -> u64 {
    let info = srv.backend.inner.get(id).expect("the sandbox");
    for d in &info.cgroup_dirs {
        if let Ok(t) = std::fs::read_to_string(d.join("cpuacct.usage")) {
            return t.trim().parse().unwrap();
        }
        if let Ok(t) = std::fs::read_to_string(d.join("cpu.stat")) {
            let usec: u64 = t
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap();
            return usec * 1000;
        }
    }
    panic!("no CPU accounting for {id} in {:?}", info.cgroup_dirs);
}

/// Polls `read` until `done` holds of it (each poll is a real call, no fixed sleep
/// stands for the event).
async fn until<T, F, Fut>(what: &str, mut read: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = read().await;
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const COUNTER: &str = "i=0; while :; do i=$((i+1)); \
    if [ $((i % 200)) = 0 ]; then echo $i > /tmp/n.tmp && mv /tmp/n.tmp /tmp/n; fi; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_uses_no_cpu_refuses_calls_and_resumes_its_loop() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let p = start_process(&srv, &id, COUNTER).await;
    let pid = p["id"].as_str().unwrap().to_string();
    let count = || async { run(&srv, &id, "cat /tmp/n 2>/dev/null || echo 0").await };
    let parse = |t: &str| t.trim().parse::<u64>().unwrap_or(0);
    until("the loop counting", count, |t: &String| parse(t) > 0).await;

    let paused = pause(&srv, &id).await;
    assert_eq!(
        (paused["status"].as_str(), paused["paused"].as_bool()),
        (Some("paused"), Some(true))
    );
    // No CPU while paused: the busy loop is frozen, not descheduled.
    let before = cpu_ns(&srv, &id);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = cpu_ns(&srv, &id);
    assert_eq!(
        after,
        before,
        "a paused sandbox used {} ns of CPU",
        after - before
    );

    // Calls that need the agent answer a clear 409 at once; the rest work.
    let t = Instant::now();
    let (s, e) = srv
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(s, 409, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("paused"), "{e}");
    let (s, e) = srv
        .get(&format!("/v1/sandboxes/{id}/files?path=/tmp/n"))
        .await;
    assert_eq!(s, 409, "{e}");
    let (s, e) = srv
        .post(&format!("/sandboxes/{id}/exec"), json!({"command": "true"}))
        .await;
    assert_eq!(s, 409, "compatible exec: {e}");
    let (s, e) = srv
        .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
        .await;
    assert_eq!(s, 409, "snapshot of a paused sandbox: {e}");
    assert!(t.elapsed() < Duration::from_secs(5), "409s must not wait");
    let (s, hb) = srv
        .post(&format!("/v1/sandboxes/{id}/heartbeat"), json!({}))
        .await;
    assert_eq!(s, 200, "heartbeats are accepted while paused: {hb}");
    let (s, again) = srv
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(
        (s, again["paused"].as_bool()),
        (200, Some(true)),
        "pause is idempotent"
    );
    let (_, listed) = srv.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(listed["status"], "paused");

    let (s, resumed) = srv
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(s, 200, "{resumed}");
    assert_eq!(
        (resumed["status"].as_str(), resumed["paused"].as_bool()),
        (Some("running"), Some(false))
    );
    // The same loop goes on from where it stopped.
    let at_resume = parse(&count().await);
    until("the loop counting on", count, |t: &String| {
        parse(t) > at_resume
    })
    .await;
    let (_, p) = srv
        .get(&format!("/v1/sandboxes/{id}/processes/{pid}"))
        .await;
    assert_eq!(p["state"], "running", "{p}");
    assert!(cpu_ns(&srv, &id) > after);
    // A paused sandbox is deleted as quickly as any (delete thaws what it kills).
    pause(&srv, &id).await;
    let t = Instant::now();
    delete_ok(&srv, &format!("/v1/sandboxes/{id}")).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_during_a_snapshot_is_not_undone_by_the_snapshots_thaw() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = sandbox_after(&srv, "dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null").await;
    start_process(&srv, &id, COUNTER).await;
    let snap_path = format!("/v1/sandboxes/{id}/snapshots");
    let snap = srv.post(&snap_path, json!({}));
    let pause = async {
        // Sent once the capture has frozen the sandbox.
        let info = srv.backend.inner.get(&id).unwrap();
        until(
            "the capture freezing the sandbox",
            || async {
                info.cgroup_dirs.iter().any(|d| {
                    std::fs::read_to_string(d.join("freezer.state"))
                        .is_ok_and(|s| s.trim() != "THAWED")
                })
            },
            |frozen| *frozen,
        )
        .await;
        srv.post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
            .await
    };
    let ((s1, snap), (s2, paused)) = futures_util::future::join(snap, pause).await;
    assert_eq!(s1, 201, "{snap}");
    assert_eq!(
        (s2, paused["paused"].as_bool()),
        (200, Some(true)),
        "{paused}"
    );
    let before = cpu_ns(&srv, &id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        cpu_ns(&srv, &id),
        before,
        "the sandbox runs though it is paused"
    );
    let sid = snapshot_id(&snap);
    delete_all(&srv, &[&id], &sid).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_still_expires_with_its_ttl() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let (s, v) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:latest", "ttl_s": 2}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    pause(&srv, &id).await;
    let path = format!("/v1/sandboxes/{id}");
    until(
        "the TTL deleting the paused sandbox",
        || srv.get(&path),
        |(s, _)| *s == 404,
    )
    .await;
    // Gone from the host too, frozen processes included.
    let (bundle, state) = (
        root(&srv).join("sandboxes").join(&id),
        srv.backend.inner.runc_root().join(&id),
    );
    until(
        "the backend removing it",
        || async { !bundle.exists() && !state.exists() },
        |gone| *gone,
    )
    .await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_under_concurrent_writes_are_consistent_and_the_writer_goes_on() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    // b is written after a, each atomically: any real instant has a = b or a = b + 1.
    let writer = "mkdir -p /w; i=0; while :; do i=$((i+1)); \
        echo $i > /w/a.t && mv /w/a.t /w/a; echo $i > /w/b.t && mv /w/b.t /w/b; done";
    start_process(&srv, &id, writer).await;
    let read = || async { run(&srv, &id, "cat /w/b 2>/dev/null || echo 0").await };
    let parse = |t: &str| t.trim().parse::<u64>().unwrap_or(0);
    until("the writer writing", read, |t: &String| parse(t) > 10).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let snap = snapshot(&srv, &id).await;
        assert_eq!(snap["processes"], "none");
        assert!(snap["frozen_ms"].as_f64().unwrap() > 0.0);
        let sid = snapshot_id(&snap);
        let f = fork(&srv, &sid, 1).await.remove(0);
        let ab = run(&srv, &f, "cat /w/a /w/b").await;
        let v: Vec<u64> = ab.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert!(
            v.len() == 2 && (v[0] == v[1] || v[0] == v[1] + 1),
            "snapshot {sid} caught a moment that never was: a={ab:?}"
        );
        // No process is carried into a fork: the writer is not there.
        let again = run(&srv, &f, "cat /w/a /w/b").await;
        assert_eq!(again, ab, "the fork's files change: a writer runs in it");
        seen.push(v[1]);
        delete_all(&srv, &[&f], &sid).await;
    }
    // The parent's writer went on through every capture.
    let last = *seen.last().unwrap();
    until("the writer going on", read, |t: &String| parse(t) > last).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_forks_diverge_and_outlive_their_parent() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let parent = sandbox_after(
        &srv,
        "mkdir -p /data && echo parent > /data/f && echo keep > /data/k && rm /bin/vi \
         && mkdir -p /tmp/work && echo scratch > /tmp/work/s && chmod 640 /tmp/work/s",
    )
    .await;
    let snap = snapshot(&srv, &parent).await;
    let sid = snapshot_id(&snap);
    assert!(snap["size_bytes"].as_u64().unwrap() >= 20, "{snap}");
    // 8 bytes of content, and 512 for each of the three entries (the tmp layer's root,
    // `work` and `work/s`): every entry is charged its inode.
    assert_eq!(snap["tmp_bytes"], 8 + 3 * 512, "{snap}");
    assert_eq!(snap["layers"].as_array().unwrap().len(), 1);
    let forks = fork(&srv, &sid, 16).await;
    let (_, listed) = srv.get(&format!("/v1/snapshots/{sid}")).await;
    assert_eq!(listed["forks"].as_array().unwrap().len(), 16, "{listed}");

    // A change in one fork is seen nowhere else.
    run(&srv, &forks[0], "echo changed > /data/f; rm /data/k").await;
    for f in &forks[1..] {
        assert_eq!(run(&srv, f, "cat /data/f /data/k").await, "parent\nkeep\n");
    }
    assert_eq!(
        run(&srv, &parent, "cat /data/f /data/k").await,
        "parent\nkeep\n"
    );
    // The in-memory /tmp comes along, copied into each fork's own.
    assert_eq!(
        run(&srv, &forks[2], "cat /tmp/work/s; stat -c %a /tmp/work/s").await,
        "scratch\n640\n"
    );
    run(&srv, &forks[2], "echo mine > /tmp/work/s").await;
    assert_eq!(run(&srv, &forks[3], "cat /tmp/work/s").await, "scratch\n");
    // A deletion in the parent's layer stays deleted in forks (whiteouts carried).
    assert_eq!(
        run(&srv, &forks[1], "ls /bin/vi 2>&1 || echo gone")
            .await
            .trim_end()
            .lines()
            .last(),
        Some("gone")
    );

    // The parent goes; its forks run on, each on its own.
    delete_ok(&srv, &format!("/v1/sandboxes/{parent}")).await;
    let writes = forks.iter().map(|f| {
        let srv = &srv;
        async move { run(srv, f, &format!("echo {f} > /data/f")).await }
    });
    futures_util::future::join_all(writes).await;
    for f in &forks {
        assert_eq!(run(&srv, f, "cat /data/f").await, format!("{f}\n"));
    }
    for f in &forks {
        delete_ok(&srv, &format!("/v1/sandboxes/{f}")).await;
    }
    let (s, d) = srv.delete(&format!("/v1/snapshots/{sid}")).await;
    assert_eq!(s, 200, "{d}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_in_use_cannot_be_deleted_and_its_layers_go_once_it_is() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = sandbox_after(&srv, "head -c 100000 /dev/urandom > /big").await;
    let first = snapshot(&srv, &id).await;
    let s1 = snapshot_id(&first);
    // The same content again is the same snapshot (content-addressed).
    let again = snapshot(&srv, &id).await;
    assert_eq!(again["snapshot_id"], first["snapshot_id"]);
    assert_eq!(again["digest"], first["digest"]);

    // A chain: a fork's snapshot holds its parent's layer and its own.
    let f = fork(&srv, &s1, 1).await.remove(0);
    run(&srv, &f, "echo second > /second").await;
    let second = snapshot(&srv, &f).await;
    let s2 = snapshot_id(&second);
    assert_eq!(second["parent_snapshot_id"], s1.as_str());
    assert_eq!(second["layers"].as_array().unwrap().len(), 2);
    assert_eq!(second["layers"][0], first["layers"][0]);
    assert!(second["total_bytes"].as_u64() > second["size_bytes"].as_u64());
    let g = fork(&srv, &s2, 1).await.remove(0);
    assert_eq!(
        run(&srv, &g, "cat /second; wc -c < /big").await,
        "second\n100000\n"
    );

    // In use: refused, with the forks named.
    let (s, e) = srv.delete(&format!("/v1/snapshots/{s1}")).await;
    assert_eq!(s, 409, "{e}");
    assert!(e["detail"].as_str().unwrap().contains(&f), "{e}");
    // Not another key's to see or delete.
    let (s, _) = srv.get_as(OTHER_KEY, &format!("/v1/snapshots/{s1}")).await;
    assert_eq!(s, 404);
    let (s, list) = srv.get_as(OTHER_KEY, "/v1/snapshots").await;
    assert_eq!(
        (s, list["snapshots"].as_array().map(Vec::len)),
        (200, Some(0))
    );

    let layers = root(&srv).join("layers");
    assert_eq!(entries(&layers).len(), 2, "{:?}", entries(&layers));
    for sb in [&f, &g, &id] {
        delete_ok(&srv, &format!("/v1/sandboxes/{sb}")).await;
    }
    // s1's layer is s2's too: deleting s1 frees nothing yet.
    let (s, d) = srv.delete(&format!("/v1/snapshots/{s1}")).await;
    assert_eq!((s, d["freed_bytes"].as_u64()), (200, Some(0)), "{d}");
    assert_eq!(entries(&layers).len(), 2);
    let (s, d) = srv.delete(&format!("/v1/snapshots/{s2}")).await;
    assert_eq!(s, 200, "{d}");
    assert!(d["freed_bytes"].as_u64().unwrap() >= 100_000, "{d}");
    assert_eq!(entries(&layers), Vec::<String>::new(), "layers left behind");
    assert_eq!(entries(&root(&srv).join("snapshots")), Vec::<String>::new());
    let (s, _) = srv.get(&format!("/v1/snapshots/{s1}")).await;
    assert_eq!(s, 404);
    srv.finish().await;
}

/// A sandbox can nest directories far past `PATH_MAX` (with relative paths); the
/// capture fails on such a tree with a clear error, without overflowing a stack or
/// leaving a partial copy, and the sandbox goes on (it overflowed the server's stack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_nested_too_deep_fails_the_snapshot_cleanly_without_a_stack_overflow() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = sandbox_after(&srv, "mkdir -p /deep && cd /deep && i=0; while [ $i -lt 2500 ]; do mkdir d && cd d; i=$((i+1)); done").await;
    let (s, e) = srv
        .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
        .await;
    assert!((400..500).contains(&s), "{s} {e}");
    assert!(e["detail"].as_str().unwrap().contains("too deep"), "{e}");
    assert_eq!(entries(&root(&srv).join("layers")), Vec::<String>::new());
    assert_eq!(run(&srv, &id, "echo alive").await, "alive\n");
    srv.finish().await;
}

/// A sandbox's sparse terabyte is a few bytes of data: the snapshot copies those, not a
/// terabyte of zeros onto the host's disk, and forks see the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_terabyte_is_snapshotted_as_its_data() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = sandbox_after(&srv, "truncate -s 1099511627776 /sparse && echo end | dd of=/sparse bs=1 seek=1099511627772 conv=notrunc 2>/dev/null").await;
    let snap = snapshot(&srv, &id).await;
    assert!(snap["size_bytes"].as_u64().unwrap() < 1 << 20, "{snap}");
    let sid = snapshot_id(&snap);
    let f = fork(&srv, &sid, 1).await.remove(0);
    assert_eq!(
        run(
            &srv,
            &f,
            "stat -c %s /sparse; dd if=/sparse bs=1 skip=1099511627772 count=4 2>/dev/null"
        )
        .await,
        "1099511627776\nend\n"
    );
    delete_all(&srv, &[&f], &sid).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_snapshot_requests_are_refused_clearly() {
    orchard_test_support::require_runc!();
    let srv = TestServer::with(Options {
        configure: Some(Arc::new(|c| c.service.quotas.snapshot_bytes = 50_000)),
        ..Options::default()
    })
    .await;
    let id = srv.sandbox().await;
    let (s, e) = srv
        .post(
            &format!("/v1/sandboxes/{id}/snapshots"),
            json!({"processes": true}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (501, Some("not_implemented")),
        "{e}"
    );
    assert!(e["detail"].as_str().unwrap().contains("CRIU"), "{e}");
    let (s, e) = srv
        .post(
            &format!("/v1/sandboxes/{id}/snapshots"),
            json!({"labels": {"orchard.x": "1"}}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    let (s, _) = srv.post("/v1/sandboxes/nope/snapshots", json!({})).await;
    assert_eq!(s, 404);
    let (s, _) = srv.post("/v1/snapshots/snap-nope/fork", json!({})).await;
    assert_eq!(s, 404);
    let (s, _) = srv.delete("/v1/snapshots/../../etc").await;
    assert!(s == 404 || s == 400, "{s}");
    // The quota: 60 kB do not fit in 50 kB; the snapshot is not kept.
    run(&srv, &id, "head -c 60000 /dev/urandom > /f").await;
    let (s, e) = srv
        .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{e}"
    );
    let (_, list) = srv.get("/v1/snapshots").await;
    assert_eq!(
        list["snapshots"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    // 30 kB fit; the same state again is the same snapshot, not 30 kB more.
    run(&srv, &id, "rm /f; head -c 30000 /dev/urandom > /s").await;
    let snap = snapshot(&srv, &id).await;
    let sid = snap["snapshot_id"].as_str().unwrap();
    let again = snapshot(&srv, &id).await;
    assert_eq!(again["snapshot_id"], sid);
    let (_, list) = srv.get("/v1/snapshots").await;
    assert_eq!(
        list["snapshots"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    for count in [0, 65] {
        let (s, e) = srv
            .post(
                &format!("/v1/snapshots/{sid}/fork"),
                json!({"count": count}),
            )
            .await;
        assert_eq!(s, 400, "count {count}: {e}");
    }
    delete_ok(&srv, &format!("/v1/snapshots/{sid}")).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forks_sessions_come_back_with_their_directory_variables_and_functions() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    crate::util::server::import(srv.service.images(), "python", "python-snap:latest");
    let (s, v) = srv
        .post(
            "/v1/sandboxes",
            json!({"image": "python-snap:latest", "env": {"FROM_CREATE": "c"}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let base = format!("/v1/sandboxes/{id}/sessions");
    let (s, session) = srv.post(&base, json!({})).await;
    assert_eq!(s, 200, "{session}");
    let sess = session["id"].as_str().unwrap().to_string();
    let (s, r) = srv
        .post(
            &format!("{base}/{sess}/run"),
            json!({"command": "mkdir -p /tmp/deep && cd /tmp/deep && export TURN='t 7' && unset HOME; greet() { echo \"hi $1\"; }"}),
        )
        .await;
    assert_eq!((s, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let snap = snapshot(&srv, &id).await;
    let sessions = snap["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{snap}");
    assert_eq!(sessions[0]["cwd"], "/tmp/deep");
    let sid = snapshot_id(&snap);
    let f = fork(&srv, &sid, 1).await.remove(0);
    let (s, r) = srv
        .post(
            &format!("/v1/sandboxes/{f}/sessions/{sess}/run"),
            json!({"command": "pwd; echo \"$TURN\" \"$FROM_CREATE\" ${HOME-unset}; greet fork; echo $HOSTNAME"}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r["stdout"]["data"],
        format!("/tmp/deep\nt 7 c unset\nhi fork\n{f}\n"),
        "{r}"
    );
    delete_all(&srv, &[&f, &id], &sid).await;
    srv.finish().await;
}
