//! The JSON documents of an image: manifests, indexes (manifest lists) and configs, in
//! both the OCI and the Docker v2 schema 2 flavours, which share one shape.
//!
//! These are our own lenient serde types rather than a full spec model: registries and
//! tools in the wild omit optional fields or add their own, and the store needs only a
//! few fields. What it cannot use (schema 1 manifests, non-image artifacts, Windows
//! layers) is refused here with [`ImageError::UnsupportedMediaType`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ImageConfig, ImageError};

/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker v2 schema 2 manifest.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list.
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// OCI image config.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Docker image config.
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// Uncompressed OCI layer.
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Gzip OCI layer.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Zstd OCI layer.
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// Docker layer (always gzip in practice).
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Uncompressed Docker layer, as some tools write it.
pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
/// The `Accept` header of manifest requests: every kind we can read. A registry that is
/// not told it may answer OCI serves something else or nothing.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";
/// The only platform sandboxes run on.
pub const PLATFORM_OS: &str = "linux";
/// See [`PLATFORM_OS`].
pub const PLATFORM_ARCH: &str = "amd64";
/// OCI layout annotation naming a manifest (a tag, per the OCI spec).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// containerd's annotation with the full image name.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// A pointer to content: media type, digest and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the content.
    #[serde(default)]
    pub media_type: String,
    /// `sha256:...` digest.
    pub digest: String,
    /// Size in bytes.
    #[serde(default)]
    pub size: u64,
    /// Platform, on index entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// External URLs (foreign layers); the store does not fetch those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
}

impl Descriptor {
    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// Platform of an index entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU architecture (`amd64`).
    #[serde(default)]
    pub architecture: String,
    /// Operating system (`linux`).
    #[serde(default)]
    pub os: String,
    /// CPU variant (`v8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image manifest: a config and layers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// Media type, when the document states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config.
    pub config: Descriptor,
    /// Layers, bottom first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// An image index (manifest list): one manifest per platform.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// Always 2.
    #[serde(default)]
    pub schema_version: u32,
    /// Media type, when the document states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// The parts of an image config file the store reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigFile {
    /// CPU architecture.
    #[serde(default)]
    pub architecture: Option<String>,
    /// Operating system.
    #[serde(default)]
    pub os: Option<String>,
    /// The run config.
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// Layer diff IDs.
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// The `config` object of an image config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `KEY=value` entries.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// Working directory.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// User.
    #[serde(default)]
    pub user: Option<String>,
    /// Entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Cmd.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
}

/// The `rootfs` object of an image config file.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    /// Digests of the uncompressed layers, bottom first.
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

impl ConfigFile {
    /// Parses a config blob and checks it describes `layers` layers.
    pub fn parse(bytes: &[u8], what: &str, layers: usize) -> Result<ConfigFile, ImageError> {
        let config: ConfigFile = serde_json::from_slice(bytes).map_err(|err| {
            ImageError::invalid_by(what, format!("config is not valid JSON: {err}"), err)
        })?;
        let diff_ids = config.diff_ids().len();
        if diff_ids != layers {
            return Err(ImageError::invalid(
                what,
                format!("the config lists {diff_ids} layer diff_ids but the manifest has {layers} layers"),
            ));
        }
        Ok(config)
    }

    /// Layer diff IDs, bottom first.
    pub fn diff_ids(&self) -> &[String] {
        self.rootfs.as_ref().map_or(&[], |rootfs| &rootfs.diff_ids)
    }

    /// The run config a sandbox needs.
    pub fn image_config(&self) -> ImageConfig {
        let run = self.config.clone().unwrap_or_default();
        ImageConfig {
            env: run.env.unwrap_or_default(),
            working_dir: run.working_dir.filter(|dir| !dir.is_empty()),
            user: run.user.filter(|user| !user.is_empty()),
            entrypoint: run.entrypoint.unwrap_or_default(),
            cmd: run.cmd.unwrap_or_default(),
        }
    }
}

/// A manifest document of either kind.
#[derive(Debug, Clone)]
pub enum ManifestDoc {
    /// A single-platform image.
    Manifest(Manifest),
    /// A multi-platform index.
    Index(Index),
}

/// Parses a manifest document. The kind comes from the `Content-Type` the registry sent
/// if it is a manifest type, else from the document's own `mediaType`, else from its
/// shape (OCI allows both to be absent).
pub fn parse_manifest(
    bytes: &[u8],
    content_type: Option<&str>,
    what: &str,
) -> Result<ManifestDoc, ImageError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|err| {
        ImageError::invalid_by(what, format!("manifest is not valid JSON: {err}"), err)
    })?;
    let declared = value.get("mediaType").and_then(|v| v.as_str());
    let header = content_type
        .map(|ct| ct.split(';').next().unwrap_or(ct).trim())
        .filter(|ct| is_manifest_type(ct));
    let media_type = match header.or(declared) {
        Some(media_type) => media_type.to_string(),
        None if value.get("manifests").is_some() => OCI_INDEX.to_string(),
        None if value.get("config").is_some() => OCI_MANIFEST.to_string(),
        None => {
            let schema = value.get("schemaVersion").and_then(|v| v.as_u64());
            return Err(ImageError::UnsupportedMediaType {
                what: what.to_string(),
                media_type: match (schema, content_type) {
                    (Some(1), _) => "docker schema 1 manifest".to_string(),
                    (_, Some(ct)) => ct.to_string(),
                    _ => "unknown".to_string(),
                },
            });
        }
    };
    let bad = |err: serde_json::Error| {
        ImageError::invalid_by(what, format!("malformed {media_type}: {err}"), err)
    };
    match media_type.as_str() {
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let manifest: Manifest = serde_json::from_value(value.clone()).map_err(bad)?;
            if manifest.schema_version != 2 {
                return Err(ImageError::invalid(
                    what,
                    format!("schemaVersion {} (expected 2)", manifest.schema_version),
                ));
            }
            Ok(ManifestDoc::Manifest(manifest))
        }
        OCI_INDEX | DOCKER_MANIFEST_LIST => Ok(ManifestDoc::Index(
            serde_json::from_value(value.clone()).map_err(bad)?,
        )),
        other => Err(ImageError::UnsupportedMediaType {
            what: what.to_string(),
            media_type: other.to_string(),
        }),
    }
}

fn is_manifest_type(media_type: &str) -> bool {
    matches!(
        media_type,
        OCI_MANIFEST | OCI_INDEX | DOCKER_MANIFEST | DOCKER_MANIFEST_LIST
    ) || media_type.starts_with("application/vnd.docker.distribution.manifest.v1")
}

/// Picks the linux/amd64 entry of an index.
pub fn select_platform<'a>(
    index: &'a Index,
    reference: &str,
) -> Result<&'a Descriptor, ImageError> {
    let matches = |d: &&Descriptor| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == PLATFORM_OS && p.architecture == PLATFORM_ARCH)
    };
    if let Some(found) = index.manifests.iter().find(matches) {
        return Ok(found);
    }
    let available: Vec<String> = index
        .manifests
        .iter()
        .map(|d| match &d.platform {
            Some(p) => match &p.variant {
                Some(variant) => format!("{}/{}/{variant}", p.os, p.architecture),
                None => format!("{}/{}", p.os, p.architecture),
            },
            None => format!("{} without platform", d.digest),
        })
        .collect();
    Err(ImageError::NoMatchingPlatform {
        reference: reference.to_string(),
        available: if available.is_empty() {
            "nothing".to_string()
        } else {
            available.join(", ")
        },
    })
}

/// Checks that a manifest's config is an image config (not some other OCI artifact).
pub fn check_config_type(descriptor: &Descriptor, what: &str) -> Result<(), ImageError> {
    match descriptor.media_type.as_str() {
        OCI_CONFIG | DOCKER_CONFIG | "" => Ok(()),
        other => Err(ImageError::UnsupportedMediaType {
            what: format!("config of {what}"),
            media_type: other.to_string(),
        }),
    }
}

/// Checks that a layer is a tar the store can unpack (any compression is sniffed from
/// its first bytes later); foreign layers with external URLs are refused.
pub fn check_layer_type(descriptor: &Descriptor, what: &str) -> Result<(), ImageError> {
    let supported = matches!(
        descriptor.media_type.as_str(),
        OCI_LAYER_TAR | OCI_LAYER_GZIP | OCI_LAYER_ZSTD | DOCKER_LAYER_GZIP | DOCKER_LAYER_TAR
    );
    let foreign = descriptor
        .urls
        .as_ref()
        .is_some_and(|urls| !urls.is_empty());
    if supported && !foreign {
        Ok(())
    } else {
        Err(ImageError::UnsupportedMediaType {
            what: format!("layer {} of {what}", descriptor.digest),
            media_type: descriptor.media_type.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest that is no JSON says so in the words it always did, with serde_json's
    /// error kept under it.
    #[test]
    fn a_manifest_that_is_no_json_keeps_the_parser_error_as_the_source() {
        let json = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let e = parse_manifest(b"{", None, "manifest of x").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid manifest of x: manifest is not valid JSON: {json}")
        );
        let cause = e
            .cause()
            .and_then(|c| c.downcast_ref::<serde_json::Error>());
        assert_eq!(cause.map(ToString::to_string), Some(json.to_string()));
        assert!(std::error::Error::source(&e).is_some());
    }

    fn descriptor(os: &str, arch: &str) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: format!(
                "sha256:{}",
                if arch == "amd64" { "a" } else { "b" }.repeat(64)
            ),
            size: 1,
            platform: Some(Platform {
                architecture: arch.into(),
                os: os.into(),
                variant: None,
            }),
            annotations: None,
            urls: None,
        }
    }

    #[test]
    fn kinds_from_header_field_or_shape() {
        let manifest = br#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:x","size":1},"layers":[]}"#;
        assert!(matches!(
            parse_manifest(manifest, None, "m"),
            Ok(ManifestDoc::Manifest(_))
        ));
        assert!(matches!(
            parse_manifest(
                manifest,
                Some("application/vnd.docker.distribution.manifest.v2+json; charset=utf-8"),
                "m"
            ),
            Ok(ManifestDoc::Manifest(_))
        ));
        let index = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(
            parse_manifest(index, Some("application/json"), "m"),
            Ok(ManifestDoc::Index(_))
        ));
        let list = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json","manifests":[]}"#;
        assert!(matches!(
            parse_manifest(list, None, "m"),
            Ok(ManifestDoc::Index(_))
        ));
        let schema1 = br#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
        assert!(matches!(
            parse_manifest(schema1, None, "m"),
            Err(ImageError::UnsupportedMediaType { .. })
        ));
        let artifact = br#"{"schemaVersion":2,"mediaType":"application/vnd.cncf.helm.chart"}"#;
        assert!(matches!(
            parse_manifest(artifact, None, "m"),
            Err(ImageError::UnsupportedMediaType { .. })
        ));
        assert!(matches!(
            parse_manifest(b"{", None, "m"),
            Err(ImageError::Invalid { .. })
        ));
    }

    #[test]
    fn selects_amd64() {
        let index = Index {
            schema_version: 2,
            media_type: None,
            manifests: vec![descriptor("linux", "arm64"), descriptor("linux", "amd64")],
        };
        assert_eq!(
            select_platform(&index, "x").unwrap().digest,
            index.manifests[1].digest
        );
        let arm_only = Index {
            manifests: vec![descriptor("linux", "arm64"), descriptor("windows", "amd64")],
            ..index
        };
        match select_platform(&arm_only, "x") {
            Err(ImageError::NoMatchingPlatform { available, .. }) => {
                assert_eq!(available, "linux/arm64, windows/amd64")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn layer_and_config_types() {
        let mut layer = descriptor("linux", "amd64");
        for ok in [
            OCI_LAYER_GZIP,
            OCI_LAYER_ZSTD,
            OCI_LAYER_TAR,
            DOCKER_LAYER_GZIP,
        ] {
            layer.media_type = ok.into();
            assert!(check_layer_type(&layer, "x").is_ok());
        }
        layer.media_type = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip".into();
        assert!(check_layer_type(&layer, "x").is_err());
        layer.media_type = OCI_LAYER_GZIP.into();
        layer.urls = Some(vec!["https://example.com/x".into()]);
        assert!(check_layer_type(&layer, "x").is_err());
        layer.media_type = "application/vnd.cncf.helm.config.v1+json".into();
        assert!(check_config_type(&layer, "x").is_err());
    }

    #[test]
    fn config_to_image_config() {
        let bytes = br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["sh"],"Entrypoint":null,"WorkingDir":"","User":"1000"},"rootfs":{"type":"layers","diff_ids":["sha256:a"]}}"#;
        let config = ConfigFile::parse(bytes, "c", 1).unwrap();
        assert_eq!(
            config.image_config(),
            ImageConfig {
                env: vec!["PATH=/bin".into()],
                working_dir: None,
                user: Some("1000".into()),
                entrypoint: vec![],
                cmd: vec!["sh".into()],
            }
        );
        assert!(ConfigFile::parse(bytes, "c", 2).is_err());
    }
}
