//! What can go wrong in the image store, worded for the person who asked for the image.
//!
//! [`ImageError`] is `Clone` because one pull can have many waiters (concurrent pulls of
//! the same image share one download, and each waiter gets the outcome), so the errors
//! it carries as its source (I/O, HTTP, JSON, a thread's) are held in an `Arc`.
//!
//! The message of each variant says what the person needs, quoting the cause where it
//! helps; the cause itself, where there is one, is the variant's `#[source]`, for the
//! log and for callers that decide on its type ([`ImageError::cause`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The error under an [`ImageError`], of whatever type it has, shared as the error is.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

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
        /// The error that made it fail, when one did (a token realm that is no URL, a
        /// token answer that is no JSON); none for a refusal.
        #[source]
        source: Option<Cause>,
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
        /// The last transport error among the endpoints tried, when one failed at the
        /// transport (a 5xx or 429 has none). One error only, while `tried` names
        /// every endpoint: the last is the freshest word on why none answered. It may
        /// say more than `tried` does (a refused port, where the message says only
        /// "could not connect": see [`crate::targets::connect_failure`]): it is for the
        /// log, never for the one who asked.
        #[source]
        source: Option<Cause>,
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
        /// The error of the parser, reader or task that found it, when one did.
        #[source]
        source: Option<Cause>,
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
            source: None,
        }
    }

    /// An [`ImageError::Invalid`] found by `source`'s error (which `reason` may quote).
    pub(crate) fn invalid_by(
        what: impl Into<String>,
        reason: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> ImageError {
        ImageError::Invalid {
            what: what.into(),
            reason: reason.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The error under this one, as its own type: `source()` answers the shared handle
    /// ([`Cause`], an `Arc`), which does not downcast to what it holds.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            ImageError::AuthFailed { source, .. }
            | ImageError::Unreachable { source, .. }
            | ImageError::Invalid { source, .. } => source.as_deref(),
            ImageError::Io { source, .. } => Some(&**source),
            // Facts found by the store itself, with no error under them.
            ImageError::InvalidReference { .. }
            | ImageError::UnknownImage { .. }
            | ImageError::DigestMismatch { .. }
            | ImageError::UnsupportedMediaType { .. }
            | ImageError::NoMatchingPlatform { .. }
            | ImageError::Registry { .. } => None,
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
