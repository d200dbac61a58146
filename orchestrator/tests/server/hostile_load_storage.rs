//! Hostile load on the host's storage (issue 30, points 3 and 6), against the real
//! server binary: the storage half of `hostile_load`. Upload spools are charged to the
//! sandbox's disk, bounded on the host and cut when the body stalls or trickles;
//! snapshots of all keys together are bounded on the host and by its free space.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::server::{
    busybox_server, exec_waited, import_busybox, sandbox, send, temp_dir, ServerProcess, KEY,
    OTHER_KEY,
};

const MIB: usize = 1 << 20;

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// Sizes of the files in the server's upload spool.
fn spooled(data: &Path) -> Vec<u64> {
    std::fs::read_dir(data.join("spool"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until one spool file holds at least `bytes`; panics after 30 s.
async fn await_spooled(data: &Path, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !spooled(data).iter().any(|n| *n >= bytes) {
        assert!(
            Instant::now() < deadline,
            "no spool reached {bytes} bytes: {:?}",
            spooled(data)
        );
        // A directory has nothing to subscribe to.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The compatible upload on a raw connection, so a test can send its body at the pace
/// an attacker would, stop in the middle, and read the answer whenever it comes.
struct RawUpload {
    stream: TcpStream,
    chunked: bool,
    /// Body bytes written.
    sent: usize,
}

impl RawUpload {
    /// The body's opening for the file `path`.
    fn opening(path: &str) -> String {
        format!("{{\"path\":\"{path}\",\"content\":\"")
    }

    /// Starts `POST /sandboxes/{id}/files` as `key` with a body of `length` bytes
    /// (chunked when `None`), and sends the body's opening.
    fn start(addr: SocketAddr, key: &str, id: &str, path: &str, length: Option<usize>) -> Self {
        let mut stream = TcpStream::connect(addr).unwrap();
        let framing = match length {
            Some(n) => format!("Content-Length: {n}"),
            None => "Transfer-Encoding: chunked".into(),
        };
        write!(
            stream,
            "POST /sandboxes/{id}/files HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
        )
        .unwrap();
        let mut up = RawUpload {
            stream,
            chunked: length.is_none(),
            sent: 0,
        };
        assert!(up.send(Self::opening(path).as_bytes()));
        up
    }

    /// Sends body bytes; false once the server stopped reading (closed or reset).
    fn send(&mut self, data: &[u8]) -> bool {
        let written = if self.chunked {
            write!(self.stream, "{:x}\r\n", data.len())
                .and_then(|_| self.stream.write_all(data))
                .and_then(|_| self.stream.write_all(b"\r\n"))
        } else {
            self.stream.write_all(data)
        };
        if written.is_ok() {
            self.sent += data.len();
        }
        written.is_ok()
    }

    /// Sends `json` bytes of base64 content (`A`s: zeros, 3 bytes per 4) in pieces of a
    /// MiB; stops early when the server stops reading. Answers whether all went.
    fn send_content(&mut self, json: usize) -> bool {
        let piece = vec![b'A'; MIB];
        let mut left = json;
        while left > 0 {
            let n = left.min(MIB);
            if !self.send(&piece[..n]) {
                return false;
            }
            left -= n;
        }
        true
    }

    /// Ends the body.
    fn finish(&mut self) {
        assert!(self.send(b"\"}"));
        if self.chunked {
            self.stream.write_all(b"0\r\n\r\n").unwrap();
        }
    }

    /// The server's answer: status and JSON body; panics when none comes in `limit`.
    fn answer(&mut self, limit: Duration) -> (u16, Value) {
        self.answer_pacing(limit, Duration::from_millis(200), |_| {})
    }

    /// [`RawUpload::answer`], calling `idle` each time `pace` passes without a byte
    /// of the answer.
    fn answer_pacing(
        &mut self,
        limit: Duration,
        pace: Duration,
        mut idle: impl FnMut(&mut Self),
    ) -> (u16, Value) {
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        self.stream.set_read_timeout(Some(pace)).unwrap();
        loop {
            if let Some(a) = parse_answer(&got) {
                return a;
            }
            assert!(
                Instant::now() < deadline,
                "no answer in {limit:?}: {:?}",
                String::from_utf8_lossy(&got)
            );
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    idle(self)
                }
                Err(_) => break,
            }
        }
        parse_answer(&got).unwrap_or_else(|| {
            panic!(
                "closed without an answer: {:?}",
                String::from_utf8_lossy(&got)
            )
        })
    }
}

/// A whole HTTP answer with a `Content-Length` body in `got`, if there is one yet.
fn parse_answer(got: &[u8]) -> Option<(u16, Value)> {
    let split = got.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&got[..split]).ok()?;
    let body = &got[split + 4..];
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let len: usize = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })?;
    (body.len() >= len).then(|| {
        (
            status,
            serde_json::from_slice(&body[..len]).unwrap_or(Value::Null),
        )
    })
}

/// Runs `command` in `id` through the compatible API; answers its stdout.
async fn run(url: &str, key: &str, id: &str, command: &str) -> String {
    let (s, job) = exec_waited(&reqwest::Client::new(), url, key, id, command).await;
    assert_eq!(
        (s, job["exit_code"].as_i64()),
        (200, Some(0)),
        "{command}: {job}"
    );
    job["stdout"].as_str().unwrap_or_default().to_string()
}

/// Regression (issue 30, point 3): upload spools were charged to nothing: each upload
/// could spool up to 384 MiB on the host whatever the sandbox's disk, and any number at
/// once. Now, with 64 MiB sandbox disks and a 64 MiB bound on all spools:
/// - a body whose declared length cannot fit the disk is refused with 413 at once;
/// - two uploads to one sandbox are summed: while one holds 42 MiB spooled, another
///   is refused with 413 once its spool passes the room left, long before its 300 MiB
///   body is read (without the bound it was read and spooled whole);
/// - uploads to another sandbox count against the host's bound (503);
/// - the first upload then completes, and no spool is left on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_upload_spools_are_charged_to_the_sandbox_disk_and_the_host() {
    orchard_test_support::require_runc!();
    let data = temp_dir("orchard-spool-disk-");
    let srv = ServerProcess::start(
        data.path(),
        &[
            "--sandbox-disk",
            "64Mi",
            "--sandbox-disk-inodes",
            "4096",
            "--upload-spool-bytes",
            "64Mi",
        ],
    );
    import_busybox(&srv.url).await;
    let http = reqwest::Client::new();
    sandbox(&http, &srv.url, KEY, "spool-1").await;
    sandbox(&http, &srv.url, KEY, "spool-2").await;
    let addr = addr_of(&srv.url);

    // Declared too large for the disk: refused before a byte of body is read.
    let (s, v) = tokio::task::spawn_blocking(move || {
        let mut up = RawUpload::start(addr, KEY, "spool-2", "/workspace/big", Some(200 * MIB));
        up.answer(Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert_eq!(
        (s, v["code"].as_str()),
        (413, Some("body_too_large")),
        "{v}"
    );
    assert!(
        v["detail"].as_str().unwrap().contains("spool-2's disk"),
        "{v}"
    );

    // A: 56 MiB of base64 (42 MiB of file) spooled for spool-1, then a pause.
    let a_json = 56 * MIB;
    let mut a = tokio::task::spawn_blocking(move || {
        let mut a = RawUpload::start(addr, KEY, "spool-1", "/workspace/a", None);
        assert!(a.send_content(a_json));
        a
    })
    .await
    .unwrap();
    await_spooled(data.path(), (a_json / 4 * 3 - MIB) as u64).await;

    // B, to the same sandbox, chunked (no length to refuse it up front): refused once
    // its spool passes what A left of the disk, and read no further than that plus the
    // drain that lets it see the answer.
    let (b_all_sent, b_sent, b_answer) = tokio::task::spawn_blocking(move || {
        let mut b = RawUpload::start(addr, KEY, "spool-1", "/workspace/b", None);
        let all = b.send_content(300 * MIB);
        let sent = b.sent;
        (all, sent, b.answer(Duration::from_secs(30)))
    })
    .await
    .unwrap();
    let (s, v) = b_answer;
    assert_eq!(s, 413, "{v}");
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains("spool-1's disk") && detail.contains("other uploads"),
        "{v}"
    );
    assert!(
        !b_all_sent && b_sent < 200 * MIB,
        "B sent {} MiB of 300 before the server stopped reading",
        b_sent / MIB
    );

    // C, to another sandbox: its disk has room, the host's spool does not.
    let (s, v) = tokio::task::spawn_blocking(move || {
        let mut c = RawUpload::start(addr, KEY, "spool-2", "/workspace/c", None);
        c.send_content(40 * MIB);
        c.answer(Duration::from_secs(30))
    })
    .await
    .unwrap();
    assert_eq!((s, v["code"].as_str()), (503, Some("unavailable")), "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("upload spool is full"),
        "{v}"
    );

    // A completes: its file is whole in the sandbox, and nothing is left spooled.
    let (s, v) = tokio::task::spawn_blocking(move || {
        a.finish();
        a.answer(Duration::from_secs(60))
    })
    .await
    .unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["size"].as_u64(), Some((a_json / 4 * 3) as u64), "{v}");
    let size = run(&srv.url, KEY, "spool-1", "wc -c < /workspace/a").await;
    assert_eq!(size.trim(), (a_json / 4 * 3).to_string());
    assert_eq!(
        spooled(data.path()),
        Vec::<u64>::new(),
        "spools left behind"
    );
    // Under the bounds all is well, on both sandboxes.
    let (s, v) = send(
        http.post(format!("{}/sandboxes/spool-2/files", srv.url))
            .header("X-API-Key", KEY)
            .json(&json!({"path": "/workspace/small", "content": "aGVsbG8="})),
    )
    .await;
    assert_eq!((s, v["size"].as_u64()), (200, Some(5)), "{v}");
}

/// An upload to slow-up's /workspace/f declaring `declared` bytes that has sent a MiB
/// of its content, once the server under `data` has spooled half of it.
async fn slow_upload_of_a_mib(addr: SocketAddr, declared: usize, data: &Path) -> RawUpload {
    let up = tokio::task::spawn_blocking(move || {
        let mut up = RawUpload::start(addr, KEY, "slow-up", "/workspace/f", Some(declared));
        assert!(up.send_content(MIB));
        up
    })
    .await
    .unwrap();
    await_spooled(data, (MIB / 2) as u64).await;
    up
}

/// Regression (issue 30, point 3): a stalled upload kept its spool (up to 384 MiB) on
/// the host. The listener's body time-out does cut a body that sends nothing (2 s
/// here): the client gets 408, not the 400 of a broken body, and the spool is gone. A
/// body that trickles a few bytes at a time reset that time-out forever; now every
/// window of the body time-out must bring 16 KiB a second, and the trickle is cut with
/// 408 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_stalled_or_trickling_upload_is_cut_and_its_spool_removed() {
    orchard_test_support::require_runc!();
    let (data, srv) = busybox_server("orchard-spool-time-", &["--body-timeout-s", "2"]).await;
    let http = reqwest::Client::new();
    sandbox(&http, &srv.url, KEY, "slow-up").await;
    let addr = addr_of(&srv.url);
    let declared = RawUpload::opening("/workspace/f").len() + 16 * MIB + 2;

    // Stalled: a MiB of content, then nothing.
    let mut stalled = slow_upload_of_a_mib(addr, declared, data.path()).await;
    let t = Instant::now();
    let (s, v) = tokio::task::spawn_blocking(move || stalled.answer(Duration::from_secs(15)))
        .await
        .unwrap();
    assert_eq!((s, v["code"].as_str()), (408, Some("timeout")), "{v}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(spooled(data.path()), Vec::<u64>::new(), "the spool stayed");

    // Trickling: a MiB, then 16 bytes every quarter second (each resets the body
    // time-out), until the server answers.
    let mut trickle = slow_upload_of_a_mib(addr, declared, data.path()).await;
    let t = Instant::now();
    // The attacker's pace: 16 bytes each time a quarter second passes quietly.
    let (s, v) = tokio::task::spawn_blocking(move || {
        trickle.answer_pacing(Duration::from_secs(20), Duration::from_millis(250), |up| {
            let _ = up.send(&[b'A'; 16]);
        })
    })
    .await
    .unwrap();
    assert_eq!((s, v["code"].as_str()), (408, Some("timeout")), "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("at least"),
        "cut by the pace: {v}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(spooled(data.path()), Vec::<u64>::new(), "the spool stayed");

    // An upload at a normal pace goes through.
    let (s, v) = send(
        http.post(format!("{}/sandboxes/slow-up/files", srv.url))
            .header("X-API-Key", KEY)
            .json(&json!({"path": "/workspace/ok", "content": "aGVsbG8="})),
    )
    .await;
    assert_eq!((s, v["size"].as_u64()), (200, Some(5)), "{v}");
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
    let data = temp_dir("orchard-snap-host-");
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
    let data = temp_dir("orchard-snap-free-");
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
