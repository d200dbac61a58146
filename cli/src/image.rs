//! `orchard image pull|import|ls|rm`.
//!
//! `pull` reads the server's NDJSON progress and draws it (bytes over the layers seen, and
//! layers done) on stderr. `import` uploads an archive file as it is, or tars an OCI
//! layout directory on the fly; either way the bytes are produced on a thread, written
//! into a small bounded pipe (`tokio-util`'s `SyncIoBridge`) and streamed from its other
//! end (`ReaderStream`, `reqwest::Body::wrap_stream`), so a multi-GiB image never sits
//! in memory, and the bar shows what was handed to the connection.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::DuplexStream;
use tokio::runtime::Handle;
use tokio_util::io::{ReaderStream, SyncIoBridge};

use super::client::Client;
use super::progress::{human_bytes, upload_milestone, upload_stats, Meter, PullState};
use super::sandbox::{print_json, print_out, table};
use super::CliError;

/// Bytes per chunk of an upload.
const CHUNK: usize = 256 << 10;
/// Chunks in flight between the reading thread and the connection (4 MiB).
const IN_FLIGHT: usize = 16;
/// What a producer writes the upload into.
type Upload = BufWriter<SyncIoBridge<DuplexStream>>;
/// How often the upload bar is redrawn.
const TICK: Duration = Duration::from_millis(100);
/// Size of a tar header or padding block.
const BLOCK: u64 = 512;

/// One line of the pull stream, read leniently: only `type` is required, so a line with
/// a field more or less still shows progress.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PullLine {
    r#type: String,
    layer: String,
    layer_bytes_done: u64,
    layer_bytes_total: u64,
    layers_done: u64,
    layers_total: u64,
    image: Option<Value>,
    detail: Option<String>,
    message: Option<String>,
}

/// `image pull`: progress on stderr, then `REFERENCE DIGEST` on stdout.
pub async fn pull(client: &Client, reference: &str) -> Result<i32, CliError> {
    let request = client
        .request(Method::POST, "/v1/images/pull")
        .json(&serde_json::json!({ "reference": reference }));
    let response = client.send(request).await?;
    let mut lines = client.lines(response);
    let mut state = PullState::default();
    let mut meter = Meter::stderr(reference);
    while let Some(line) = lines.next().await? {
        let event: PullLine =
            serde_json::from_slice(&line).map_err(|e| CliError::protocol("a pull line", e))?;
        match event.r#type.as_str() {
            "progress" => {
                state.update(
                    &event.layer,
                    event.layer_bytes_done,
                    event.layer_bytes_total,
                    event.layers_done,
                    event.layers_total,
                );
                if meter.is_tty() {
                    let (done, total) = state.bytes();
                    meter.draw(done, total, state.stats());
                } else if let Some(note) = state.milestone(reference) {
                    meter.note(&note);
                }
            }
            "done" => {
                meter.clear();
                let image = event.image.unwrap_or(Value::Null);
                let name = image["reference"].as_str().unwrap_or(reference);
                let digest = image["digest"]
                    .as_str()
                    .ok_or_else(|| CliError::protocol("the pulled image", "it has no digest"))?;
                print_out(&format!("{name} {digest}\n"))?;
                return Ok(0);
            }
            "error" => {
                meter.clear();
                return Err(CliError::Remote {
                    what: format!("pulling {reference}"),
                    message: event
                        .detail
                        .or(event.message)
                        .unwrap_or_else(|| "no reason given".into()),
                });
            }
            // Keepalives and frame types of newer servers.
            _ => {}
        }
    }
    Err(CliError::protocol(
        "the pull stream",
        "it ended without a done or error line (the connection was cut?)",
    ))
}

/// `image import`: uploads PATH (an archive file, or an OCI layout directory tarred on
/// the fly); prints `REFERENCE DIGEST` for each image stored.
pub async fn import(client: &Client, path: &Path, name: Option<&str>) -> Result<i32, CliError> {
    let what = path.display().to_string();
    let meta = fs::metadata(path).map_err(|e| CliError::io(&what, e))?;
    let failure: Arc<Mutex<Option<io::Error>>> = Arc::default();
    let (total, stream) = if meta.is_dir() {
        if !path.join("index.json").is_file() {
            return Err(CliError::Usage(format!(
                "{what} is a directory but not an OCI image layout (it has no index.json)"
            )));
        }
        let entries = walk(path).map_err(|e| CliError::io(format!("reading {what}"), e))?;
        let total = tar_size(&entries);
        (
            total,
            spawn_producer(failure.clone(), move |w| write_tar(entries, w))?,
        )
    } else {
        let mut file = File::open(path).map_err(|e| CliError::io(&what, e))?;
        (
            meta.len(),
            spawn_producer(failure.clone(), move |w| io::copy(&mut file, w).map(drop))?,
        )
    };

    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let body = stream.inspect(move |item| {
        if let Ok(chunk) = item {
            counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    });
    let mut request = client
        .request(Method::POST, "/v1/images/import")
        .header(CONTENT_TYPE, "application/octet-stream")
        .body(reqwest::Body::wrap_stream(body));
    if let Some(name) = name {
        request = request.query(&[("name", name)]);
    }

    let mut meter = Meter::stderr("uploading");
    let upload = client.json::<Value>(request, "the imported images");
    tokio::pin!(upload);
    // The first tick after TICK, not at once: an upload that is over by then shows no
    // bar at all.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    let mut quarter = 0;
    let answer = loop {
        tokio::select! {
            answer = &mut upload => break answer,
            _ = tick.tick() => {
                let done = sent.load(Ordering::Relaxed);
                if meter.is_tty() {
                    if done >= total {
                        meter.relabel("uploaded, importing");
                    }
                    meter.draw(done, total, upload_stats(done, total));
                } else if let Some(note) = upload_milestone(done, total, &mut quarter) {
                    meter.note(&note);
                }
            }
        }
    };
    meter.clear();
    let answer = match answer {
        Ok(answer) => answer,
        // A failed read on our side shows up as a broken upload: name the real cause.
        Err(err) => {
            let local = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
            return Err(match local {
                Some(e) => CliError::io(format!("reading {what}"), e),
                None => err,
            });
        }
    };
    let images = answer["images"]
        .as_array()
        .ok_or_else(|| CliError::protocol("the imported images", "it has no \"images\" array"))?;
    for image in images {
        print_out(&format!(
            "{} {}\n",
            image["reference"].as_str().unwrap_or("?"),
            image["digest"].as_str().unwrap_or("?")
        ))?;
    }
    Ok(0)
}

/// `image ls`: reference, digest, layers and size (or JSON).
pub async fn list(client: &Client, json: bool) -> Result<i32, CliError> {
    let answer: Value = client
        .json(client.request(Method::GET, "/v1/images"), "the image list")
        .await?;
    let images = answer["images"]
        .as_array()
        .ok_or_else(|| CliError::protocol("the image list", "it has no \"images\" array"))?;
    if json {
        print_json(&Value::Array(images.clone()))?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = images
        .iter()
        .map(|image| {
            // `layers` is a count; accept a list too.
            let layers = match &image["layers"] {
                Value::Array(a) => a.len().to_string(),
                Value::Number(n) => n.to_string(),
                _ => "-".into(),
            };
            let size = image["size_bytes"]
                .as_u64()
                .map_or_else(|| "-".into(), human_bytes);
            vec![
                image["reference"].as_str().unwrap_or("-").to_string(),
                short_digest(image["digest"].as_str().unwrap_or("-")),
                layers,
                size,
            ]
        })
        .collect();
    print_out(&table(&["REFERENCE", "DIGEST", "LAYERS", "SIZE"], &rows))?;
    Ok(0)
}

/// `image rm`: removes each; prints the references removed. As for `sandbox rm`, refused
/// ones are reported and the exit code is 1.
pub async fn remove(client: &Client, references: &[String]) -> Result<i32, CliError> {
    let mut failed = false;
    for reference in references {
        let request = client
            .request(Method::DELETE, "/v1/images")
            .query(&[("reference", reference)]);
        match client.send(request).await {
            Ok(_) => print_out(&format!("{reference}\n"))?,
            Err(err @ CliError::Api { .. }) => {
                failed = true;
                eprintln!("orchard: {reference}: {err}");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(i32::from(failed))
}

/// `sha256:0123456789abcdef...` -> `sha256:0123456789ab`.
fn short_digest(digest: &str) -> String {
    // `get`, not slicing: the digest is the server's text, not necessarily ASCII.
    match digest.split_once(':') {
        Some((algo, hex)) if hex.len() > 12 => match hex.get(..12) {
            Some(short) => format!("{algo}:{short}"),
            None => digest.to_string(),
        },
        _ => digest.to_string(),
    }
}

/// Runs `produce` on a thread, writing into a bounded pipe whose other end is the
/// returned stream of CHUNK-sized pieces; writes block while the connection is behind
/// (the backpressure that keeps memory bounded). A failure is kept in `failure` (to be
/// reported as itself) and also ends the stream with an error, so the server sees a
/// broken upload rather than a short, valid-looking one.
fn spawn_producer(
    failure: Arc<Mutex<Option<io::Error>>>,
    produce: impl FnOnce(&mut Upload) -> io::Result<()> + Send + 'static,
) -> Result<BoxStream<'static, io::Result<Bytes>>, CliError> {
    let (pipe_out, pipe_in) = tokio::io::duplex(IN_FLIGHT * CHUNK);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let handle = Handle::current();
    std::thread::Builder::new()
        .name("orchard-upload".into())
        .spawn(move || {
            let mut writer =
                BufWriter::with_capacity(CHUNK, SyncIoBridge::new_with_handle(pipe_in, handle));
            let result = produce(&mut writer).and_then(|()| writer.flush());
            // The pipe ends before the outcome is told.
            drop(writer);
            let outcome = match result {
                Ok(()) => None,
                // BrokenPipe is ours: the request already ended, nobody is listening.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => None,
                Err(e) => {
                    let message = e.to_string();
                    *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    Some(io::Error::other(message))
                }
            };
            let _ = done_tx.send(outcome);
        })
        .map_err(|e| CliError::io("starting the upload thread", e))?;
    // A thread that died without telling has nothing more to say than the bytes sent.
    let outcome = futures_util::stream::once(done_rx)
        .filter_map(|done| async move { done.ok().flatten().map(Err) });
    Ok(ReaderStream::with_capacity(pipe_out, CHUNK)
        .chain(outcome)
        .boxed())
}

/// An entry of a layout directory: its path on disk and its name in the tar.
struct Entry {
    path: PathBuf,
    name: String,
    meta: fs::Metadata,
}

/// Every entry under `root`, parents before children, sorted by name (a stable archive).
/// Symbolic links are entries of their own, not followed.
fn walk(root: &Path) -> io::Result<Vec<Entry>> {
    fn visit(dir: &Path, prefix: &str, out: &mut Vec<Entry>) -> io::Result<()> {
        let mut children: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        children.sort_by_key(|e| e.file_name());
        for child in children {
            let file_name = child.file_name();
            let Some(file_name) = file_name.to_str() else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a UTF-8 name", child.path().display()),
                ));
            };
            let name = format!("{prefix}{file_name}");
            let meta = fs::symlink_metadata(child.path())?;
            let is_dir = meta.is_dir();
            out.push(Entry {
                path: child.path(),
                name: name.clone(),
                meta,
            });
            if is_dir {
                visit(&child.path(), &format!("{name}/"), out)?;
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    visit(root, "", &mut out)?;
    Ok(out)
}

/// The size of the tar of `entries` (headers, data padded to blocks, GNU long-name
/// records, the two end blocks); an estimate only for exotic entries, which is all the
/// bar needs.
fn tar_size(entries: &[Entry]) -> u64 {
    let padded = |n: u64| n.div_ceil(BLOCK) * BLOCK;
    let mut total = 2 * BLOCK;
    for e in entries {
        total += BLOCK;
        let name_len = e.name.len() as u64 + u64::from(e.meta.is_dir());
        if name_len > 100 {
            total += BLOCK + padded(name_len + 1);
        }
        if e.meta.is_file() {
            total += padded(e.meta.len());
        }
    }
    total
}

/// Writes the tar of `entries` into `w`.
fn write_tar(entries: Vec<Entry>, w: &mut Upload) -> io::Result<()> {
    let mut builder = tar::Builder::new(w);
    builder.follow_symlinks(false);
    for e in &entries {
        if e.meta.is_dir() {
            builder.append_dir(&e.name, &e.path)?;
        } else {
            builder.append_path_with_name(&e.path, &e.name)?;
        }
    }
    builder.into_inner()?.flush()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn digests_are_shortened_for_the_table() {
        assert_eq!(
            short_digest("sha256:0123456789abcdef0123"),
            "sha256:0123456789ab"
        );
        assert_eq!(short_digest("short"), "short");
        // Byte 12 inside a character: left whole rather than cut.
        assert_eq!(short_digest("x:aéééééé"), "x:aéééééé");
    }

    /// The directory tar streamed through the pipe is a valid archive with the
    /// layout's names (no `./`, no absolute paths) and its exact size was predicted.
    #[tokio::test]
    async fn a_layout_directory_is_tarred_through_the_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(
            root.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        fs::write(root.join("index.json"), b"{}").unwrap();
        fs::create_dir_all(root.join("blobs/sha256")).unwrap();
        let big = vec![7u8; CHUNK * 2 + 5];
        fs::write(root.join("blobs/sha256").join("a".repeat(64)), &big).unwrap();
        let long = "n".repeat(120);
        fs::write(root.join(&long), b"x").unwrap();

        let entries = walk(root).unwrap();
        let expected = tar_size(&entries);
        let failure = Arc::default();
        let mut stream = spawn_producer(failure, move |w| write_tar(entries, w)).unwrap();
        let mut tar_bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            assert!(chunk.len() <= CHUNK);
            tar_bytes.extend_from_slice(&chunk);
        }
        assert_eq!(tar_bytes.len() as u64, expected);

        let mut archive = tar::Archive::new(tar_bytes.as_slice());
        let mut names = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            if name.ends_with(&"a".repeat(64)) {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                assert_eq!(data, big);
            }
            names.push(name);
        }
        let blob = format!("blobs/sha256/{}", "a".repeat(64));
        assert_eq!(
            names,
            vec![
                "blobs",
                "blobs/sha256",
                blob.as_str(),
                "index.json",
                long.as_str(),
                "oci-layout"
            ]
        );
    }

    #[tokio::test]
    async fn a_read_failure_ends_the_body_with_an_error() {
        let failure: Arc<Mutex<Option<io::Error>>> = Arc::default();
        let stream = spawn_producer(failure.clone(), |w| {
            w.write_all(b"some")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap();
        let items: Vec<io::Result<Bytes>> = stream.collect().await;
        assert!(items.last().unwrap().is_err());
        let kept = failure.lock().unwrap().take().unwrap();
        assert_eq!(kept.to_string(), "disk on fire");
    }
}
