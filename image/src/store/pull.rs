//! Pulling: the manifest (through an index to linux/amd64), the config, then every
//! layer streamed from the registry into an unpacking thread, several at once, each
//! layer downloaded once however many pulls want it.

use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::flight::{follow, Listener, Progress, Role};
use super::inner::Inner;
use crate::digest::{self, of_bytes, verify_bytes};
use crate::manifest::{
    check_config_type, check_layer_type, parse_manifest, select_platform, ConfigFile, Descriptor,
    Manifest, ManifestDoc,
};
use crate::reference::Reference;
use crate::registry::{self, Endpoint};
use crate::unpack;
use crate::{Image, ImageError};

/// Largest image config read into memory.
pub(crate) const MAX_CONFIG: usize = 32 << 20;
/// Chunks queued between a download and its unpacking thread.
const QUEUE: usize = 16;
/// Bytes between two progress reports of one layer.
const PROGRESS_STEP: u64 = 256 << 10;

/// Counts layers of one pull and fans its progress out.
#[derive(Clone)]
struct Reporter {
    reference: String,
    total: usize,
    done: Arc<AtomicUsize>,
    listener: Listener,
}

impl Reporter {
    fn bytes(&self, layer: &str, done: u64, total: u64) {
        (self.listener)(Progress {
            reference: self.reference.clone(),
            layer: layer.to_string(),
            layer_bytes_done: done,
            layer_bytes_total: total,
            layers_done: self.done.load(Ordering::SeqCst),
            layers_total: self.total,
        });
    }

    fn layer_done(&self, layer: &str, size: u64) {
        let done = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        (self.listener)(Progress {
            reference: self.reference.clone(),
            layer: layer.to_string(),
            layer_bytes_done: size,
            layer_bytes_total: size,
            layers_done: done.min(self.total),
            layers_total: self.total,
        });
    }
}

/// Downloaded chunks as a blocking reader for the unpacking thread: a `StreamReader` over
/// the channel, bridged to blocking reads through `handle`. The channel closing is the
/// end of the layer (a broken download is reported by the downloader, not here).
fn chunk_reader(chunks: mpsc::Receiver<Bytes>, handle: Handle) -> impl Read {
    let stream = futures_util::stream::unfold(chunks, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok::<_, io::Error>(chunk), rx))
    });
    SyncIoBridge::new_with_handle(StreamReader::new(Box::pin(stream)), handle)
}

impl Inner {
    /// Pulls `reference`: its manifest and config, then every layer; records the image.
    pub(super) async fn pull_now(
        self: Arc<Self>,
        reference: Reference,
        report: Listener,
    ) -> Result<Image, ImageError> {
        let name = reference.to_string();
        let endpoints = Arc::new(registry::endpoints(&self.config, &reference));
        let Resolved {
            bytes: manifest_bytes,
            digest: manifest_digest,
            index,
            manifest,
            first,
        } = self.resolve_manifest(&endpoints, &reference, &name).await?;
        check_manifest(&manifest, &name)?;
        let config_digest = manifest.config.digest.clone();
        let config_bytes = self
            .config_bytes(&endpoints, &reference, &name, &config_digest, first)
            .await?;
        let config = ConfigFile::parse(
            &config_bytes,
            &format!("config of {name}"),
            manifest.layers.len(),
        )?;
        let mut blobs = vec![manifest_digest.as_str(), config_digest.as_str()];
        blobs.extend(index.as_ref().map(|(_, digest)| digest.as_str()));
        let _pins = self.pin_image(&blobs, config.diff_ids())?;
        self.write_blob(&manifest_digest, &manifest_bytes)?;
        self.write_blob(&config_digest, &config_bytes)?;
        if let Some((bytes, digest)) = &index {
            self.write_blob(digest, bytes)?;
        }

        self.download_layers(
            &reference,
            &endpoints,
            first,
            &manifest,
            config.diff_ids(),
            report,
        )
        .await?;
        let index_digest = index.map(|(_, digest)| digest);
        self.record(
            &name,
            &manifest_digest,
            index_digest,
            &config_digest,
            &config,
        )
    }

    /// The pull's first step: fetches the manifest the reference names, checks its
    /// digests and, for an index, fetches the manifest for this platform.
    async fn resolve_manifest(
        &self,
        endpoints: &[Endpoint],
        reference: &Reference,
        name: &str,
    ) -> Result<Resolved, ImageError> {
        let fetched = self
            .registry
            .manifest(endpoints, reference, reference.manifest_ref(), 0)
            .await?;
        let first = fetched.endpoint;
        let what = format!("manifest of {name}");
        let top_digest = of_bytes(&fetched.bytes);
        if let Some(pinned) = &reference.digest {
            verify_bytes(&what, &fetched.bytes, pinned)?;
        }
        if let Some(header) = fetched
            .digest_header
            .as_deref()
            .filter(|h| h.starts_with(digest::SHA256_PREFIX))
        {
            verify_bytes(&what, &fetched.bytes, header)?;
        }
        // (manifest, its digest, the index and its digest when the name points at one)
        let (bytes, digest, index, manifest) =
            match parse_manifest(&fetched.bytes, fetched.content_type.as_deref(), &what)? {
                ManifestDoc::Manifest(manifest) => (fetched.bytes, top_digest, None, manifest),
                ManifestDoc::Index(index) => {
                    let chosen = select_platform(&index, name)?.digest.clone();
                    digest::hex_of(&chosen)?;
                    let child = self
                        .registry
                        .manifest(endpoints, reference, &chosen, first)
                        .await?;
                    let child_what = format!("manifest {chosen} of {name}");
                    verify_bytes(&child_what, &child.bytes, &chosen)?;
                    match parse_manifest(&child.bytes, child.content_type.as_deref(), &child_what)?
                    {
                        ManifestDoc::Manifest(manifest) => (
                            child.bytes,
                            chosen,
                            Some((fetched.bytes, top_digest)),
                            manifest,
                        ),
                        ManifestDoc::Index(_) => {
                            return Err(ImageError::invalid(
                                child_what,
                                "an index inside an index",
                            ));
                        }
                    }
                }
            };
        Ok(Resolved {
            bytes,
            digest,
            index,
            manifest,
            first,
        })
    }

    /// The pull's config step: the image's config from the store, or else fetched and
    /// checked against its digest.
    async fn config_bytes(
        &self,
        endpoints: &[Endpoint],
        reference: &Reference,
        name: &str,
        config_digest: &str,
        first: usize,
    ) -> Result<Vec<u8>, ImageError> {
        Ok(match self.read_blob(config_digest) {
            Some(bytes) => bytes,
            None => {
                let bytes = self
                    .registry
                    .small_blob(endpoints, reference, config_digest, first, MAX_CONFIG)
                    .await?;
                verify_bytes(
                    &format!("config {config_digest} of {name}"),
                    &bytes,
                    config_digest,
                )?;
                bytes
            }
        })
    }

    /// The pull's layer step: every layer ensured at once; the first failure aborts
    /// the others.
    async fn download_layers(
        self: &Arc<Self>,
        reference: &Reference,
        endpoints: &Arc<Vec<Endpoint>>,
        first: usize,
        manifest: &Manifest,
        diff_ids: &[String],
        report: Listener,
    ) -> Result<(), ImageError> {
        let name = reference.to_string();
        let reporter = Reporter {
            reference: name.clone(),
            total: manifest.layers.len(),
            done: Arc::new(AtomicUsize::new(0)),
            listener: report,
        };
        let mut tasks = JoinSet::new();
        for (descriptor, diff_id) in manifest.layers.iter().zip(diff_ids) {
            let task = LayerTask {
                reference: reference.clone(),
                endpoints: endpoints.clone(),
                first,
                descriptor: descriptor.clone(),
                diff_id: diff_id.clone(),
                reporter: reporter.clone(),
            };
            tasks.spawn(self.clone().ensure_layer(task));
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                // Returning drops the JoinSet, which aborts the other layers.
                Ok(Err(err)) => return Err(err),
                Err(err) => {
                    return Err(ImageError::invalid_by(
                        format!("layers of {name}"),
                        format!("download task failed: {err}"),
                        err,
                    ))
                }
            }
        }
        Ok(())
    }

    /// Makes sure a layer is unpacked, downloading it unless it is there or another
    /// pull is already fetching it.
    async fn ensure_layer(self: Arc<Self>, task: LayerTask) -> Result<(), ImageError> {
        let dest = self.layer_path(&task.diff_id)?;
        let key = digest::hex_of(&task.diff_id)?.to_string();
        loop {
            if dest.is_dir() {
                task.reporter
                    .layer_done(&task.descriptor.digest, task.descriptor.size);
                return Ok(());
            }
            match self.layers.join(&key, None) {
                Role::Leader(flight) => {
                    let result = flight.finish(self.clone().download_layer(&task, &dest).await);
                    if result.is_ok() {
                        task.reporter
                            .layer_done(&task.descriptor.digest, task.descriptor.size);
                    }
                    return result;
                }
                Role::Follower(outcome) => match follow(outcome).await {
                    Some(Ok(())) => {
                        task.reporter
                            .layer_done(&task.descriptor.digest, task.descriptor.size);
                        return Ok(());
                    }
                    Some(Err(err)) => return Err(err),
                    None => continue,
                },
            }
        }
    }

    /// Streams a layer blob into an unpacking thread, then installs the layer.
    async fn download_layer(
        self: Arc<Self>,
        task: &LayerTask,
        dest: &Path,
    ) -> Result<(), ImageError> {
        let _permit = self
            .downloads
            .acquire()
            .await
            .map_err(|_| ImageError::invalid("image store", "shutting down"))?;
        if dest.is_dir() {
            return Ok(());
        }
        let descriptor = &task.descriptor;
        let what = format!("layer {} of {}", descriptor.digest, task.reference);
        let mut response = self
            .registry
            .blob(
                &task.endpoints,
                &task.reference,
                &descriptor.digest,
                task.first,
            )
            .await?;
        let source = response.url().to_string();
        let total = if descriptor.size > 0 {
            descriptor.size
        } else {
            response.content_length().unwrap_or(0)
        };
        let work = self.work_dir("layer")?;
        let (sender, receiver) = mpsc::channel::<Bytes>(QUEUE);
        // The work directory goes with the thread: if this task is cancelled, the thread
        // still sees the end of the stream, finishes, and its drop removes the directory
        // (not before, while it is still being written).
        let unpacking = {
            let blob = descriptor.digest.clone();
            let diff_id = task.diff_id.clone();
            let what = what.clone();
            let reader = chunk_reader(receiver, Handle::current());
            tokio::task::spawn_blocking(move || {
                let result =
                    unpack::unpack_verified(reader, work.path(), Some(&blob), &diff_id, &what);
                (work, result)
            })
        };
        let (received, failure) = relay(task, &mut response, &sender, &what, &source, total).await;
        drop(sender);
        let (work, outcome) = unpacking.await.map_err(|err| {
            ImageError::invalid_by(&what, format!("unpacking thread failed: {err}"), err)
        })?;
        // A broken download explains whatever the unpacker then saw.
        if let Some(failure) = failure {
            return Err(failure);
        }
        outcome?;
        task.reporter.bytes(&descriptor.digest, received, total);
        // Flushing a large layer takes a while: off the async threads.
        let dest = dest.to_path_buf();
        tokio::task::spawn_blocking(move || work.install(&dest))
            .await
            .map_err(|err| {
                ImageError::invalid_by(&what, format!("install thread failed: {err}"), err)
            })?
    }
}

/// A layer download's streaming step: the response's chunks to the unpacker, with
/// progress reports; answers the bytes received and why the download failed, if it did.
async fn relay(
    task: &LayerTask,
    response: &mut reqwest::Response,
    sender: &mpsc::Sender<Bytes>,
    what: &str,
    source: &str,
    total: u64,
) -> (u64, Option<ImageError>) {
    let mut received = 0u64;
    let mut reported = 0u64;
    let mut failure = None;
    let descriptor = &task.descriptor;
    task.reporter.bytes(&descriptor.digest, 0, total);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                received += chunk.len() as u64;
                if descriptor.size > 0 && received > descriptor.size {
                    failure = Some(ImageError::invalid(
                        what,
                        format!(
                            "{source} sent more than the {} bytes the manifest declares",
                            descriptor.size
                        ),
                    ));
                    break;
                }
                if sender.send(chunk).await.is_err() {
                    break;
                }
                if received - reported >= PROGRESS_STEP {
                    reported = received;
                    task.reporter.bytes(&descriptor.digest, received, total);
                }
            }
            Ok(None) => break,
            Err(err) => {
                failure = Some(ImageError::Unreachable {
                    reference: task.reference.to_string(),
                    tried: vec![format!(
                        "{source}: download interrupted: {}",
                        crate::error::chain(&err)
                    )],
                    source: Some(std::sync::Arc::new(err)),
                });
                break;
            }
        }
    }
    (received, failure)
}

/// The manifests a pull resolved.
struct Resolved {
    /// The image's manifest, as fetched.
    bytes: Vec<u8>,
    /// Its digest.
    digest: String,
    /// The index and its digest, when the name points at one.
    index: Option<(Vec<u8>, String)>,
    /// The manifest, parsed.
    manifest: Manifest,
    /// Index of the endpoint that answered first.
    first: usize,
}

/// What a layer download needs, owned so it can run as its own task.
struct LayerTask {
    reference: Reference,
    endpoints: Arc<Vec<Endpoint>>,
    first: usize,
    descriptor: Descriptor,
    diff_id: String,
    reporter: Reporter,
}

/// Checks media types and digests of a manifest before anything is fetched.
pub fn check_manifest(manifest: &Manifest, name: &str) -> Result<(), ImageError> {
    check_config_type(&manifest.config, name)?;
    digest::hex_of(&manifest.config.digest)?;
    for layer in &manifest.layers {
        check_layer_type(layer, name)?;
        digest::hex_of(&layer.digest)?;
    }
    Ok(())
}
