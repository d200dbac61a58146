//! What a file system holds and has free, asked with `statvfs`: the image store's and
//! the snapshots' budgets given as a percentage, the snapshots' free-space reserve, and
//! the room left on a sandbox's own disk for an upload.

use std::path::Path;

/// Size of the file system holding `path`, in bytes; `None` when it cannot be asked.
pub fn size(path: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(path).ok()?;
    Some(stat.f_blocks.saturating_mul(stat.f_frsize))
}

/// Bytes an unprivileged writer may still write on the file system holding `path`
/// (`f_bavail`: the blocks reserved for root are not counted, so the answer holds
/// whoever writes); `None` when it cannot be asked.
pub fn free(path: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(path).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_system_has_a_size_and_at_most_that_free() {
        let dir = tempfile::tempdir().unwrap();
        let size = super::size(dir.path()).unwrap();
        let free = super::free(dir.path()).unwrap();
        assert!(size > 0 && free <= size, "{free} of {size}");
        assert_eq!(super::size(&dir.path().join("missing")), None);
    }
}
