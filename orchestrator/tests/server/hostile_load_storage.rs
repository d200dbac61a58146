//! Hostile load on the host's storage (issue 30, point 6), against the real server
//! binary: the storage half of `hostile_load`. Snapshots of all keys together are
//! bounded on the host and by its free space.

use serde_json::{json, Value};

use super::hostile_load::{import_busybox, sandbox};
use crate::util::server::{send, ServerProcess, KEY, OTHER_KEY};

/// Runs `command` in `id` through the compatible API; answers its stdout.
async fn run(url: &str, key: &str, id: &str, command: &str) -> String {
    let (s, job) = send(
        reqwest::Client::new()
            .post(format!("{url}/sandboxes/{id}/exec"))
            .header("X-API-Key", key)
            .json(&json!({"command": command, "wait": true})),
    )
    .await;
    assert_eq!(
        (s, job["exit_code"].as_i64()),
        (200, Some(0)),
        "{command}: {job}"
    );
    job["stdout"].as_str().unwrap_or_default().to_string()
}

/// Bytes all snapshots listed for `key` hold.
async fn snapshot_bytes(http: &reqwest::Client, url: &str, key: &str) -> (u64, Vec<String>) {
    let (s, list) = send(
        http.get(format!("{url}/v1/snapshots"))
            .header("X-API-Key", key),
    )
    .await;
    assert_eq!(s, 200, "{list}");
    let snaps = list["snapshots"].as_array().unwrap();
    (
        snaps
            .iter()
            .map(|s| s["size_bytes"].as_u64().unwrap())
            .sum(),
        snaps
            .iter()
            .map(|s| s["snapshot_id"].as_str().unwrap().to_string())
            .collect(),
    )
}

/// Takes a snapshot of `id` as `key`.
async fn take(http: &reqwest::Client, url: &str, key: &str, id: &str) -> (u16, Value) {
    send(
        http.post(format!("{url}/v1/sandboxes/{id}/snapshots"))
            .header("X-API-Key", key)
            .json(&json!({})),
    )
    .await
}

/// Deletes every snapshot of `key`.
async fn delete_all(http: &reqwest::Client, url: &str, key: &str) {
    for sid in snapshot_bytes(http, url, key).await.1 {
        let (s, v) = send(
            http.delete(format!("{url}/v1/snapshots/{sid}"))
                .header("X-API-Key", key),
        )
        .await;
        assert_eq!(s, 200, "{v}");
    }
}

/// Regression (issue 30, point 6): snapshot data lives on the host outside every
/// sandbox's disk, and only each key's quota bounded it. Now all keys' snapshots
/// together stay within `--snapshot-bytes-total` (3 MiB here): four parallel snapshots
/// of 1 MiB from two keys cannot pass it (each key is far within its own quota), a
/// snapshot over it is refused with 429 and the reason, and deleting snapshots frees
/// their bytes for the other key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_all_keys_snapshots_together_are_bounded_on_the_host() {
    orchard_test_support::require_runc!();
    let data = tempfile::Builder::new()
        .prefix("orchard-snap-host-")
        .tempdir()
        .unwrap();
    let limit: u64 = 3 << 20;
    let srv = ServerProcess::start(data.path(), &["--snapshot-bytes-total", "3Mi"]);
    import_busybox(&srv.url).await;
    let http = reqwest::Client::new();
    let sbs = [
        (KEY, "snap-a1"),
        (KEY, "snap-a2"),
        (OTHER_KEY, "snap-b1"),
        (OTHER_KEY, "snap-b2"),
    ];
    for (key, id) in sbs {
        sandbox(&http, &srv.url, key, id).await;
        run(&srv.url, key, id, "head -c 1048576 /dev/urandom > /tmp/f").await;
    }
    let takes = sbs.map(|(key, id)| take(&http, &srv.url, key, id));
    let answers = futures_util::future::join_all(takes).await;
    for (s, v) in &answers {
        assert!(
            *s == 201
                || (*s == 429
                    && v["code"] == "quota_exceeded"
                    && v["detail"]
                        .as_str()
                        .unwrap()
                        .contains("snapshot storage is full")),
            "{s} {v}"
        );
    }
    assert!(
        answers.iter().any(|(s, _)| *s == 429),
        "four 1 MiB snapshots under 3 MiB: {answers:?}"
    );
    let kept = snapshot_bytes(&http, &srv.url, KEY).await.0
        + snapshot_bytes(&http, &srv.url, OTHER_KEY).await.0;
    assert!(kept <= limit, "{kept} bytes kept under {limit}");
    assert!(kept >= 1 << 20, "one snapshot at least stays");

    // One at a time: two of A's fit, B's third does not, until A deletes one.
    delete_all(&http, &srv.url, KEY).await;
    delete_all(&http, &srv.url, OTHER_KEY).await;
    let (s, a1) = take(&http, &srv.url, KEY, "snap-a1").await;
    assert_eq!(s, 201, "{a1}");
    let (s, v) = take(&http, &srv.url, KEY, "snap-a2").await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = take(&http, &srv.url, OTHER_KEY, "snap-b1").await;
    assert_eq!(s, 429, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("snapshot storage is full"),
        "{v}"
    );
    assert_eq!(
        snapshot_bytes(&http, &srv.url, OTHER_KEY).await.1,
        Vec::<String>::new(),
        "the refused snapshot is gone"
    );
    let (s, v) = send(
        http.delete(format!(
            "{}/v1/snapshots/{}",
            srv.url,
            a1["snapshot_id"].as_str().unwrap()
        ))
        .header("X-API-Key", KEY),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = take(&http, &srv.url, OTHER_KEY, "snap-b1").await;
    assert_eq!(s, 201, "the deleted snapshot's bytes are free again: {v}");
}

/// Issue 30, point 6: a snapshot is refused while the data directory's file system has
/// less than the reserve free (`ORCHARD_SNAPSHOT_MIN_FREE`; 100% of it here, which no
/// file system has free), with 429 and the reason; nothing is left of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_refused_when_the_host_disk_is_below_its_reserve() {
    orchard_test_support::require_runc!();
    let data = tempfile::Builder::new()
        .prefix("orchard-snap-free-")
        .tempdir()
        .unwrap();
    let srv = ServerProcess::start_with_env(
        data.path(),
        &[KEY, OTHER_KEY],
        &[("ORCHARD_SNAPSHOT_MIN_FREE", "100%")],
        &[],
    );
    import_busybox(&srv.url).await;
    let http = reqwest::Client::new();
    sandbox(&http, &srv.url, KEY, "snap-low").await;
    run(&srv.url, KEY, "snap-low", "echo x > /workspace/f").await;
    let (s, v) = take(&http, &srv.url, KEY, "snap-low").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{v}"
    );
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("disk is nearly full"),
        "{v}"
    );
    assert_eq!(
        snapshot_bytes(&http, &srv.url, KEY).await.1,
        Vec::<String>::new()
    );
}
