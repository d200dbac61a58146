//! Importing images from files: a `docker save` archive or an OCI image layout, each as
//! a tar (optionally gzip or zstd compressed) or as an extracted directory.
//!
//! `docker save` writes `manifest.json` (per image: the config file, `RepoTags`, and the
//! layer tars, uncompressed). It has no registry manifest, so the store synthesises an
//! OCI manifest from the config and the layers as stored; its digest is the image's
//! digest. Docker 25 and later write an OCI layout in the same archive too: its
//! `manifest.json` is preferred because it carries the names.
//!
//! An OCI layout has `index.json` pointing at manifests (or nested indexes, resolved to
//! linux/amd64) in `blobs/sha256/`. Every blob is checked against its digest and every
//! layer against the config's diff_ids, as for a pull. Names inside the archive are
//! untrusted: `..` is refused and symbolic links between entries of a tar are followed
//! only inside the archive.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use serde::Deserialize;

use super::digest::{self, of_bytes, verify_bytes, HashingReader};
use super::manifest::{
    parse_manifest, select_platform, ConfigFile, Descriptor, Index, ManifestDoc,
    ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME, OCI_CONFIG, OCI_INDEX, OCI_MANIFEST,
};
use super::reference::Reference;
use super::registry::MAX_DOCUMENT;
use super::store::{check_manifest, ImageStore, MAX_CONFIG};
use super::unpack::{self, Compression};
use super::{Image, ImageError};

/// Most links followed to find one archive entry.
const MAX_LINK_HOPS: usize = 16;

impl ImageStore {
    /// Imports a `docker save` archive (tar, optionally gzip or zstd compressed, or its
    /// extracted directory) or an OCI image layout (directory or tar). Images are named by
    /// `name` when given (the archive must then hold exactly one image, or one whose
    /// `org.opencontainers.image.ref.name` is `name`'s tag), else by the names the archive
    /// carries (`RepoTags`, or `io.containerd.image.name` / a full reference in
    /// `org.opencontainers.image.ref.name`). Blocking: call it from `spawn_blocking` in
    /// async code.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<Vec<Image>, ImageError> {
        import(self, path, name)
    }
}

/// Imports every image of `path` (see [`ImageStore::import`]).
fn import(store: &ImageStore, path: &Path, name: Option<&str>) -> Result<Vec<Image>, ImageError> {
    let name = name.map(Reference::parse).transpose()?;
    let source = Source::open(store, path)?;
    if source.exists("manifest.json") {
        import_docker_save(store, &source, name.as_ref())
    } else if source.exists("index.json") {
        import_oci_layout(store, &source, name.as_ref())
    } else {
        Err(ImageError::invalid(
            format!("archive {}", path.display()),
            "neither a docker save archive (no manifest.json) nor an OCI image layout (no index.json)",
        ))
    }
}

/// One image of `docker save`'s `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    #[serde(default)]
    layers: Vec<String>,
}

/// Imports the images of a `docker save` archive.
fn import_docker_save(
    store: &ImageStore,
    source: &Source,
    name: Option<&Reference>,
) -> Result<Vec<Image>, ImageError> {
    let what = source.describe();
    let entries: Vec<SaveEntry> =
        serde_json::from_slice(&source.read_small("manifest.json", MAX_DOCUMENT)?)
            .map_err(|err| ImageError::invalid_by(&what, format!("manifest.json: {err}"), err))?;
    if entries.is_empty() {
        return Err(ImageError::invalid(&what, "manifest.json lists no image"));
    }
    if name.is_some() && entries.len() > 1 {
        return Err(ImageError::invalid(
            &what,
            format!(
                "it holds {} images: import it without a name to keep the names it carries",
                entries.len()
            ),
        ));
    }
    let mut images = Vec::new();
    for entry in entries {
        let names: Vec<String> = match name {
            Some(name) => vec![name.to_string()],
            None => entry
                .repo_tags
                .iter()
                .flatten()
                .map(|tag| Reference::parse(tag).map(|r| r.to_string()))
                .collect::<Result<_, _>>()?,
        };
        if names.is_empty() {
            return Err(ImageError::invalid(
                &what,
                format!("image {} has no name (RepoTags): give one", entry.config),
            ));
        }
        let config_bytes = source.read_small(&entry.config, MAX_CONFIG)?;
        let config_digest = of_bytes(&config_bytes);
        if let Some(named) = digest_in_name(&entry.config) {
            verify_bytes(
                &format!("config {} of {what}", entry.config),
                &config_bytes,
                &named,
            )?;
        }
        let config = ConfigFile::parse(
            &config_bytes,
            &format!("config {} of {what}", entry.config),
            entry.layers.len(),
        )?;
        let _pins = store.pin_image(&[&config_digest], config.diff_ids())?;
        let mut layers = Vec::new();
        for (layer, diff_id) in entry.layers.iter().zip(config.diff_ids()) {
            layers.push(import_layer(store, source, layer, diff_id, &what)?);
        }
        // The registry manifest docker would have pushed for this image.
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_bytes.len()},
            "layers": layers,
        });
        let manifest_bytes = serde_json::to_vec(&manifest)
            .map_err(|err| ImageError::invalid_by(&what, err.to_string(), err))?;
        let manifest_digest = of_bytes(&manifest_bytes);
        let _manifest_pin = store.pin_image(&[&manifest_digest], &[])?;
        store.write_blob(&config_digest, &config_bytes)?;
        store.write_blob(&manifest_digest, &manifest_bytes)?;
        for name in names {
            images.push(store.record(&name, &manifest_digest, None, &config_digest, &config)?);
        }
    }
    Ok(images)
}

/// A docker save's layer step: unpacked and checked unless the store has it (then
/// only hashed); answers its descriptor for the manifest.
fn import_layer(
    store: &ImageStore,
    source: &Source,
    layer: &str,
    diff_id: &str,
    what: &str,
) -> Result<serde_json::Value, ImageError> {
    let layer_what = format!("layer {layer} of {what}");
    let (reader, _) = source.reader(layer)?;
    let expected = digest_in_name(layer);
    let dest = store.layer_path(diff_id)?;
    let (blob_digest, size, compression) = if dest.is_dir() {
        hash_blob(reader, &layer_what)?
    } else {
        let work = store.work_dir("import")?;
        let verified = unpack::unpack_verified(
            reader,
            work.path(),
            expected.as_deref(),
            diff_id,
            &layer_what,
        )?;
        work.install(&dest)?;
        (
            verified.blob_digest,
            verified.blob_size,
            verified.compression,
        )
    };
    if let Some(expected) = expected {
        if expected != blob_digest {
            return Err(ImageError::DigestMismatch {
                what: layer_what,
                expected,
                actual: blob_digest,
            });
        }
    }
    Ok(serde_json::json!({
        "mediaType": compression.media_type(),
        "digest": blob_digest,
        "size": size,
    }))
}

fn import_oci_layout(
    store: &ImageStore,
    source: &Source,
    name: Option<&Reference>,
) -> Result<Vec<Image>, ImageError> {
    let what = source.describe();
    let index_bytes = source.read_small("index.json", MAX_DOCUMENT)?;
    let index: Index = match parse_manifest(
        &index_bytes,
        Some(OCI_INDEX),
        &format!("index.json of {what}"),
    )? {
        ManifestDoc::Index(index) => index,
        ManifestDoc::Manifest(_) => {
            return Err(ImageError::invalid(&what, "index.json is not an index"))
        }
    };
    let refs: Vec<String> = index
        .manifests
        .iter()
        .filter_map(|d| d.annotation(ANNOTATION_REF_NAME).map(str::to_string))
        .collect();
    // (name, entries of index.json for it): several entries for one name are platforms.
    let mut chosen: Vec<(String, Vec<&Descriptor>)> = Vec::new();
    match name {
        Some(name) => {
            let tag = name.tag.clone().unwrap_or_default();
            let full = name.to_string();
            let named: Vec<&Descriptor> = index
                .manifests
                .iter()
                .filter(|d| {
                    d.annotation(ANNOTATION_REF_NAME)
                        .is_some_and(|r| r == tag || r == full)
                        || d.annotation(ANNOTATION_CONTAINERD_NAME)
                            .is_some_and(|r| r == full)
                })
                .collect();
            let entries = if named.is_empty() && distinct_names(&index) <= 1 {
                index.manifests.iter().collect()
            } else {
                named
            };
            if entries.is_empty() {
                return Err(ImageError::invalid(
                    &what,
                    format!(
                        "it holds several images (refs: {}) and none is named {tag:?}",
                        refs.join(", ")
                    ),
                ));
            }
            chosen.push((full, entries));
        }
        None => {
            for descriptor in &index.manifests {
                let Some(image_name) = carried_name(descriptor) else {
                    continue;
                };
                let image_name = Reference::parse(&image_name)?.to_string();
                match chosen.iter_mut().find(|(n, _)| *n == image_name) {
                    Some((_, entries)) => entries.push(descriptor),
                    None => chosen.push((image_name, vec![descriptor])),
                }
            }
            if chosen.is_empty() {
                return Err(ImageError::invalid(
                    &what,
                    format!(
                        "the layout names no image (refs: {}): give a name",
                        if refs.is_empty() {
                            "none".to_string()
                        } else {
                            refs.join(", ")
                        }
                    ),
                ));
            }
        }
    }
    let mut images = Vec::new();
    for (image_name, entries) in chosen {
        let entry = if entries.len() == 1 {
            entries[0].clone()
        } else {
            let sub = Index {
                schema_version: 2,
                media_type: None,
                manifests: entries.into_iter().cloned().collect(),
            };
            select_platform(&sub, &image_name)?.clone()
        };
        images.push(import_oci_image(store, source, &image_name, &entry)?);
    }
    Ok(images)
}

/// How many different ref names index.json carries (a missing one counts as one name).
fn distinct_names(index: &Index) -> usize {
    let mut names: Vec<Option<&str>> = index
        .manifests
        .iter()
        .map(|d| d.annotation(ANNOTATION_REF_NAME))
        .collect();
    names.sort();
    names.dedup();
    names.len()
}

/// A full image name an index.json entry carries: containerd's annotation, or a ref name
/// that is a reference rather than a bare tag.
fn carried_name(descriptor: &Descriptor) -> Option<String> {
    if let Some(name) = descriptor.annotation(ANNOTATION_CONTAINERD_NAME) {
        return Some(name.to_string());
    }
    let reference = descriptor.annotation(ANNOTATION_REF_NAME)?;
    (reference.contains('/') || reference.contains(':')).then(|| reference.to_string())
}

fn import_oci_image(
    store: &ImageStore,
    source: &Source,
    name: &str,
    entry: &Descriptor,
) -> Result<Image, ImageError> {
    let what = format!("{name} in {}", source.describe());
    let top = read_blob(source, &entry.digest, &what)?;
    // (manifest digest and bytes, the index when the entry is one, the manifest)
    let (manifest_digest, manifest_bytes, index, manifest) = match parse_manifest(
        &top,
        Some(&entry.media_type),
        &format!("manifest of {what}"),
    )? {
        ManifestDoc::Manifest(manifest) => (entry.digest.clone(), top, None, manifest),
        ManifestDoc::Index(index) => {
            let chosen = select_platform(&index, name)?.clone();
            let bytes = read_blob(source, &chosen.digest, &what)?;
            match parse_manifest(
                &bytes,
                Some(&chosen.media_type),
                &format!("manifest of {what}"),
            )? {
                ManifestDoc::Manifest(manifest) => (
                    chosen.digest,
                    bytes,
                    Some((top, entry.digest.clone())),
                    manifest,
                ),
                ManifestDoc::Index(_) => {
                    return Err(ImageError::invalid(&what, "an index inside an index"))
                }
            }
        }
    };
    check_manifest(&manifest, name)?;
    let config_digest = manifest.config.digest.clone();
    let config_bytes = read_blob(source, &config_digest, &what)?;
    let config = ConfigFile::parse(
        &config_bytes,
        &format!("config of {what}"),
        manifest.layers.len(),
    )?;
    let mut blobs = vec![manifest_digest.as_str(), config_digest.as_str()];
    blobs.extend(index.as_ref().map(|(_, digest)| digest.as_str()));
    let _pins = store.pin_image(&blobs, config.diff_ids())?;
    for (layer, diff_id) in manifest.layers.iter().zip(config.diff_ids()) {
        let dest = store.layer_path(diff_id)?;
        if dest.is_dir() {
            continue;
        }
        let (reader, _) =
            source.reader(&format!("blobs/sha256/{}", digest::hex_of(&layer.digest)?))?;
        let work = store.work_dir("import")?;
        unpack::unpack_verified(
            reader,
            work.path(),
            Some(&layer.digest),
            diff_id,
            &format!("layer {} of {what}", layer.digest),
        )?;
        work.install(&dest)?;
    }
    store.write_blob(&manifest_digest, &manifest_bytes)?;
    store.write_blob(&config_digest, &config_bytes)?;
    if let Some((bytes, digest)) = &index {
        store.write_blob(digest, bytes)?;
    }
    let index_digest = index.map(|(_, digest)| digest);
    store.record(
        name,
        &manifest_digest,
        index_digest,
        &config_digest,
        &config,
    )
}

/// A small blob of an OCI layout, checked against its digest.
fn read_blob(source: &Source, digest: &str, what: &str) -> Result<Vec<u8>, ImageError> {
    let bytes = source.read_small(
        &format!("blobs/sha256/{}", digest::hex_of(digest)?),
        MAX_CONFIG,
    )?;
    verify_bytes(&format!("blob {digest} of {what}"), &bytes, digest)?;
    Ok(bytes)
}

/// The digest a blob's name states (`blobs/sha256/<hex>`, `<hex>.json`, `<hex>/layer.tar`).
fn digest_in_name(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split('/').collect();
    let candidates = [
        parts.last().map(|last| last.trim_end_matches(".json")),
        (parts.len() >= 2 && parts[parts.len() - 2] == "sha256").then(|| parts[parts.len() - 1]),
    ];
    candidates
        .into_iter()
        .flatten()
        .map(|hex| format!("{}{hex}", digest::SHA256_PREFIX))
        .find(|digest| digest::hex_of(digest).is_ok())
}

/// Digest, size and compression of a blob that need not be unpacked.
fn hash_blob(reader: impl Read, what: &str) -> Result<(String, u64, Compression), ImageError> {
    let mut hashed = HashingReader::new(reader);
    let mut magic = [0u8; 4];
    let mut sniffed = 0;
    while sniffed < magic.len() {
        match hashed.read(&mut magic[sniffed..]) {
            Ok(0) => break,
            Ok(n) => sniffed += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(ImageError::invalid_by(what, err.to_string(), err)),
        }
    }
    io::copy(&mut hashed, &mut io::sink())
        .map_err(|err| ImageError::invalid_by(what, err.to_string(), err))?;
    let compression = match magic[..sniffed] {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd] => Compression::Zstd,
        _ => Compression::None,
    };
    let (digest, size) = hashed.finish();
    Ok((digest, size, compression))
}

/// Removes a temporary file when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Where an entry of a tar archive is.
enum TarEntry {
    File { offset: u64, size: u64 },
    Link(String),
}

/// The files of an archive, by their name inside it.
enum Source {
    Dir(PathBuf),
    Tar {
        path: PathBuf,
        /// The uncompressed copy being read (same as `path` when it was not compressed).
        file: PathBuf,
        entries: HashMap<String, TarEntry>,
        _decompressed: Option<TempFile>,
    },
}

impl Source {
    fn open(store: &ImageStore, path: &Path) -> Result<Source, ImageError> {
        let meta = fs::metadata(path).map_err(ImageError::io("cannot import", path))?;
        if meta.is_dir() {
            return Ok(Source::Dir(path.to_path_buf()));
        }
        let what = format!("archive {}", path.display());
        let mut file = File::open(path).map_err(ImageError::io("cannot open", path))?;
        let mut magic = [0u8; 4];
        let sniffed = file
            .read(&mut magic)
            .map_err(ImageError::io("cannot read", path))?;
        file.seek(SeekFrom::Start(0))
            .map_err(ImageError::io("cannot read", path))?;
        // Random access needs a plain tar: a compressed one is decompressed to tmp/ first.
        let decoder: Option<Box<dyn Read>> = if magic[..sniffed].starts_with(&[0x1f, 0x8b]) {
            Some(Box::new(MultiGzDecoder::new(file)))
        } else if magic[..sniffed] == [0x28, 0xb5, 0x2f, 0xfd] {
            Some(Box::new(zstd::stream::read::Decoder::new(file).map_err(
                |err| ImageError::invalid_by(&what, err.to_string(), err),
            )?))
        } else {
            None
        };
        let (file, decompressed) = match decoder {
            Some(mut decoder) => {
                let tmp = TempFile(store.work_path("import.tar"));
                let mut out =
                    File::create(&tmp.0).map_err(ImageError::io("cannot create", &tmp.0))?;
                io::copy(&mut decoder, &mut out).map_err(|err| {
                    ImageError::invalid_by(&what, format!("cannot decompress: {err}"), err)
                })?;
                (tmp.0.clone(), Some(tmp))
            }
            None => (path.to_path_buf(), None),
        };
        let entries = index_tar(&file, &what)?;
        Ok(Source::Tar {
            path: path.to_path_buf(),
            file,
            entries,
            _decompressed: decompressed,
        })
    }

    fn describe(&self) -> String {
        match self {
            Source::Dir(path) => format!("directory {}", path.display()),
            Source::Tar { path, .. } => format!("archive {}", path.display()),
        }
    }

    fn exists(&self, name: &str) -> bool {
        match self {
            Source::Dir(dir) => normalize(name).is_some_and(|name| dir.join(name).is_file()),
            Source::Tar { .. } => self.locate(name).is_ok(),
        }
    }

    /// The entry `name` resolves to, following links inside the archive.
    fn locate(&self, name: &str) -> Result<(u64, u64), ImageError> {
        let Source::Tar { entries, .. } = self else {
            return Err(ImageError::invalid(self.describe(), "not a tar"));
        };
        let missing = || ImageError::invalid(self.describe(), format!("it has no file {name}"));
        let mut current = normalize(name).ok_or_else(missing)?;
        for _ in 0..MAX_LINK_HOPS {
            match entries.get(&current) {
                Some(TarEntry::File { offset, size }) => return Ok((*offset, *size)),
                Some(TarEntry::Link(target)) => current = target.clone(),
                None => return Err(missing()),
            }
        }
        Err(ImageError::invalid(
            self.describe(),
            format!("{name}: too many links"),
        ))
    }

    /// A reader of the file `name` and its size.
    fn reader(&self, name: &str) -> Result<(Box<dyn Read + '_>, u64), ImageError> {
        match self {
            Source::Dir(dir) => {
                let relative = normalize(name).ok_or_else(|| {
                    ImageError::invalid(self.describe(), format!("bad file name {name:?}"))
                })?;
                let path = dir.join(relative);
                let file = File::open(&path).map_err(ImageError::io("cannot open", &path))?;
                let size = file
                    .metadata()
                    .map_err(ImageError::io("cannot open", &path))?
                    .len();
                Ok((Box::new(file), size))
            }
            Source::Tar { file, .. } => {
                let (offset, size) = self.locate(name)?;
                let mut reader = File::open(file).map_err(ImageError::io("cannot open", file))?;
                reader
                    .seek(SeekFrom::Start(offset))
                    .map_err(ImageError::io("cannot read", file))?;
                Ok((Box::new(reader.take(size)), size))
            }
        }
    }

    /// A whole file of at most `limit` bytes.
    fn read_small(&self, name: &str, limit: usize) -> Result<Vec<u8>, ImageError> {
        let (reader, size) = self.reader(name)?;
        if size > limit as u64 {
            return Err(ImageError::invalid(
                self.describe(),
                format!("{name} is larger than {limit} bytes"),
            ));
        }
        let mut bytes = Vec::new();
        reader
            .take(limit as u64)
            .read_to_end(&mut bytes)
            .map_err(|err| {
                ImageError::invalid_by(self.describe(), format!("cannot read {name}: {err}"), err)
            })?;
        Ok(bytes)
    }
}

/// Offsets of the files in a plain tar, and where its links point.
fn index_tar(path: &Path, what: &str) -> Result<HashMap<String, TarEntry>, ImageError> {
    let bad = |err: io::Error| ImageError::invalid_by(what, format!("not a valid tar: {err}"), err);
    let file = File::open(path).map_err(ImageError::io("cannot open", path))?;
    let mut archive = tar::Archive::new(file);
    let mut entries = HashMap::new();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        let raw = entry.path().map_err(bad)?.to_string_lossy().to_string();
        let Some(name) = normalize(&raw) else {
            continue;
        };
        let kind = entry.header().entry_type();
        let link = || -> Result<Option<String>, ImageError> {
            Ok(entry
                .link_name()
                .map_err(bad)?
                .map(|l| l.to_string_lossy().to_string()))
        };
        if kind.is_file() || kind == tar::EntryType::Continuous {
            entries.insert(
                name,
                TarEntry::File {
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                },
            );
        } else if kind.is_symlink() {
            // Relative to the link's directory (docker save links duplicate layers as
            // `../<id>/layer.tar`), resolved without leaving the archive.
            if let Some(target) = link()? {
                let base = name.rsplit_once('/').map_or("", |(dir, _)| dir);
                let joined = if target.starts_with('/') {
                    target
                } else {
                    format!("{base}/{target}")
                };
                if let Some(resolved) = normalize(&joined) {
                    entries.insert(name, TarEntry::Link(resolved));
                }
            }
        } else if kind.is_hard_link() {
            if let Some(resolved) = link()?.as_deref().and_then(normalize) {
                entries.insert(name, TarEntry::Link(resolved));
            }
        }
    }
    Ok(entries)
}

/// An archive-relative name without `.` and empty components, `..` resolved lexically;
/// `None` when it is empty or climbs out of the archive.
fn normalize(name: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_archive_names() {
        assert_eq!(
            normalize("./manifest.json").as_deref(),
            Some("manifest.json")
        );
        assert_eq!(
            normalize("abc/../def/layer.tar").as_deref(),
            Some("def/layer.tar")
        );
        assert_eq!(
            normalize("/blobs//sha256/x").as_deref(),
            Some("blobs/sha256/x")
        );
        assert_eq!(normalize("../etc/passwd"), None);
        assert_eq!(normalize("."), None);
    }

    #[test]
    fn digests_in_names() {
        let hex = "a".repeat(64);
        assert_eq!(
            digest_in_name(&format!("blobs/sha256/{hex}")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(
            digest_in_name(&format!("{hex}.json")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(digest_in_name(&format!("{hex}/layer.tar")), None);
        assert_eq!(digest_in_name("config.json"), None);
    }
}
