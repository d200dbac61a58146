//! Why an archive could not be extracted or built, and how that reaches a client.

use std::io;
use std::path::Path;

use orchard_protocol::ErrorCode;

use crate::error::ApiError;

/// Why an archive could not be extracted or built.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// An entry would land outside the target or write through a link.
    #[error("archive entry {entry}: {reason}")]
    UnsafePath {
        /// The entry's name as stored in the archive.
        entry: String,
        /// Why it was refused.
        reason: String,
    },
    /// The archive is corrupt, truncated, or has entries of an unsupported type.
    #[error("invalid archive: {0}")]
    Invalid(String),
    /// The archive has a directory where the target has something else.
    #[error("cannot extract directory {0}: it exists and is not a directory")]
    NotADirectory(String),
    /// The archive has a non-directory where the target has a directory.
    #[error("cannot extract {0}: a directory exists there")]
    IsADirectory(String),
    /// A filesystem operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path it was done on.
        path: String,
        /// What the OS said.
        source: io::Error,
    },
}

impl ArchiveError {
    pub(super) fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ArchiveError {
        let path = path.display().to_string();
        move |source| ArchiveError::Io { what, path, source }
    }

    pub(super) fn unsafe_path(entry: &str, reason: impl Into<String>) -> Self {
        ArchiveError::UnsafePath {
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }
}

impl From<ArchiveError> for ApiError {
    fn from(err: ArchiveError) -> Self {
        let code = match &err {
            ArchiveError::UnsafePath { .. } => ErrorCode::UnsafePath,
            ArchiveError::Invalid(_) => ErrorCode::InvalidArchive,
            ArchiveError::NotADirectory(_) => ErrorCode::NotADirectory,
            ArchiveError::IsADirectory(_) => ErrorCode::IsADirectory,
            ArchiveError::Io { what, path, source } => return ApiError::io(what, path, source),
        };
        ApiError::new(code, err.to_string())
    }
}

/// An input that is not a readable archive.
pub(super) fn invalid(err: io::Error) -> ArchiveError {
    ArchiveError::Invalid(crate::error::describe_io(&err))
}
