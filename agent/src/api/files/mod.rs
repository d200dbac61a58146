//! The files capability: read, write, remove, stat, list, mkdir, move, and tar
//! upload/download, over HTTP.
//!
//! File contents stream in both directions and are never held whole in memory. Writes
//! go to a temporary file next to the target and are renamed over it, so a reader never
//! sees a half-written file and a failed upload leaves the old content in place. Tar
//! uploads and downloads stream through blocking threads (see `tarball`).
//!
//! One file per operation: `read`, `write` (upload), `stat` (stat and list),
//! `manage` (remove, mkdir, move) and `tarball` (tar upload and download). This module
//! holds the routes and what they share: path and mode parsing, the common errors and
//! temporary names.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::FromRef;
use axum::routing::{get, post};
use axum::Router;
use orchard_protocol::ErrorCode;
use serde::Deserialize;

use crate::api::extract::BodyLimit;
use crate::error::{ApiError, ApiResult};

use self::manage::{make_dir, move_path, remove_path};
use self::read::read_file;
use self::stat::{list_path, stat_path};
use self::tarball::{download_archive, upload_archive};
use self::write::write_file;

pub mod archive;
mod guard;
mod manage;
mod read;
mod stat;
mod tarball;
mod write;

/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Prefix of the temporary files writes go through.
pub const TEMP_PREFIX: &str = ".orchard-tmp-";
/// Size of the chunks files are streamed in.
const CHUNK: usize = 64 * 1024;
/// Mode of written files when none is given.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of created directories when none is given.
const DEFAULT_DIR_MODE: u32 = 0o755;

/// The files capability's state: the largest uploaded file or archive, in bytes
/// (`--max-upload-bytes`). Everything else a file operation needs is in its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Files {
    /// Largest uploaded file or archive in bytes.
    pub max_upload_bytes: u64,
}

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

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

/// Parses a client path: it must be absolute. The result has no `.` components,
/// repeated or trailing slashes; a trailing slash would make the kernel follow a final
/// symbolic link, which remove and stat must never do.
pub fn absolute(raw: &str) -> ApiResult<PathBuf> {
    if !raw.starts_with('/') {
        return Err(ApiError::invalid(format!(
            "path must be absolute, got {raw:?}"
        )));
    }
    if raw.contains('\0') {
        return Err(ApiError::invalid("path must not contain a NUL byte"));
    }
    Ok(Path::new(raw).components().collect())
}

/// Whether `path` names `/`, also through `..` (which is `/` at the top).
fn is_root(path: &Path) -> bool {
    let mut depth = 0usize;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth = depth.saturating_sub(1),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    depth == 0
}

/// Parses an octal mode such as `755` or `0644`.
pub fn parse_mode(raw: Option<&str>) -> ApiResult<u32> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_FILE_MODE);
    };
    let digits = raw.strip_prefix("0o").unwrap_or(raw);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o7777 && !digits.is_empty() => Ok(mode),
        _ => Err(ApiError::invalid(format!(
            "mode must be octal permission bits such as 644 or 755, got {raw:?}"
        ))),
    }
}

fn check_mode(mode: u32) -> ApiResult<u32> {
    if mode > 0o7777 {
        return Err(ApiError::invalid(format!(
            "mode must be permission bits (at most 0o7777), got {mode:#o}"
        )));
    }
    Ok(mode)
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("request body is larger than the limit of {limit} bytes"),
    )
}

fn unreadable_body() -> ApiError {
    ApiError::invalid("the request body could not be read")
}

fn blocking_failed(what: &str) -> ApiError {
    ApiError::new(ErrorCode::Internal, format!("{what} stopped unexpectedly"))
}

/// A short random-looking hex string for temporary names. It only has to make
/// collisions unlikely: every temporary name is created exclusively, so a collision is
/// a retry, never a clobber.
pub fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut x = nanos
        ^ u64::from(std::process::id()).rotate_left(32)
        ^ count.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finalizer, so consecutive calls do not share a prefix.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    format!("{x:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
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

    #[test]
    fn paths_must_be_absolute_and_are_normalized() {
        assert_eq!(
            absolute("relative/x").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(absolute("").unwrap_err().code, ErrorCode::InvalidArgument);
        assert_eq!(
            absolute("/a\0b").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(absolute("/a//b/./c/").unwrap(), PathBuf::from("/a/b/c"));
        assert!(is_root(&absolute("/").unwrap()));
        assert!(is_root(&absolute("//./").unwrap()));
        assert!(is_root(&absolute("/a/..").unwrap()));
        assert!(is_root(&absolute("/../..").unwrap()));
        assert!(!is_root(&absolute("/a").unwrap()));
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode(None).unwrap(), 0o644);
        assert_eq!(parse_mode(Some("755")).unwrap(), 0o755);
        assert_eq!(parse_mode(Some("0600")).unwrap(), 0o600);
        assert_eq!(parse_mode(Some("0o4755")).unwrap(), 0o4755);
        for bad in ["", "9", "rwx", "77777", "-1"] {
            assert_eq!(
                parse_mode(Some(bad)).unwrap_err().code,
                ErrorCode::InvalidArgument
            );
        }
    }

    #[test]
    fn unique_suffixes_differ() {
        let a = unique_suffix();
        let b = unique_suffix();
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
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
