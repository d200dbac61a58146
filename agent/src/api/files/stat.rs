//! `GET /v1/files/stat` and `GET /v1/files/list`: metadata read without following
//! symbolic links, and listings depth first.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use axum::Json;
use orchard_protocol::files::{FileKind, FileList, FileStat};
use orchard_protocol::ErrorCode;
use serde::Deserialize;

use super::common::{absolute, blocking_failed, PathQuery, MAX_LIST_ENTRIES};
use super::guard;
use crate::api::extract::ApiQuery;
use crate::error::{ApiError, ApiResult};
use crate::pid1::fsuser;

#[derive(Deserialize)]
pub(super) struct ListQuery {
    path: String,
    depth: Option<u32>,
}

fn modified_ms(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1000)
        .saturating_add(meta.mtime_nsec() / 1_000_000)
}

fn kind_of(meta: &Metadata) -> FileKind {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Directory
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// The wire stat of `path`, whose metadata was read without following links.
fn file_stat(shown: String, path: &Path, meta: &Metadata) -> FileStat {
    let link_target = if meta.file_type().is_symlink() {
        fs::read_link(path).ok()
    } else {
        None
    };
    stat_with_target(shown, path, meta, link_target)
}

/// [`file_stat`] with the link's target already read.
fn stat_with_target(
    shown: String,
    path: &Path,
    meta: &Metadata,
    link_target: Option<PathBuf>,
) -> FileStat {
    let link_target = link_target.map(|target| target.to_string_lossy().into_owned());
    FileStat {
        name: path
            .file_name()
            .map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned()),
        path: shown,
        kind: kind_of(meta),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        modified_ms: modified_ms(meta),
        link_target,
    }
}

pub(super) async fn stat_path(ApiQuery(q): ApiQuery<PathQuery>) -> ApiResult<Json<FileStat>> {
    let path = absolute(&q.path)?;
    // As the image's user (see `fsuser`): the directories on the way are searched
    // with the user's rights, so a planted link into a root-only directory does not
    // reveal what is inside it.
    // Resolved by `guard` (no /proc magic link, not the agent's own entries), then
    // read from that descriptor, link target included.
    fsuser::blocking(move || {
        let io_err = |err: io::Error| ApiError::io("stat", &q.path, &err);
        let fd = guard::resolve(&path, false).map_err(io_err)?;
        let meta = fs::File::from(fd.try_clone().map_err(io_err)?)
            .metadata()
            .map_err(io_err)?;
        let target = meta
            .file_type()
            .is_symlink()
            .then(|| rustix::fs::readlinkat(&fd, "", Vec::new()).ok())
            .flatten()
            .map(|t| PathBuf::from(std::ffi::OsString::from_vec(t.into_bytes())));
        Ok(Json(stat_with_target(q.path, &path, &meta, target)))
    })
    .await
    .map_err(|_| blocking_failed("stat"))?
}

pub(super) async fn list_path(ApiQuery(q): ApiQuery<ListQuery>) -> ApiResult<Json<FileList>> {
    let path = absolute(&q.path)?;
    let depth = q.depth.unwrap_or(1);
    if depth == 0 {
        return Err(ApiError::invalid("depth must be at least 1"));
    }
    // As the image's user, like stat: root-only directories stay closed.
    fsuser::blocking(move || list(&path, q.path, depth, MAX_LIST_ENTRIES))
        .await
        .map_err(|_| blocking_failed("list"))?
        .map(Json)
}

/// Children of `dir` with their lstat metadata, sorted by name. Entries that vanish
/// while being listed are left out: a live directory is not an error.
fn sorted_children(dir: &Path) -> io::Result<Vec<(PathBuf, Metadata)>> {
    let mut children = Vec::new();
    for item in fs::read_dir(dir)? {
        let Ok(item) = item else { continue };
        // DirEntry::metadata does not follow links.
        if let Ok(meta) = item.metadata() {
            children.push((item.path(), meta));
        }
    }
    children.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(children)
}

/// Lists `dir` depth first, each directory followed by its own entries, up to `max`.
fn list(dir: &Path, shown: String, depth: u32, max: usize) -> ApiResult<FileList> {
    let io_err = |err: io::Error| ApiError::io("list", &shown, &err);
    // The directory itself resolved by `guard`: a link to /proc/1/fd (whose entries
    // name the agent's descriptors on the host) is refused.
    let top = guard::resolve(dir, true).map_err(io_err)?;
    let meta = fs::File::from(top).metadata().map_err(io_err)?;
    if !meta.is_dir() {
        return Err(ApiError::new(
            ErrorCode::NotADirectory,
            format!("list {shown}: not a directory"),
        ));
    }
    let top = sorted_children(dir).map_err(io_err)?;
    let mut stack = vec![(top.into_iter(), 1u32)];
    let mut entries = Vec::new();
    let mut truncated = false;
    loop {
        let next = match stack.last_mut() {
            None => break,
            Some((children, level)) => children.next().map(|child| (child, *level)),
        };
        let Some(((path, meta), level)) = next else {
            stack.pop();
            continue;
        };
        if entries.len() >= max {
            truncated = true;
            break;
        }
        entries.push(file_stat(path.to_string_lossy().into_owned(), &path, &meta));
        // lstat metadata: a link to a directory is not a directory here, so it is
        // listed but never descended into.
        // A directory met on the way down is checked too (listing /proc deep would
        // reach /proc/1/fd).
        if meta.is_dir() && level < depth && guard::resolve(&path, false).is_ok() {
            // An unreadable subdirectory still appears; only its contents are missing.
            if let Ok(children) = sorted_children(&path) {
                stack.push((children.into_iter(), level + 1));
            }
        }
    }
    Ok(FileList {
        path: shown,
        entries,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[tokio::test]
    async fn stat_does_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), b"12345").unwrap();
        symlink("f", dir.path().join("l")).unwrap();
        let stat = |name: &str| PathQuery {
            path: dir.path().join(name).to_string_lossy().into_owned(),
        };
        let Json(file) = stat_path(ApiQuery(stat("f"))).await.unwrap();
        assert_eq!(
            (file.kind, file.size, file.name.as_str()),
            (FileKind::File, 5, "f")
        );
        assert!(file.modified_ms > 1_000_000_000_000);
        let Json(link) = stat_path(ApiQuery(stat("l"))).await.unwrap();
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(link.link_target.as_deref(), Some("f"));
        let err = stat_path(ApiQuery(stat("nope"))).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    #[test]
    fn list_is_depth_first_sorted_capped_and_does_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("b/inner")).unwrap();
        fs::write(root.join("b/inner/deep"), b"").unwrap();
        fs::write(root.join("b/x"), b"").unwrap();
        fs::write(root.join("a"), b"").unwrap();
        fs::write(root.join("c"), b"").unwrap();
        symlink(root.join("b"), root.join("d")).unwrap();
        let names = |list: &FileList| -> Vec<String> {
            list.entries
                .iter()
                .map(|e| {
                    e.path
                        .strip_prefix(&*root.to_string_lossy())
                        .unwrap()
                        .to_string()
                })
                .collect()
        };

        let one = list(root, "shown".into(), 1, MAX_LIST_ENTRIES).unwrap();
        assert_eq!(names(&one), vec!["/a", "/b", "/c", "/d"]);
        assert_eq!(one.path, "shown");
        assert!(!one.truncated);
        assert_eq!(one.entries[3].kind, FileKind::Symlink);

        let two = list(root, "shown".into(), 2, MAX_LIST_ENTRIES).unwrap();
        assert_eq!(
            names(&two),
            vec!["/a", "/b", "/b/inner", "/b/x", "/c", "/d"]
        );
        let all = list(root, "shown".into(), 10, MAX_LIST_ENTRIES).unwrap();
        assert_eq!(
            names(&all),
            vec!["/a", "/b", "/b/inner", "/b/inner/deep", "/b/x", "/c", "/d"]
        );

        let capped = list(root, "shown".into(), 10, 3).unwrap();
        assert_eq!(names(&capped), vec!["/a", "/b", "/b/inner"]);
        assert!(capped.truncated);
        let exact = list(root, "shown".into(), 1, 4).unwrap();
        assert!(!exact.truncated);

        let err = list(&root.join("a"), "a".into(), 1, 10).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotADirectory);
    }
}
