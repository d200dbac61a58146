//! The compatible file routes' work over the fake backend (a real agent in process, no
//! runc): uploads through their spools, with every bound and fault of the body;
//! downloads as the JSON document, however the file comes in pieces; listings.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use orchard_protocol::compat::Uploaded;
use orchard_protocol::output::{b64_decode, b64_encode};

use super::download::base64_json_stream;
use super::spool::{Spools, UNBOUNDED_ROOM};
use super::upload::BodyFault;
use crate::backend::fake::FakeBackend;
use crate::image::gc::Budget;
use crate::service::tests::{tenant, Harness};
use crate::service::Error;

/// Spools under the harness's directory, within `host`.
fn spools(h: &Harness, host: Budget) -> Arc<Spools> {
    Arc::new(Spools::new(
        &h.dir.path().join("spools"),
        host,
        Duration::from_secs(60),
    ))
}

/// An upload body `{"path", "content"}` cut into pieces of `piece` bytes.
fn body(path: &str, content: &[u8], piece: usize) -> Vec<Result<Bytes, BodyFault>> {
    let json = serde_json::json!({"path": path, "content": b64_encode(content)}).to_string();
    json.as_bytes()
        .chunks(piece)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect()
}

/// Bytes that are not text and not repetitive.
fn noise(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7919 % 251) as u8).collect()
}

/// Uploads the body `pieces` (no length declared) to sandbox `id` through `s`.
async fn upload(
    h: &Harness,
    id: &str,
    s: &Arc<Spools>,
    pieces: Vec<Result<Bytes, BodyFault>>,
) -> Result<Uploaded, Error> {
    let mut pieces = futures_util::stream::iter(pieces);
    h.service.upload(&tenant(), id, s, None, &mut pieces).await
}

/// Files left in the spool directory.
fn spooled(h: &Harness) -> usize {
    std::fs::read_dir(h.dir.path().join("spools/spool")).map_or(0, |d| d.count())
}

#[tokio::test]
async fn an_upload_is_written_where_it_says_and_its_spool_goes_with_its_charge() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    let s = spools(&h, Budget::Off);
    let content = noise(100_000);
    let up = upload(&h, &id, &s, body("sub/a.bin", &content, 4097))
        .await
        .unwrap();
    let workdir = h.dir.path().join("workspace");
    assert_eq!(
        (up.success, up.path.as_str(), up.size),
        (true, workdir.join("sub/a.bin").to_str().unwrap(), 100_000)
    );
    assert_eq!(std::fs::read(workdir.join("sub/a.bin")).unwrap(), content);
    assert_eq!((s.total(), spooled(&h)), (0, 0), "nothing left spooled");

    // An absolute path is kept; an empty one is refused once the body is read.
    let up = upload(
        &h,
        &id,
        &s,
        body(&workdir.join("b").display().to_string(), b"hi", 5),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(&up.path).unwrap(), b"hi");
    let e = upload(&h, &id, &s, body("", b"hi", 5)).await.unwrap_err();
    assert!(
        matches!(&e, Error::BadRequest(m) if m == "path must not be empty"),
        "{e:?}"
    );
    assert_eq!((s.total(), spooled(&h)), (0, 0));
}

#[tokio::test]
async fn an_upload_past_the_bounds_is_refused_up_front_or_as_it_grows() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;

    // Larger than all spools may be: refused from the declared length, the body unread.
    let s = spools(&h, Budget::Bytes(1000));
    let mut unread = futures_util::stream::iter(body("a", &noise(10), 3)).fuse();
    let e = h
        .service
        .upload(&tenant(), &id, &s, Some(1 << 20), &mut unread)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::TooLarge(m) if m.contains("upload spool")),
        "{e:?}"
    );
    assert!(unread.next().await.is_some(), "the body was not read");
    // Without a declared length, refused as the spool grows past the bound.
    let e = upload(&h, &id, &s, body("a", &noise(2000), 100))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::TooLarge(m) if m.contains("1000 bytes")),
        "{e:?}"
    );
    assert_eq!((s.total(), spooled(&h)), (0, 0), "its charge given back");

    // Other uploads in flight hold the host's spools: 503, retry later.
    let mut held = s.open("elsewhere", None, None).unwrap();
    held.charge_to(900).unwrap();
    let e = upload(&h, &id, &s, body("a", &noise(200), 100))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Unavailable(m) if m.contains("retry")),
        "{e:?}"
    );
    drop(held);

    // Other uploads to the same sandbox hold its disk's room (unbounded here: the
    // route's own bound).
    let s = spools(&h, Budget::Off);
    let mut held = s.open(&id, None, None).unwrap();
    held.charge_to(UNBOUNDED_ROOM - 10).unwrap();
    let e = upload(&h, &id, &s, body("a", &noise(20), 7))
        .await
        .unwrap_err();
    let disk = format!("sandbox {id}'s disk");
    assert!(
        matches!(&e, Error::TooLarge(m) if m.contains(&disk)),
        "{e:?}"
    );
    drop(held);
    assert_eq!(s.total(), 0);
}

#[tokio::test]
async fn a_body_that_stalls_or_breaks_ends_the_upload_with_408_or_400() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    let s = spools(&h, Budget::Off);
    for (fault, want) in [
        (BodyFault::Stalled, "the upload sent nothing for 60 s"),
        (BodyFault::Broken("reset".into()), "reading the body: reset"),
    ] {
        let mut pieces = body("a", &noise(30), 10);
        pieces.truncate(2);
        pieces.push(Err(fault));
        let e = upload(&h, &id, &s, pieces).await.unwrap_err();
        assert!(
            matches!(&e, Error::Timeout(m) | Error::BadRequest(m) if m == want),
            "{e:?}"
        );
        assert_eq!(
            crate::server::error::status(&e),
            if want.contains("nothing") { 408 } else { 400 }
        );
    }
    // A body cut short is malformed JSON, and nothing is written.
    let mut pieces = body("cut", &noise(30), 10);
    pieces.truncate(2);
    let e = upload(&h, &id, &s, pieces).await.unwrap_err();
    assert!(
        matches!(&e, Error::BadRequest(m) if m.starts_with("malformed JSON")),
        "{e:?}"
    );
    assert!(!h.dir.path().join("workspace/cut").exists());
    assert_eq!((s.total(), spooled(&h)), (0, 0));
}

/// A download's JSON document, read whole.
async fn document(
    pieces: impl futures_util::Stream<Item = Result<Bytes, std::io::Error>>,
) -> serde_json::Value {
    let mut all = Vec::new();
    futures_util::pin_mut!(pieces);
    while let Some(piece) = pieces.next().await {
        all.extend_from_slice(&piece.unwrap());
    }
    serde_json::from_slice(&all).unwrap()
}

#[tokio::test]
async fn a_download_is_the_json_document_with_the_file_in_base64() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    let workdir = h.dir.path().join("workspace");
    for n in [0, 1, 2, 3, 4, 200_001] {
        let content = noise(n);
        std::fs::write(workdir.join("f.bin"), &content).unwrap();
        let doc = document(h.service.download(&tenant(), &id, "f.bin").await.unwrap()).await;
        assert_eq!(doc["path"], workdir.join("f.bin").to_str().unwrap());
        assert_eq!(doc["size"], n as u64);
        assert_eq!(
            b64_decode(doc["content"].as_str().unwrap()).unwrap(),
            content,
            "{n} bytes"
        );
    }
    // A path that needs JSON's escapes stays one string.
    let odd = workdir.join("a \"q\" \\ é.txt");
    std::fs::write(&odd, b"x").unwrap();
    let doc = document(
        h.service
            .download(&tenant(), &id, odd.to_str().unwrap())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(doc["path"], odd.to_str().unwrap());
    // The agent's refusal comes before the first piece.
    let e = h
        .service
        .download(&tenant(), &id, "nope")
        .await
        .err()
        .unwrap();
    assert_eq!(crate::server::error::status(&e), 404, "{e:?}");
}

/// A frame of a test body, or the error that ends it.
type TestFrame = Result<hyper::body::Frame<Bytes>, String>;

/// A body of these frames (an `Err` frame: the agent failing mid-file).
fn frames(
    pieces: Vec<Result<&'static [u8], &'static str>>,
) -> http_body_util::StreamBody<futures_util::stream::Iter<std::vec::IntoIter<TestFrame>>> {
    let frames: Vec<TestFrame> = pieces
        .into_iter()
        .map(|p| {
            p.map(|b| hyper::body::Frame::data(Bytes::from_static(b)))
                .map_err(str::to_string)
        })
        .collect();
    http_body_util::StreamBody::new(futures_util::stream::iter(frames))
}

#[tokio::test]
async fn the_base64_of_a_file_in_odd_pieces_joins_into_one_string() {
    let pieces = vec![
        Ok(&b"a"[..]),
        Ok(b""),
        Ok(b"bc"),
        Ok(b"d"),
        Ok(b"efghi"),
        Ok(b"j"),
    ];
    let doc = document(base64_json_stream("/p", frames(pieces))).await;
    assert_eq!(
        doc,
        serde_json::json!({"path": "/p", "content": b64_encode(b"abcdefghij"), "size": 10})
    );
    // Each piece in between is whole groups of base64, never padded.
    let out: Vec<_> = base64_json_stream("/p", frames(vec![Ok(b"ab"), Ok(b"cd"), Ok(b"e")]))
        .map(|p| String::from_utf8(p.unwrap().to_vec()).unwrap())
        .collect()
        .await;
    assert_eq!(
        out,
        [
            "{\"path\":\"/p\",\"content\":\"",
            "YWJj",
            "ZGU=\",\"size\":5}"
        ]
    );
    // An agent failing mid-file ends the stream with an error after what came.
    let out: Vec<_> = base64_json_stream("/p", frames(vec![Ok(b"abc"), Err("gone")]))
        .collect()
        .await;
    assert_eq!(out.len(), 3);
    assert_eq!(out[1].as_ref().unwrap(), "YWJj");
    assert_eq!(out[2].as_ref().unwrap_err().to_string(), "gone");
}

#[tokio::test]
async fn a_listing_is_sorted_and_names_directories() {
    let h = Harness::new(FakeBackend::tcp()).await;
    let id = h.ready_sandbox().await;
    let workdir = h.dir.path().join("workspace");
    std::fs::create_dir(workdir.join("b-dir")).unwrap();
    std::fs::write(workdir.join("c.txt"), b"123").unwrap();
    std::fs::write(workdir.join("a.txt"), b"").unwrap();
    for path in [None, Some("")] {
        let list = h.service.list_files(&tenant(), &id, path).await.unwrap();
        assert_eq!(
            list.path,
            workdir.to_str().unwrap(),
            "the working directory"
        );
        let got: Vec<_> = list
            .files
            .iter()
            .map(|f| (f.name.as_str(), f.kind.as_str(), f.size))
            .collect();
        assert_eq!(got[0], ("a.txt", "file", 0));
        assert_eq!((got[1].0, got[1].1), ("b-dir", "directory"));
        assert_eq!(got[2], ("c.txt", "file", 3));
        assert!(!list.truncated);
    }
    let list = h
        .service
        .list_files(&tenant(), &id, Some("b-dir"))
        .await
        .unwrap();
    assert_eq!((list.path.ends_with("/b-dir"), list.files.len()), (true, 0));
}
