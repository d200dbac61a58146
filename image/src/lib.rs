//! `orchard-image`, the image store: pulls images from OCI/Docker registries (with mirrors and token
//! auth) and imports `docker save` archives and OCI layouts into a content-addressed
//! store of unpacked layers, each usable as an overlayfs lower dir. [`Image`] is what the
//! store hands to a backend: unpacked layer directories, bottom first, and the image's
//! run config.
//!
//! ```no_run
//! # async fn example() -> Result<(), orchard_image::ImageError> {
//! use orchard_image::{ImageStore, StoreConfig};
//! let mut config = StoreConfig::default();
//! config.mirrors.insert("docker.io".into(), vec!["http://127.0.0.1:5000".into()]);
//! let store = ImageStore::open("/var/lib/orchard/images", config)?;
//! let image = store.pull("python:3.11-slim", |p| eprintln!("{}/{} layers", p.layers_done, p.layers_total)).await?;
//! println!("{} has {} layers", image.reference, image.layers.len());
//! # Ok(()) }
//! ```
//!
//! - [`reference`]: names, normalised like Docker (`busybox` is `docker.io/library/busybox:latest`).
//! - [`registry`]: the distribution API client (mirrors, Bearer and Basic auth).
//! - [`manifest`]: manifests, indexes and configs.
//! - [`unpack`]: one layer tar into one directory, whiteouts as overlayfs wants them.
//! - [`store`]: the store, its on-disk layout and its locking; `import`: archives, over
//!   the store's methods.
//! - [`config`]: [`StoreConfig`], how the store reaches registries.
//! - [`credentials`]: [`Credentials`], from Docker `config.json` and `HOST=USER:PASSWORD`.
//! - [`gc`]: keeping the store under a disk budget.
//! - [`targets`]: which hosts a pull may reach.
//!
//! Imports run one way (`scripts/import-cycles.py` in `make lint` fails on a circle):
//! `import` and `gc` sit over the store and use only [`ImageStore`]'s methods; the
//! store sits over `registry`, `unpack`, `manifest`, `reference` and `digest`.
//!
//! Two leaves the rest of the orchestrator shares, here because the store is the
//! lowest crate that needs them (the `orchard` crate re-exports both at its root):
//!
//! - [`egress`]: which addresses egress may not reach, for pulls and sandboxes alike.
//! - [`diskspace`]: what a file system holds and has free (`statvfs`).

pub mod config;
pub mod credentials;
pub mod digest;
pub mod diskspace;
pub mod egress;
mod error;
pub mod gc;
mod import;
pub mod manifest;
pub mod reference;
pub mod registry;
pub mod store;
pub mod targets;
pub mod unpack;

pub use config::StoreConfig;
pub use credentials::Credentials;
pub use error::{Cause, ImageError};
pub use reference::Reference;
pub use store::{GcReport, ImageStore, Progress};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The parts of an image config a sandbox needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=value` entries.
    pub env: Vec<String>,
    /// Working directory, if set.
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`, if set.
    pub user: Option<String>,
    /// Entrypoint, if set.
    pub entrypoint: Vec<String>,
    /// Cmd, if set.
    pub cmd: Vec<String>,
}

/// An image ready to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// The name it was pulled or imported as, normalised (`docker.io/library/python:3.11-slim`).
    pub reference: String,
    /// Digest of its manifest (`sha256:...`).
    pub digest: String,
    /// Unpacked layer directories, bottom layer first; overlayfs lower dirs.
    pub layers: Vec<PathBuf>,
    /// Its run config.
    pub config: ImageConfig,
}
