//! Files and git of a sandbox through the `/v1/` proxy: raw files (ranges, stat, list,
//! mkdir, move, delete), archives both ways, and the git routes.

use std::io::Read;

use orchard_test_support::tar_gz;
use serde_json::{json, Value};

use super::v1_routes::{bytes, noise};
use crate::util::server::{send, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_raw_stat_list_mkdir_move_delete_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let f = format!("/v1/sandboxes/{id}/files");
    let big = noise(3 << 20);
    let (s, put) = send(
        srv.req(reqwest::Method::PUT, &format!("{f}?path=/tmp/up/big.bin"))
            .header("content-type", "application/octet-stream")
            .body(big.clone()),
    )
    .await;
    assert_eq!(s, 200, "{put}");
    assert_eq!(put, json!({"path": "/tmp/up/big.bin", "size": 3 << 20}));
    let (s, back) =
        bytes(srv.req(reqwest::Method::GET, &format!("{f}?path=/tmp/up/big.bin"))).await;
    assert_eq!(s, 200);
    assert!(
        back == big,
        "3 MiB came back altered ({} bytes)",
        back.len()
    );
    let (s, part) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{f}?path=/tmp/up/big.bin&offset=1000&length=24"),
    ))
    .await;
    assert_eq!((s, part.as_slice()), (200, &big[1000..1024]));

    let (s, st) = srv.get(&format!("{f}/stat?path=/tmp/up/big.bin")).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        (
            st["kind"].as_str(),
            st["size"].as_u64(),
            st["name"].as_str()
        ),
        (Some("file"), Some(3 << 20), Some("big.bin"))
    );
    let (s, d) = srv
        .post(&format!("{f}/mkdir"), json!({"path": "/tmp/d/e"}))
        .await;
    assert_eq!((s, d), (200, json!({"path": "/tmp/d/e"})));
    let (s, m) = srv
        .post(
            &format!("{f}/move"),
            json!({"from": "/tmp/up/big.bin", "to": "/tmp/d/e/moved.bin"}),
        )
        .await;
    assert_eq!(s, 200, "{m}");
    let (s, e) = srv.get(&format!("{f}/stat?path=/tmp/up/big.bin")).await;
    assert_eq!((s, e["code"].as_str()), (404, Some("not_found")));
    let (s, list) = srv.get(&format!("{f}/list?path=/tmp/d&depth=2")).await;
    assert_eq!(s, 200, "{list}");
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/tmp/d/e", "/tmp/d/e/moved.bin"]);
    // A non-empty directory needs `recursive`.
    let (s, e) = srv.delete(&format!("{f}?path=/tmp/d")).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (409, Some("directory_not_empty")),
        "{e}"
    );
    let (s, _) = srv.delete(&format!("{f}?path=/tmp/d&recursive=true")).await;
    assert_eq!(s, 200);
    let (s, _) = srv.get(&format!("{f}/stat?path=/tmp/d")).await;
    assert_eq!(s, 404);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_upload_and_download_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let f = format!("/v1/sandboxes/{id}/files");
    let blob = noise(200_000);
    let archive = tar_gz(&[
        ("a.txt", b"alpha\n"),
        ("sub/b.txt", b"beta\n"),
        ("sub/blob.bin", &blob),
    ]);
    let (s, up) = send(
        srv.req(reqwest::Method::PUT, &format!("{f}/archive?path=/tmp/arch"))
            .header("content-type", "application/gzip")
            .body(archive),
    )
    .await;
    assert_eq!(s, 200, "{up}");
    assert_eq!(up["path"], "/tmp/arch");
    assert_eq!(up["bytes"], 6 + 5 + 200_000, "{up}");
    let (s, b) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{f}?path=/tmp/arch/sub/b.txt"),
    ))
    .await;
    assert_eq!((s, b.as_slice()), (200, b"beta\n".as_slice()));

    let (s, down) =
        bytes(srv.req(reqwest::Method::GET, &format!("{f}/archive?path=/tmp/arch"))).await;
    assert_eq!(s, 200);
    assert_eq!(&down[..2], &[0x1f, 0x8b], "gzip");
    let mut files = std::collections::BTreeMap::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(down.as_slice()));
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let path = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(
                path.trim_start_matches("./")
                    .trim_start_matches("arch/")
                    .to_string(),
                data,
            );
        }
    }
    assert_eq!(files.len(), 3, "{:?}", files.keys().collect::<Vec<_>>());
    assert_eq!(files["a.txt"], b"alpha\n");
    assert_eq!(files["sub/b.txt"], b"beta\n");
    assert!(files["sub/blob.bin"] == blob);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_status_commit_diff_reset_apply_through_the_proxy() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let base = format!("/v1/sandboxes/{id}");
    // busybox has no git: a repository is a few files, made with exec.
    let (s, r) = srv
        .post(
            &format!("{base}/exec"),
            json!({"command": "mkdir -p /repo/.git/objects /repo/.git/refs/heads && cd /repo/.git && echo 'ref: refs/heads/main' > HEAD && printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n' > config"}),
        )
        .await;
    assert_eq!((s, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let put = |path: &str, body: &'static str| {
        srv.req(
            reqwest::Method::PUT,
            &format!("{base}/files?path=/repo/{path}"),
        )
        .body(body)
    };
    assert_eq!(send(put("a.txt", "one\ntwo\nthree\n")).await.0, 200);
    assert_eq!(send(put("dir/b.txt", "bee\n")).await.0, 200);
    let repo = json!({"repo": "/repo"});
    let (s, st) = srv.post(&format!("{base}/git/status"), repo.clone()).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        (st["branch"].as_str(), &st["head"], st["clean"].as_bool()),
        (Some("main"), &Value::Null, Some(false))
    );
    let untracked: Vec<(&str, &str)> = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        untracked,
        [("a.txt", "untracked"), ("dir/b.txt", "untracked")]
    );

    let (s, c) = srv
        .post(
            &format!("{base}/git/commit"),
            json!({"repo": "/repo", "message": "initial"}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["files_changed"], 2);
    let first = c["commit"].as_str().unwrap().to_string();
    let (_, st) = srv.post(&format!("{base}/git/status"), repo.clone()).await;
    assert_eq!(
        (st["head"].as_str(), st["clean"].as_bool()),
        (Some(first.as_str()), Some(true)),
        "{st}"
    );

    // Modify, diff, reset (the change is gone), apply the diff (it is back).
    assert_eq!(send(put("a.txt", "one\nTWO\nthree\n")).await.0, 200);
    assert_eq!(send(put("new.txt", "fresh\n")).await.0, 200);
    let (s, diff) = srv.post(&format!("{base}/git/diff"), repo.clone()).await;
    assert_eq!(s, 200, "{diff}");
    assert_eq!(
        (
            diff["files_changed"].as_u64(),
            diff["insertions"].as_u64(),
            diff["deletions"].as_u64()
        ),
        (Some(2), Some(2), Some(1))
    );
    let patch = diff["patch"].as_str().unwrap().to_string();
    assert!(
        patch.contains("-two\n+TWO\n") && patch.contains("+fresh\n"),
        "{patch}"
    );
    let (s, reset) = srv.post(&format!("{base}/git/reset"), repo.clone()).await;
    assert_eq!(s, 200, "{reset}");
    assert_eq!(reset["head"], first.as_str());
    assert_eq!(reset["removed"], json!(["new.txt"]));
    let (_, a) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{base}/files?path=/repo/a.txt"),
    ))
    .await;
    assert_eq!(a, b"one\ntwo\nthree\n");
    let (s, applied) = srv
        .post(
            &format!("{base}/git/apply"),
            json!({"repo": "/repo", "patch": patch}),
        )
        .await;
    assert_eq!(s, 200, "{applied}");
    assert_eq!(
        (applied["applied"].as_bool(), &applied["files"]),
        (Some(true), &json!(["a.txt", "new.txt"]))
    );
    let (_, a) = bytes(srv.req(
        reqwest::Method::GET,
        &format!("{base}/files?path=/repo/a.txt"),
    ))
    .await;
    assert_eq!(a, b"one\nTWO\nthree\n");
    // Applying it again conflicts and writes nothing.
    let (s, again) = srv
        .post(
            &format!("{base}/git/apply"),
            json!({"repo": "/repo", "patch": patch}),
        )
        .await;
    assert_eq!(
        (s, again["applied"].as_bool()),
        (200, Some(false)),
        "{again}"
    );
    assert!(!again["conflicts"].as_array().unwrap().is_empty());
    let (_, st) = srv.post(&format!("{base}/git/status"), repo).await;
    let changed: Vec<(&str, &str)> = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(changed, [("a.txt", "modified"), ("new.txt", "untracked")]);
    srv.finish().await;
}
