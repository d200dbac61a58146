//! What can go wrong in the image store, worded for the person who asked for the image.
//!
//! [`ImageError`] is `Clone` because one pull can have many waiters (concurrent pulls of
//! the same image share one download, and each waiter gets the outcome), so the I/O
//! errors it carries are held in an `Arc`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why an image could not be pulled, imported, found or removed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    /// The reference is not a valid image name.
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No registry tried knows the image, or the store does not hold it.
    #[error("unknown image {reference}{}", tried_list(tried))]
    UnknownImage {
        /// The normalised reference.
        reference: String,
        /// The endpoints asked and what each answered (empty for the local store).
        tried: Vec<String>,
    },
    /// The registry refused the credentials, or asked for some and none were configured.
    #[error("authentication to {registry} failed: {reason}")]
    AuthFailed {
        /// The registry endpoint.
        registry: String,
        /// What happened.
        reason: String,
    },
    /// Content did not hash to the digest that names it.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Which blob (or uncompressed layer) it was.
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// A manifest, config or layer of a kind the store cannot use.
    #[error("unsupported media type {media_type:?} for {what}")]
    UnsupportedMediaType {
        /// What carried it.
        what: String,
        /// The media type.
        media_type: String,
    },
    /// A multi-platform image without a linux/amd64 variant.
    #[error("image {reference} has no linux/amd64 variant (it has: {available})")]
    NoMatchingPlatform {
        /// The normalised reference.
        reference: String,
        /// The platforms it offers, comma-separated.
        available: String,
    },
    /// No endpoint (mirror or upstream) could be reached.
    #[error("registry unreachable for {reference}: tried {}", tried.join("; "))]
    Unreachable {
        /// The normalised reference.
        reference: String,
        /// Each endpoint tried and its error.
        tried: Vec<String>,
    },
    /// A registry answered with an unexpected status.
    #[error("registry {endpoint} answered {status} for {url}: {message}")]
    Registry {
        /// The endpoint.
        endpoint: String,
        /// The URL requested.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The registry's error message, if any.
        message: String,
    },
    /// A manifest, config, archive or layer is malformed or unsafe.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid.
        what: String,
        /// Why.
        reason: String,
    },
    /// A file system operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// What the OS said.
        source: Arc<io::Error>,
    },
}

fn tried_list(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!(" (tried {})", tried.join("; "))
    }
}

impl ImageError {
    /// Wraps an I/O error with what was being done and where.
    pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
        let path = path.to_path_buf();
        move |source| ImageError::Io {
            what,
            path,
            source: Arc::new(source),
        }
    }

    /// An [`ImageError::Invalid`].
    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> ImageError {
        ImageError::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

/// An error and its sources on one line: reqwest's own message alone ("error sending
/// request") hides the cause (connection refused, DNS, TLS) a person needs to see.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
