//! The files capability: read, write, remove, stat, list, mkdir, move, and tar
//! upload/download, over HTTP.
//!
//! File contents stream in both directions and are never held whole in memory. Writes
//! go to a temporary file next to the target and are renamed over it, so a reader never
//! sees a half-written file and a failed upload leaves the old content in place. Tar
//! uploads and downloads stream through blocking threads (see `tarball`).
//!
//! One file per operation: `read`, `write` (upload), `stat` (stat and list),
//! `manage` (remove, mkdir, move) and `tarball` (tar upload and download, over
//! [`archive`], the tar logic itself); `guard` resolves read paths safely, and `common`
//! holds this capability's state and what the operations share: path and mode
//! parsing, the common errors and temporary names. This module holds the routes.

use axum::extract::FromRef;
use axum::routing::{get, post};
use axum::Router;

use crate::api::extract::BodyLimit;

pub use self::common::{absolute, parse_mode, Files, MAX_LIST_ENTRIES, TEMP_PREFIX};
use self::manage::{make_dir, move_path, remove_path};
use self::read::read_file;
use self::stat::{list_path, stat_path};
use self::tarball::{download_archive, upload_archive};
use self::write::write_file;

pub mod archive;
mod common;
mod guard;
mod manage;
mod read;
mod stat;
mod tarball;
mod write;

/// Routes of the files capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Files: FromRef<S>,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route(
            "/v1/files",
            get(read_file).put(write_file).delete(remove_path),
        )
        .route("/v1/files/stat", get(stat_path))
        .route("/v1/files/list", get(list_path))
        .route("/v1/files/mkdir", post(make_dir))
        .route("/v1/files/move", post(move_path))
        .route(
            "/v1/files/archive",
            get(download_archive).put(upload_archive),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    use orchard_protocol::ErrorCode;
    use tokio::io::AsyncReadExt;

    use orchard_protocol::files::{ExtractResult, FileKind, FileList, FileStat, WriteResult};

    use crate::api::files::archive;

    #[tokio::test]
    async fn regression_a_refused_upload_is_answered_after_its_body_is_read_not_cut_off() {
        let addr = crate::server::test_http::serve().await;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t").display().to_string();
        let body = vec![b'x'; 8 << 20];
        let cases = [
            ("/v1/files?path=".to_string(), 400, "invalid_argument"),
            (
                "/v1/files?path=relative".to_string(),
                400,
                "invalid_argument",
            ),
            (
                format!("/v1/files?path={target}&mode=zz"),
                400,
                "invalid_argument",
            ),
            (
                "/v1/files/archive?path=".to_string(),
                400,
                "invalid_argument",
            ),
            // Not a tar: the extractor stops at the first block, the body goes on.
            (
                format!("/v1/files/archive?path={target}"),
                400,
                "invalid_archive",
            ),
        ];
        for (path, status, code) in cases {
            let (got, answer) = crate::server::test_http::send(addr, "PUT", &path, &body)
                .await
                .unwrap_or_else(|e| panic!("PUT {path}: cut off mid-body: {e}"));
            assert_eq!(
                (got, answer["code"].as_str()),
                (status, Some(code)),
                "{path}: {answer}"
            );
        }
    }

    /// No temporary file of a write, move or extraction is left in `dir`.
    pub(super) fn no_leftovers(dir: &Path) -> bool {
        fs::read_dir(dir).unwrap().all(|e| {
            let name = e.unwrap().file_name();
            let name = name.to_string_lossy();
            !name.starts_with(TEMP_PREFIX) && !name.starts_with(archive::STAGING_PREFIX)
        })
    }

    /// One HTTP/1.1 exchange over a fresh connection: status, head, body.
    async fn exchange(
        addr: std::net::SocketAddr,
        method: &str,
        target: &str,
        body: &[u8],
    ) -> (u16, String, Vec<u8>) {
        use tokio::io::AsyncWriteExt as _;
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {target} HTTP/1.1\r\nhost: x\r\nx-orchard-token: tok\r\n\
             authorization: Bearer tok\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
        let status = head[9..12].parse().unwrap();
        (status, head, raw[split + 4..].to_vec())
    }

    #[tokio::test]
    async fn routes_answer_over_http() {
        let mut config = crate::config::Config::new("tok");
        config.limits.max_upload_bytes = 1000;
        let addr = crate::server::test_http::serve_with(config).await;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();

        let (status, _, body) = exchange(
            addr,
            "PUT",
            &format!("/v1/files?path={d}/w/f&mode=600"),
            b"hello",
        )
        .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let written: WriteResult = serde_json::from_slice(&body).unwrap();
        assert_eq!(written.size, 5);

        let (status, head, body) = exchange(
            addr,
            "GET",
            &format!("/v1/files?path={d}/w/f&offset=1&length=3"),
            b"",
        )
        .await;
        assert_eq!(status, 200);
        assert!(head.contains("content-length: 3"), "{head}");
        assert_eq!(body, b"ell");

        let (status, _, body) = exchange(
            addr,
            "PUT",
            &format!("/v1/files?path={d}/big"),
            &[0u8; 1001],
        )
        .await;
        assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));

        let (status, _, body) = exchange(addr, "GET", "/v1/files/stat?nopath=1", b"").await;
        assert_eq!(status, 400);
        let err: orchard_protocol::ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(err.code, ErrorCode::InvalidArgument);

        let (status, _, body) =
            exchange(addr, "GET", &format!("/v1/files/stat?path={d}/w/f"), b"").await;
        assert_eq!(status, 200);
        let stat: FileStat = serde_json::from_slice(&body).unwrap();
        assert_eq!((stat.kind, stat.mode), (FileKind::File, 0o600));

        let mkdir = format!(r#"{{"path":"{d}/m/n","mode":448}}"#);
        let (status, _, _) = exchange(addr, "POST", "/v1/files/mkdir", mkdir.as_bytes()).await;
        assert_eq!(status, 200);
        let mv = format!(r#"{{"from":"{d}/w/f","to":"{d}/m/n/g"}}"#);
        let (status, _, _) = exchange(addr, "POST", "/v1/files/move", mv.as_bytes()).await;
        assert_eq!(status, 200);

        let (status, _, body) = exchange(
            addr,
            "GET",
            &format!("/v1/files/list?path={d}&depth=3"),
            b"",
        )
        .await;
        assert_eq!(status, 200);
        let listed: FileList = serde_json::from_slice(&body).unwrap();
        let names: Vec<_> = listed.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["m", "n", "g", "w"]);

        let (status, _, _) = exchange(addr, "DELETE", &format!("/v1/files?path={d}/m"), b"").await;
        assert_eq!(status, 409);
        let (status, _, _) = exchange(
            addr,
            "DELETE",
            &format!("/v1/files?path={d}/m&recursive=true"),
            b"",
        )
        .await;
        assert_eq!(status, 200);

        let gz = {
            let src = tempfile::tempdir().unwrap();
            fs::write(src.path().join("z"), b"zz").unwrap();
            archive::build(&src.path().join("z"), Vec::new()).unwrap()
        };
        let (status, _, body) =
            exchange(addr, "PUT", &format!("/v1/files/archive?path={d}/x"), &gz).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let extracted: ExtractResult = serde_json::from_slice(&body).unwrap();
        assert_eq!((extracted.entries, extracted.bytes), (1, 2));
        assert_eq!(fs::read(dir.path().join("x/z")).unwrap(), b"zz");

        let (status, head, _) =
            exchange(addr, "GET", &format!("/v1/files/archive?path={d}/x"), b"").await;
        assert_eq!(status, 200);
        assert!(head.contains("application/gzip"), "{head}");
    }
}
