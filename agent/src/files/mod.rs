//! The files capability: read, write, remove, stat, list, mkdir, move, and tar
//! upload/download, over HTTP.
//!
//! File contents stream in both directions and are never held whole in memory. Writes
//! go to a temporary file next to the target and are renamed over it, so a reader never
//! sees a half-written file and a failed upload leaves the old content in place. Tar
//! parsing and building are synchronous (the `tar` crate); they run on blocking threads
//! and talk to the async body through bounded channels, see `BodyReader` and
//! `ChannelWriter`. The tar logic itself lives in [`crate::archive`].

use std::fs::{self, DirBuilder, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use orchard_protocol::files::{
    Done, ExtractResult, FileKind, FileList, FileStat, MkdirRequest, MoveRequest, WriteResult,
};
use orchard_protocol::ErrorCode;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::archive;
use crate::error::{ApiError, ApiResult};
use crate::extract::{content_length, ApiQuery, JsonBody};
use crate::fsuser;
use crate::state::AppState;

/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Prefix of the temporary files writes go through.
pub const TEMP_PREFIX: &str = ".orchard-tmp-";
/// Size of the chunks files are streamed in.
const CHUNK: usize = 64 * 1024;
/// Chunks queued between the async body and a blocking tar reader or writer; bounded
/// so a slow side holds the other back instead of buffering the whole stream.
const QUEUE: usize = 8;
/// Mode of written files when none is given.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of created directories when none is given.
const DEFAULT_DIR_MODE: u32 = 0o755;

/// Routes of the files capability.
pub fn routes() -> Router<Arc<AppState>> {
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

#[derive(Deserialize)]
struct ReadQuery {
    path: String,
    offset: Option<u64>,
    length: Option<u64>,
}

#[derive(Deserialize)]
struct WriteQuery {
    path: String,
    mode: Option<String>,
    parents: Option<bool>,
}

#[derive(Deserialize)]
struct RemoveQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
struct ListQuery {
    path: String,
    depth: Option<u32>,
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

fn modified_ms(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1000)
        .saturating_add(meta.mtime_nsec() / 1_000_000)
}

fn kind_of(meta: &Metadata) -> FileKind {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Directory
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// The wire stat of `path`, whose metadata was read without following links.
fn file_stat(shown: String, path: &Path, meta: &Metadata) -> FileStat {
    let link_target = if meta.file_type().is_symlink() {
        fs::read_link(path)
            .ok()
            .map(|target| target.to_string_lossy().into_owned())
    } else {
        None
    };
    FileStat {
        name: path
            .file_name()
            .map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned()),
        path: shown,
        kind: kind_of(meta),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        modified_ms: modified_ms(meta),
        link_target,
    }
}

// ---------------------------------------------------------------------------------
// Read

async fn read_file(ApiQuery(q): ApiQuery<ReadQuery>) -> ApiResult<Response> {
    let path = absolute(&q.path)?;
    let io_err = |err: io::Error| ApiError::io("read", &q.path, &err);
    // Checked before opening: opening a fifo would block until a writer shows up.
    let meta = tokio::fs::metadata(&path).await.map_err(io_err)?;
    if meta.is_dir() {
        return Err(ApiError::new(
            ErrorCode::IsADirectory,
            format!("read {}: is a directory", q.path),
        ));
    }
    if !meta.is_file() {
        return Err(ApiError::invalid(format!(
            "read {}: not a regular file",
            q.path
        )));
    }
    let mut file = tokio::fs::File::open(&path).await.map_err(io_err)?;
    let offset = q.offset.unwrap_or(0);
    let size = meta.len();
    // Files of /proc and /sys report size 0 yet have content: those are streamed to
    // their end without a Content-Length.
    let (limit, declared) = if size == 0 {
        (q.length.unwrap_or(u64::MAX), None)
    } else {
        let available = size.saturating_sub(offset);
        let n = q.length.map_or(available, |length| length.min(available));
        (n, Some(n))
    };
    if offset > 0 {
        file.seek(io::SeekFrom::Start(offset))
            .await
            .map_err(io_err)?;
    }
    let reader = file.take(limit);
    let stream = futures_util::stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        let mut buf = BytesMut::with_capacity(CHUNK);
        match reader.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(buf.freeze()), Some(reader))),
            Err(err) => Some((Err(err), None)),
        }
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(n) = declared {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    Ok(response)
}

// ---------------------------------------------------------------------------------
// Write

/// A temporary file removed when dropped, unless it was renamed into place. Dropping
/// also covers a handler future cancelled by a client that went away mid-upload.
struct TempFile {
    path: Option<PathBuf>,
}

impl TempFile {
    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    fn keep(mut self) {
        self.path = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Creates a fresh temporary file in `dir`; errors are reported against `target`.
async fn create_temp(dir: &Path, target: &str) -> ApiResult<(tokio::fs::File, TempFile)> {
    let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
    for _ in 0..16 {
        let path = dir.join(format!("{TEMP_PREFIX}{}", unique_suffix()));
        let at = path.clone();
        let opened = fsuser::blocking(move || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&at)
        })
        .await
        .map_err(|_| blocking_failed("write"))?;
        match opened {
            Ok(file) => {
                return Ok((
                    tokio::fs::File::from_std(file),
                    TempFile { path: Some(path) },
                ))
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => last = err,
            Err(err) => return Err(ApiError::io("write", target, &err)),
        }
    }
    Err(ApiError::io("write", target, &last))
}

async fn write_file(
    State(state): State<Arc<AppState>>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<WriteResult>> {
    let limit = state.config.limits.max_upload_bytes;
    write_body(&q, &headers, body, limit).await.map(Json)
}

/// Writes `body` to `q.path` through a temporary file and a rename.
async fn write_body(
    q: &WriteQuery,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> ApiResult<WriteResult> {
    let path = absolute(&q.path)?;
    let mode = parse_mode(q.mode.as_deref())?;
    if content_length(headers).is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let is_dir_error = || {
        ApiError::new(
            ErrorCode::IsADirectory,
            format!("write {}: is a directory", q.path),
        )
    };
    let Some(parent) = path.parent() else {
        return Err(is_dir_error());
    };
    // Refused before the upload rather than after it, when the rename would fail.
    if tokio::fs::symlink_metadata(&path)
        .await
        .is_ok_and(|meta| meta.is_dir())
    {
        return Err(is_dir_error());
    }
    if q.parents.unwrap_or(true) {
        let dir = parent.to_path_buf();
        fsuser::blocking(move || fs::create_dir_all(dir))
            .await
            .map_err(|_| blocking_failed("write"))?
            .map_err(|err| ApiError::io("create", &parent.to_string_lossy(), &err))?;
    }
    let (mut file, temp) = create_temp(parent, &q.path).await?;
    let io_err = |err: io::Error| ApiError::io("write", &q.path, &err);
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| unreadable_body())?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(too_large(limit));
        }
        file.write_all(&chunk).await.map_err(io_err)?;
    }
    // tokio's File finishes writes in the background; flush waits for them, so the
    // rename below publishes complete content.
    file.flush().await.map_err(io_err)?;
    drop(file);
    // A rename replaces a symbolic link at the target rather than writing through it.
    let (from, to) = (temp.path().to_path_buf(), path.clone());
    fsuser::blocking(move || {
        fs::set_permissions(&from, Permissions::from_mode(mode))?;
        fs::rename(&from, &to)
    })
    .await
    .map_err(|_| blocking_failed("write"))?
    .map_err(io_err)?;
    temp.keep();
    Ok(WriteResult {
        path: q.path.clone(),
        size,
    })
}

// ---------------------------------------------------------------------------------
// Remove, stat, list

async fn remove_path(ApiQuery(q): ApiQuery<RemoveQuery>) -> ApiResult<Json<Done>> {
    let path = absolute(&q.path)?;
    if is_root(&path) {
        return Err(ApiError::invalid("refusing to remove /"));
    }
    let io_err = |err: io::Error| ApiError::io("remove", &q.path, &err);
    let recursive = q.recursive;
    fsuser::blocking(move || {
        let meta = fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            if recursive {
                // std's remove_dir_all removes links found inside without following them.
                fs::remove_dir_all(&path)
            } else {
                fs::remove_dir(&path)
            }
        } else {
            fs::remove_file(&path)
        }
    })
    .await
    .map_err(|_| blocking_failed("remove"))?
    .map_err(io_err)?;
    Ok(Json(Done { path: q.path }))
}

async fn stat_path(ApiQuery(q): ApiQuery<PathQuery>) -> ApiResult<Json<FileStat>> {
    let path = absolute(&q.path)?;
    let meta = tokio::fs::symlink_metadata(&path)
        .await
        .map_err(|err| ApiError::io("stat", &q.path, &err))?;
    let stat = tokio::task::spawn_blocking(move || file_stat(q.path, &path, &meta))
        .await
        .map_err(|_| blocking_failed("stat"))?;
    Ok(Json(stat))
}

async fn list_path(ApiQuery(q): ApiQuery<ListQuery>) -> ApiResult<Json<FileList>> {
    let path = absolute(&q.path)?;
    let depth = q.depth.unwrap_or(1);
    if depth == 0 {
        return Err(ApiError::invalid("depth must be at least 1"));
    }
    tokio::task::spawn_blocking(move || list(&path, q.path, depth, MAX_LIST_ENTRIES))
        .await
        .map_err(|_| blocking_failed("list"))?
        .map(Json)
}

/// Children of `dir` with their lstat metadata, sorted by name. Entries that vanish
/// while being listed are left out: a live directory is not an error.
fn sorted_children(dir: &Path) -> io::Result<Vec<(PathBuf, Metadata)>> {
    let mut children = Vec::new();
    for item in fs::read_dir(dir)? {
        let Ok(item) = item else { continue };
        // DirEntry::metadata does not follow links.
        if let Ok(meta) = item.metadata() {
            children.push((item.path(), meta));
        }
    }
    children.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(children)
}

/// Lists `dir` depth first, each directory followed by its own entries, up to `max`.
fn list(dir: &Path, shown: String, depth: u32, max: usize) -> ApiResult<FileList> {
    let io_err = |err: io::Error| ApiError::io("list", &shown, &err);
    let meta = fs::metadata(dir).map_err(io_err)?;
    if !meta.is_dir() {
        return Err(ApiError::new(
            ErrorCode::NotADirectory,
            format!("list {shown}: not a directory"),
        ));
    }
    let top = sorted_children(dir).map_err(io_err)?;
    let mut stack = vec![(top.into_iter(), 1u32)];
    let mut entries = Vec::new();
    let mut truncated = false;
    loop {
        let next = match stack.last_mut() {
            None => break,
            Some((children, level)) => children.next().map(|child| (child, *level)),
        };
        let Some(((path, meta), level)) = next else {
            stack.pop();
            continue;
        };
        if entries.len() >= max {
            truncated = true;
            break;
        }
        entries.push(file_stat(path.to_string_lossy().into_owned(), &path, &meta));
        // lstat metadata: a link to a directory is not a directory here, so it is
        // listed but never descended into.
        if meta.is_dir() && level < depth {
            // An unreadable subdirectory still appears; only its contents are missing.
            if let Ok(children) = sorted_children(&path) {
                stack.push((children.into_iter(), level + 1));
            }
        }
    }
    Ok(FileList {
        path: shown,
        entries,
        truncated,
    })
}

// ---------------------------------------------------------------------------------
// Mkdir, move

async fn make_dir(JsonBody(req): JsonBody<MkdirRequest>) -> ApiResult<Json<Done>> {
    let path = absolute(&req.path)?;
    let mode = check_mode(req.mode.unwrap_or(DEFAULT_DIR_MODE))?;
    let shown = req.path.clone();
    fsuser::blocking(move || make_dirs(&path, mode, &shown))
        .await
        .map_err(|_| blocking_failed("mkdir"))??;
    Ok(Json(Done { path: req.path }))
}

/// `mkdir -p`, giving every directory it creates exactly `mode` (the umask does not
/// apply); existing directories are left as they are.
fn make_dirs(path: &Path, mode: u32, shown: &str) -> ApiResult<()> {
    let io_err = |err: io::Error| ApiError::io("mkdir", shown, &err);
    let mut missing = Vec::new();
    let mut current = path;
    loop {
        match fs::metadata(current) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) if current == path => {
                return Err(ApiError::new(
                    ErrorCode::AlreadyExists,
                    format!("mkdir {shown}: exists and is not a directory"),
                ))
            }
            Ok(_) => {
                return Err(ApiError::new(
                    ErrorCode::NotADirectory,
                    format!("mkdir {shown}: {} is not a directory", current.display()),
                ))
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                missing.push(current);
                match current.parent() {
                    Some(parent) => current = parent,
                    None => break,
                }
            }
            Err(err) => return Err(io_err(err)),
        }
    }
    for dir in missing.into_iter().rev() {
        match DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => fs::set_permissions(dir, Permissions::from_mode(mode)).map_err(io_err)?,
            // Created concurrently: fine, as long as it is a directory.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(err) => return Err(io_err(err)),
        }
    }
    Ok(())
}

async fn move_path(JsonBody(req): JsonBody<MoveRequest>) -> ApiResult<Json<Done>> {
    let from = absolute(&req.from)?;
    let to = absolute(&req.to)?;
    if is_root(&from) || is_root(&to) {
        return Err(ApiError::invalid("refusing to move / or onto /"));
    }
    let shown = format!("{} to {}", req.from, req.to);
    let overwrite = req.overwrite;
    fsuser::blocking(move || move_blocking(&from, &to, overwrite, &shown))
        .await
        .map_err(|_| blocking_failed("move"))??;
    Ok(Json(Done { path: req.to }))
}

fn move_blocking(from: &Path, to: &Path, overwrite: bool, shown: &str) -> ApiResult<()> {
    let io_err = |err: io::Error| ApiError::io("move", shown, &err);
    fs::symlink_metadata(from).map_err(io_err)?;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(io_err)?;
    }
    match fs::symlink_metadata(to) {
        Ok(_) if !overwrite => {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!(
                    "move {shown}: {} already exists (set overwrite to replace it)",
                    to.display()
                ),
            ))
        }
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_err(err)),
    }
    match fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::EXDEV) => {
            copy_then_remove(from, to).map_err(io_err)
        }
        Err(err) => Err(io_err(err)),
    }
}

/// A move across filesystems: copy next to the destination, rename the copy into
/// place (so the destination is never half-copied), then remove the source.
fn copy_then_remove(from: &Path, to: &Path) -> io::Result<()> {
    let parent = to.parent().unwrap_or(Path::new("/"));
    let temp = parent.join(format!("{TEMP_PREFIX}{}", unique_suffix()));
    let copied = copy_tree(from, &temp).and_then(|()| fs::rename(&temp, to));
    if let Err(err) = copied {
        let _ = remove_any(&temp);
        return Err(err);
    }
    remove_any(from)
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// Copies a tree keeping modes, mtimes and symbolic links (as links).
fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(src)?;
    let file_type = meta.file_type();
    let mode = meta.mode() & 0o7777;
    if file_type.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)
    } else if file_type.is_dir() {
        // Owner-writable until its children are in; its own mode comes last.
        DirBuilder::new().mode(0o700).create(dst)?;
        for item in fs::read_dir(src)? {
            let item = item?;
            copy_tree(&item.path(), &dst.join(item.file_name()))?;
        }
        fs::File::open(dst)?.set_modified(meta.modified()?)?;
        fs::set_permissions(dst, Permissions::from_mode(mode))
    } else if file_type.is_file() {
        let mut input = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(src)?;
        let mut output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)?;
        io::copy(&mut input, &mut output)?;
        output.set_modified(meta.modified()?)?;
        output.set_permissions(Permissions::from_mode(mode))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cannot copy special file {} across filesystems",
                src.display()
            ),
        ))
    }
}

// ---------------------------------------------------------------------------------
// Archives

/// One message from the async body to a blocking reader.
enum Chunk {
    Data(Bytes),
    /// The body ended cleanly.
    End,
    /// The body failed (too large, unreadable); the reader must fail too.
    Fail(String),
}

/// A blocking `Read` over body chunks sent through a channel. A sender dropped without
/// [`Chunk::End`] reads as an error, not an end: a cancelled upload must never look
/// like a complete (shorter) archive.
struct BodyReader {
    rx: mpsc::Receiver<Chunk>,
    current: Bytes,
    done: bool,
}

impl BodyReader {
    fn new(rx: mpsc::Receiver<Chunk>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
            done: false,
        }
    }
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(data)) => self.current = data,
                Some(Chunk::End) => self.done = true,
                Some(Chunk::Fail(message)) => return Err(io::Error::other(message)),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the request body ended early",
                    ))
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Sends `body` into `tx`, enforcing `limit`. A receiver that stops listening is not an
/// error here: the reader's own result says why it stopped.
async fn feed_body(body: Body, tx: mpsc::Sender<Chunk>, limit: u64) -> ApiResult<()> {
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let Ok(data) = chunk else {
            let _ = tx
                .send(Chunk::Fail("the request body could not be read".into()))
                .await;
            return Err(unreadable_body());
        };
        total += data.len() as u64;
        if total > limit {
            let _ = tx
                .send(Chunk::Fail("the request body is too large".into()))
                .await;
            return Err(too_large(limit));
        }
        if data.is_empty() {
            continue;
        }
        if tx.send(Chunk::Data(data)).await.is_err() {
            return Ok(());
        }
    }
    let _ = tx.send(Chunk::End).await;
    Ok(())
}

async fn upload_archive(
    State(state): State<Arc<AppState>>,
    ApiQuery(q): ApiQuery<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ExtractResult>> {
    let limit = state.config.limits.max_upload_bytes;
    extract_body(q.path, &headers, body, limit).await.map(Json)
}

/// Extracts a tar or tar.gz body into `shown`, streaming it to a blocking extractor.
async fn extract_body(
    shown: String,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> ApiResult<ExtractResult> {
    let dir = absolute(&shown)?;
    if content_length(headers).is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let (tx, rx) = mpsc::channel(QUEUE);
    let job = fsuser::blocking(move || archive::extract(BodyReader::new(rx), &dir));
    let fed = feed_body(body, tx, limit).await;
    let extracted = job.await.map_err(|_| blocking_failed("extraction"))?;
    // A body error comes first: the extraction then failed only because its input was
    // cut, and it has already cleaned up.
    fed?;
    let stats = extracted?;
    Ok(ExtractResult {
        path: shown,
        entries: stats.entries,
        bytes: stats.bytes,
    })
}

/// A blocking `Write` that sends what it is given, in chunks, through a channel. When
/// the receiver is gone (the client disconnected) writes fail, which stops the writer.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Self {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

async fn download_archive(ApiQuery(q): ApiQuery<PathQuery>) -> ApiResult<Response> {
    let path = absolute(&q.path)?;
    // Checked here so a missing path is a 404, not an aborted 200.
    tokio::fs::symlink_metadata(&path)
        .await
        .map_err(|err| ApiError::io("archive", &q.path, &err))?;
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(QUEUE);
    tokio::task::spawn_blocking(move || {
        if let Err(err) = archive::build(&path, ChannelWriter::new(tx.clone())) {
            // The status is already sent; an error item aborts the body so the client
            // sees a broken transfer rather than a short archive that looks complete.
            let _ = tx.blocking_send(Err(io::Error::other(err.to_string())));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/gzip"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::os::unix::fs::symlink;

    #[tokio::test]
    async fn refused_upload_is_answered_after_its_body_is_read_not_cut_off() {
        let addr = crate::test_http::serve().await;
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
            let (got, answer) = crate::test_http::send(addr, "PUT", &path, &body)
                .await
                .unwrap_or_else(|e| panic!("PUT {path}: cut off mid-body: {e}"));
            assert_eq!(
                (got, answer["code"].as_str()),
                (status, Some(code)),
                "{path}: {answer}"
            );
        }
    }

    fn write_query(path: &Path, mode: Option<&str>, parents: Option<bool>) -> WriteQuery {
        WriteQuery {
            path: path.to_string_lossy().into_owned(),
            mode: mode.map(str::to_string),
            parents,
        }
    }

    fn chunked(parts: Vec<&'static [u8]>) -> Body {
        let stream = futures_util::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok::<_, io::Error>(Bytes::from_static(p))),
        );
        Body::from_stream(stream)
    }

    fn no_leftovers(dir: &Path) -> bool {
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

    #[tokio::test]
    async fn write_creates_parents_sets_mode_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/file.sh");
        let q = write_query(&target, Some("755"), None);
        let done = write_body(
            &q,
            &HeaderMap::new(),
            chunked(vec![b"#!/bin/sh\n", b"echo hi\n"]),
            1024,
        )
        .await
        .unwrap();
        assert_eq!(done.size, 18);
        assert_eq!(fs::read(&target).unwrap(), b"#!/bin/sh\necho hi\n");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o755);

        let q = write_query(&target, None, Some(false));
        write_body(&q, &HeaderMap::new(), Body::from("new"), 1024)
            .await
            .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o644);
        assert!(no_leftovers(&dir.path().join("a/b")));

        let q = write_query(&dir.path().join("missing/x"), None, Some(false));
        let err = write_body(&q, &HeaderMap::new(), Body::from("x"), 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);

        let q = write_query(dir.path(), None, None);
        let err = write_body(&q, &HeaderMap::new(), Body::from("x"), 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::IsADirectory);
    }

    #[tokio::test]
    async fn oversized_writes_are_refused_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        fs::write(&target, b"old").unwrap();
        let q = write_query(&target, None, None);
        let err = write_body(&q, &HeaderMap::new(), chunked(vec![b"12345", b"67890"]), 8)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(100u64));
        let err = write_body(&q, &headers, Body::from("x"), 8)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert!(no_leftovers(dir.path()));
    }

    #[tokio::test]
    async fn a_failing_body_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        let stream = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"part")),
            Err(io::Error::other("connection reset")),
        ]);
        let q = write_query(&target, None, None);
        let err = write_body(&q, &HeaderMap::new(), Body::from_stream(stream), 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(!target.exists());
        assert!(no_leftovers(dir.path()));
    }

    #[tokio::test]
    async fn reads_stream_whole_files_and_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &data).unwrap();
        let shown = path.to_string_lossy().into_owned();
        let read = |offset, length| ReadQuery {
            path: shown.clone(),
            offset,
            length,
        };

        let response = read_file(ApiQuery(read(None, None))).await.unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "200000");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[..], data[..]);

        let response = read_file(ApiQuery(read(Some(1000), Some(10))))
            .await
            .unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "10");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[..], data[1000..1010]);

        let response = read_file(ApiQuery(read(Some(199_990), Some(100))))
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[..], data[199_990..]);

        let response = read_file(ApiQuery(read(Some(500_000), None)))
            .await
            .unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "0");

        let dir_read = ReadQuery {
            path: dir.path().to_string_lossy().into_owned(),
            offset: None,
            length: None,
        };
        let err = read_file(ApiQuery(dir_read)).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::IsADirectory);
        let missing = ReadQuery {
            path: "/definitely/not/here".into(),
            offset: None,
            length: None,
        };
        assert_eq!(
            read_file(ApiQuery(missing)).await.unwrap_err().code,
            ErrorCode::NotFound
        );
        let relative = ReadQuery {
            path: "x".into(),
            offset: None,
            length: None,
        };
        assert_eq!(
            read_file(ApiQuery(relative)).await.unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[tokio::test]
    async fn remove_never_follows_links_and_guards_directories() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::write(real.join("keep"), b"k").unwrap();
        let link = dir.path().join("link");
        symlink(&real, &link).unwrap();
        let remove = |path: &Path, recursive| RemoveQuery {
            path: format!("{}/", path.display()),
            recursive,
        };

        let _ = remove_path(ApiQuery(remove(&link, true))).await.unwrap();
        assert!(!link.exists() && fs::symlink_metadata(&link).is_err());
        assert!(real.join("keep").exists());

        let err = remove_path(ApiQuery(remove(&real, false)))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::DirectoryNotEmpty);
        let _ = remove_path(ApiQuery(remove(&real, true))).await.unwrap();
        assert!(!real.exists());

        let root = RemoveQuery {
            path: "/".into(),
            recursive: true,
        };
        assert_eq!(
            remove_path(ApiQuery(root)).await.unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        let missing = RemoveQuery {
            path: real.to_string_lossy().into_owned(),
            recursive: false,
        };
        assert_eq!(
            remove_path(ApiQuery(missing)).await.unwrap_err().code,
            ErrorCode::NotFound
        );
    }

    #[tokio::test]
    async fn stat_does_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), b"12345").unwrap();
        symlink("f", dir.path().join("l")).unwrap();
        let stat = |name: &str| PathQuery {
            path: dir.path().join(name).to_string_lossy().into_owned(),
        };
        let Json(file) = stat_path(ApiQuery(stat("f"))).await.unwrap();
        assert_eq!(
            (file.kind, file.size, file.name.as_str()),
            (FileKind::File, 5, "f")
        );
        assert!(file.modified_ms > 1_000_000_000_000);
        let Json(link) = stat_path(ApiQuery(stat("l"))).await.unwrap();
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(link.link_target.as_deref(), Some("f"));
        let err = stat_path(ApiQuery(stat("nope"))).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    #[test]
    fn list_is_depth_first_sorted_capped_and_does_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("b/inner")).unwrap();
        fs::write(root.join("b/inner/deep"), b"").unwrap();
        fs::write(root.join("b/x"), b"").unwrap();
        fs::write(root.join("a"), b"").unwrap();
        fs::write(root.join("c"), b"").unwrap();
        symlink(root.join("b"), root.join("d")).unwrap();
        let names = |list: &FileList| -> Vec<String> {
            list.entries
                .iter()
                .map(|e| {
                    e.path
                        .strip_prefix(&*root.to_string_lossy())
                        .unwrap()
                        .to_string()
                })
                .collect()
        };

        let one = list(root, "shown".into(), 1, MAX_LIST_ENTRIES).unwrap();
        assert_eq!(names(&one), vec!["/a", "/b", "/c", "/d"]);
        assert_eq!(one.path, "shown");
        assert!(!one.truncated);
        assert_eq!(one.entries[3].kind, FileKind::Symlink);

        let two = list(root, "shown".into(), 2, MAX_LIST_ENTRIES).unwrap();
        assert_eq!(
            names(&two),
            vec!["/a", "/b", "/b/inner", "/b/x", "/c", "/d"]
        );
        let all = list(root, "shown".into(), 10, MAX_LIST_ENTRIES).unwrap();
        assert_eq!(
            names(&all),
            vec!["/a", "/b", "/b/inner", "/b/inner/deep", "/b/x", "/c", "/d"]
        );

        let capped = list(root, "shown".into(), 10, 3).unwrap();
        assert_eq!(names(&capped), vec!["/a", "/b", "/b/inner"]);
        assert!(capped.truncated);
        let exact = list(root, "shown".into(), 1, 4).unwrap();
        assert!(!exact.truncated);

        let err = list(&root.join("a"), "a".into(), 1, 10).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotADirectory);
    }

    #[test]
    fn mkdir_creates_parents_with_the_exact_mode() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("x/y/z");
        make_dirs(&deep, 0o750, "deep").unwrap();
        for p in ["x", "x/y", "x/y/z"] {
            assert_eq!(
                fs::metadata(dir.path().join(p)).unwrap().mode() & 0o7777,
                0o750
            );
        }
        make_dirs(&deep, 0o700, "deep").unwrap();
        assert_eq!(fs::metadata(&deep).unwrap().mode() & 0o7777, 0o750);
        fs::write(dir.path().join("file"), b"").unwrap();
        let err = make_dirs(&dir.path().join("file"), 0o755, "file").unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        let err = make_dirs(&dir.path().join("file/sub"), 0o755, "file/sub").unwrap_err();
        assert_eq!(err.code, ErrorCode::NotADirectory);
        assert_eq!(
            check_mode(0o10000).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn move_respects_overwrite_and_creates_parents() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("new/parent/to");
        fs::write(&from, b"1").unwrap();
        move_blocking(&from, &to, false, "m").unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"1");
        assert!(!from.exists());

        fs::write(&from, b"2").unwrap();
        let err = move_blocking(&from, &to, false, "m").unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        move_blocking(&from, &to, true, "m").unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"2");

        let err = move_blocking(&from, &to, true, "m").unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    #[test]
    fn cross_device_fallback_copies_trees_with_links_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/run"), b"#!").unwrap();
        fs::set_permissions(src.join("sub/run"), Permissions::from_mode(0o751)).unwrap();
        symlink("sub/run", src.join("link")).unwrap();
        let dst = dir.path().join("dst");
        copy_then_remove(&src, &dst).unwrap();
        assert!(!src.exists());
        assert_eq!(fs::read(dst.join("sub/run")).unwrap(), b"#!");
        assert_eq!(
            fs::metadata(dst.join("sub/run")).unwrap().mode() & 0o7777,
            0o751
        );
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            PathBuf::from("sub/run")
        );
        assert!(no_leftovers(dir.path()));
    }

    #[test]
    fn body_reader_needs_an_explicit_end() {
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Chunk::Data(Bytes::from_static(b"abc")))
            .unwrap();
        tx.try_send(Chunk::End).unwrap();
        let mut out = Vec::new();
        BodyReader::new(rx).read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abc");

        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Chunk::Data(Bytes::from_static(b"abc")))
            .unwrap();
        drop(tx);
        let err = BodyReader::new(rx)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);

        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Chunk::Fail("too large".into())).unwrap();
        assert!(BodyReader::new(rx).read_to_end(&mut Vec::new()).is_err());
    }

    #[test]
    fn channel_writer_stops_when_the_receiver_is_gone() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut writer = ChannelWriter::new(tx);
        writer.write_all(b"hello").unwrap();
        writer.flush().unwrap();
        assert_eq!(
            rx.try_recv().unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        drop(rx);
        writer.write_all(&[0u8; CHUNK]).unwrap_err();
    }

    fn tar_gz_of(dir: &Path) -> Vec<u8> {
        archive::build(dir, Vec::new()).unwrap()
    }

    #[tokio::test]
    async fn archives_upload_and_download_over_bodies() {
        let src = tempfile::tempdir().unwrap();
        let tree = src.path().join("tree");
        fs::create_dir_all(tree.join("sub")).unwrap();
        fs::write(tree.join("sub/f"), vec![9u8; 300_000]).unwrap();
        symlink("sub/f", tree.join("l")).unwrap();

        let response = download_archive(ApiQuery(PathQuery {
            path: tree.to_string_lossy().into_owned(),
        }))
        .await
        .unwrap();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/gzip");
        let gz = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(gz[..], tar_gz_of(&tree)[..]);

        let dest = tempfile::tempdir().unwrap();
        let shown = dest.path().join("out").to_string_lossy().into_owned();
        // Small chunks: the extractor must stitch them, not expect one buffer.
        let pieces: Vec<Result<Bytes, io::Error>> = gz
            .chunks(1000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures_util::stream::iter(pieces));
        let result = extract_body(shown.clone(), &HeaderMap::new(), body, 10 << 20)
            .await
            .unwrap();
        assert_eq!((result.entries, result.bytes), (4, 300_000));
        assert_eq!(
            fs::read(dest.path().join("out/tree/sub/f")).unwrap().len(),
            300_000
        );

        let err = extract_body(
            shown.clone(),
            &HeaderMap::new(),
            Body::from(gz.clone()),
            100,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        let err = extract_body("rel".into(), &HeaderMap::new(), Body::from(gz.clone()), 100)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);

        let fresh = dest.path().join("fresh");
        let cut = gz.slice(..gz.len() / 2);
        let err = extract_body(
            fresh.to_string_lossy().into_owned(),
            &HeaderMap::new(),
            Body::from(cut),
            10 << 20,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArchive);
        assert!(!fresh.exists());
        assert!(no_leftovers(&dest.path().join("out")));

        let err = download_archive(ApiQuery(PathQuery {
            path: "/definitely/not/here".into(),
        }))
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    #[tokio::test]
    async fn an_oversized_archive_stream_changes_nothing() {
        let src = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("a"), b"a").unwrap();
        let gz = tar_gz_of(&tree);
        let dest = tempfile::tempdir().unwrap();
        // The archive fits; the padding after it pushes the body over the limit.
        let mut body = gz.clone();
        body.extend(vec![0u8; 4096]);
        let limit = gz.len() as u64 + 100;
        let pieces: Vec<Result<Bytes, io::Error>> = body
            .chunks(512)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let err = extract_body(
            dest.path().to_string_lossy().into_owned(),
            &HeaderMap::new(),
            Body::from_stream(futures_util::stream::iter(pieces)),
            limit,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BodyTooLarge);
        assert_eq!(fs::read_dir(dest.path()).unwrap().count(), 0);
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
        let addr = crate::test_http::serve_with(config).await;
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
