//! What the file operations share: this capability's state ([`Files`]), client paths
//! and modes, the common errors, and the names of temporary files.

use std::path::{Component, Path, PathBuf};

use orchard_protocol::ErrorCode;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};

/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Prefix of the temporary files writes go through.
pub const TEMP_PREFIX: &str = ".orchard-tmp-";
/// Size of the chunks files are streamed in.
pub(super) const CHUNK: usize = 64 * 1024;
/// Mode of written files when none is given.
pub(super) const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of created directories when none is given.
pub(super) const DEFAULT_DIR_MODE: u32 = 0o755;

/// The files capability's state: the largest uploaded file or archive, in bytes
/// (`--max-upload-bytes`). Everything else a file operation needs is in its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Files {
    /// Largest uploaded file or archive in bytes.
    pub max_upload_bytes: u64,
}

/// A query naming one path.
#[derive(Deserialize)]
pub(super) struct PathQuery {
    pub(super) path: String,
}

/// Parses a client path: it must be absolute. The result has no `.` components,
/// repeated or trailing slashes; a trailing slash would make the kernel follow a final
/// symbolic link, which remove and stat must never do.
pub fn absolute(raw: &str) -> ApiResult<PathBuf> {
    if !raw.starts_with('/') {
        return Err(ApiError::invalid(format!(
            "path must be absolute, got {raw:?}"
        )));
    }
    if raw.contains('\0') {
        return Err(ApiError::invalid("path must not contain a NUL byte"));
    }
    Ok(Path::new(raw).components().collect())
}

/// Whether `path` names `/`, also through `..` (which is `/` at the top).
pub(super) fn is_root(path: &Path) -> bool {
    let mut depth = 0usize;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth = depth.saturating_sub(1),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    depth == 0
}

/// Parses an octal mode such as `755` or `0644`.
pub fn parse_mode(raw: Option<&str>) -> ApiResult<u32> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_FILE_MODE);
    };
    let digits = raw.strip_prefix("0o").unwrap_or(raw);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o7777 && !digits.is_empty() => Ok(mode),
        _ => Err(ApiError::invalid(format!(
            "mode must be octal permission bits such as 644 or 755, got {raw:?}"
        ))),
    }
}

pub(super) fn check_mode(mode: u32) -> ApiResult<u32> {
    if mode > 0o7777 {
        return Err(ApiError::invalid(format!(
            "mode must be permission bits (at most 0o7777), got {mode:#o}"
        )));
    }
    Ok(mode)
}

pub(super) fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("request body is larger than the limit of {limit} bytes"),
    )
}

pub(super) fn unreadable_body() -> ApiError {
    ApiError::invalid("the request body could not be read")
}

pub(super) fn blocking_failed(what: &str) -> ApiError {
    ApiError::new(ErrorCode::Internal, format!("{what} stopped unexpectedly"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute_and_are_normalized() {
        assert_eq!(
            absolute("relative/x").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(absolute("").unwrap_err().code, ErrorCode::InvalidArgument);
        assert_eq!(
            absolute("/a\0b").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(absolute("/a//b/./c/").unwrap(), PathBuf::from("/a/b/c"));
        assert!(is_root(&absolute("/").unwrap()));
        assert!(is_root(&absolute("//./").unwrap()));
        assert!(is_root(&absolute("/a/..").unwrap()));
        assert!(is_root(&absolute("/../..").unwrap()));
        assert!(!is_root(&absolute("/a").unwrap()));
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode(None).unwrap(), 0o644);
        assert_eq!(parse_mode(Some("755")).unwrap(), 0o755);
        assert_eq!(parse_mode(Some("0600")).unwrap(), 0o600);
        assert_eq!(parse_mode(Some("0o4755")).unwrap(), 0o4755);
        for bad in ["", "9", "rwx", "77777", "-1"] {
            assert_eq!(
                parse_mode(Some(bad)).unwrap_err().code,
                ErrorCode::InvalidArgument
            );
        }
    }
}
