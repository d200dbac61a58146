//! The image store (placeholder: being written). [`Image`] is what the store hands to a
//! backend: unpacked layer directories, bottom first, and the image's run config.

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
