//! What can be wrong with a configuration: a leaf every part of `config` answers with.

use std::path::PathBuf;

use crate::image::credentials::CredentialsError;

/// A configuration problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A value is not valid.
    #[error("{0}")]
    Invalid(String),
    /// A value chooses a part this build left out (a Cargo feature of the `orchard`
    /// crate, on by default).
    #[error(
        "{setting}: this orchard was built without the `{feature}` feature; build it with \
         `cargo build -p orchard --features {feature}` (on by default) or use {instead}"
    )]
    NotCompiled {
        /// The setting and its value, as written (`backend "kubernetes"`).
        setting: String,
        /// The missing feature.
        feature: &'static str,
        /// What this build offers instead.
        instead: &'static str,
    },
    /// Registry credentials could not be loaded.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}
