//! `DELETE /v1/files`, `POST /v1/files/mkdir` and `POST /v1/files/move`: removing,
//! creating and moving paths without following a final symbolic link; a move across
//! filesystems copies, then removes.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use axum::Json;
use orchard_protocol::files::{Done, MkdirRequest, MoveRequest};
use orchard_protocol::ErrorCode;
use serde::Deserialize;

use super::common::{
    absolute, blocking_failed, check_mode, is_root, DEFAULT_DIR_MODE, TEMP_PREFIX,
};
use crate::api::extract::{ApiQuery, JsonBody};
use crate::error::{ApiError, ApiResult};
use crate::pid1::fsuser;
use crate::sys::unique_suffix;

#[derive(Deserialize)]
pub(super) struct RemoveQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

pub(super) async fn remove_path(ApiQuery(q): ApiQuery<RemoveQuery>) -> ApiResult<Json<Done>> {
    let path = absolute(&q.path)?;
    if is_root(&path) {
        return Err(ApiError::invalid("refusing to remove /"));
    }
    let io_err = |err: io::Error| ApiError::io("remove", &q.path, &err);
    let recursive = q.recursive;
    fsuser::blocking(move || {
        let meta = fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            if recursive {
                // std's remove_dir_all removes links found inside without following them.
                fs::remove_dir_all(&path)
            } else {
                fs::remove_dir(&path)
            }
        } else {
            fs::remove_file(&path)
        }
    })
    .await
    .map_err(|_| blocking_failed("remove"))?
    .map_err(io_err)?;
    Ok(Json(Done { path: q.path }))
}

pub(super) async fn make_dir(JsonBody(req): JsonBody<MkdirRequest>) -> ApiResult<Json<Done>> {
    let path = absolute(&req.path)?;
    let mode = check_mode(req.mode.unwrap_or(DEFAULT_DIR_MODE))?;
    let shown = req.path.clone();
    fsuser::blocking(move || make_dirs(&path, mode, &shown))
        .await
        .map_err(|_| blocking_failed("mkdir"))??;
    Ok(Json(Done { path: req.path }))
}

/// `mkdir -p`, giving every directory it creates exactly `mode` (the umask does not
/// apply); existing directories are left as they are.
fn make_dirs(path: &Path, mode: u32, shown: &str) -> ApiResult<()> {
    let io_err = |err: io::Error| ApiError::io("mkdir", shown, &err);
    let mut missing = Vec::new();
    let mut current = path;
    loop {
        match fs::metadata(current) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) if current == path => {
                return Err(ApiError::new(
                    ErrorCode::AlreadyExists,
                    format!("mkdir {shown}: exists and is not a directory"),
                ))
            }
            Ok(_) => {
                return Err(ApiError::new(
                    ErrorCode::NotADirectory,
                    format!("mkdir {shown}: {} is not a directory", current.display()),
                ))
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                missing.push(current);
                match current.parent() {
                    Some(parent) => current = parent,
                    None => break,
                }
            }
            Err(err) => return Err(io_err(err)),
        }
    }
    for dir in missing.into_iter().rev() {
        match DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => fs::set_permissions(dir, Permissions::from_mode(mode)).map_err(io_err)?,
            // Created concurrently: fine, as long as it is a directory.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(err) => return Err(io_err(err)),
        }
    }
    Ok(())
}

pub(super) async fn move_path(JsonBody(req): JsonBody<MoveRequest>) -> ApiResult<Json<Done>> {
    let from = absolute(&req.from)?;
    let to = absolute(&req.to)?;
    if is_root(&from) || is_root(&to) {
        return Err(ApiError::invalid("refusing to move / or onto /"));
    }
    let shown = format!("{} to {}", req.from, req.to);
    let overwrite = req.overwrite;
    fsuser::blocking(move || move_blocking(&from, &to, overwrite, &shown))
        .await
        .map_err(|_| blocking_failed("move"))??;
    Ok(Json(Done { path: req.to }))
}

fn move_blocking(from: &Path, to: &Path, overwrite: bool, shown: &str) -> ApiResult<()> {
    let io_err = |err: io::Error| ApiError::io("move", shown, &err);
    fs::symlink_metadata(from).map_err(io_err)?;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(io_err)?;
    }
    match fs::symlink_metadata(to) {
        Ok(_) if !overwrite => {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!(
                    "move {shown}: {} already exists (set overwrite to replace it)",
                    to.display()
                ),
            ))
        }
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_err(err)),
    }
    match fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::EXDEV) => {
            copy_then_remove(from, to).map_err(io_err)
        }
        Err(err) => Err(io_err(err)),
    }
}

/// A move across filesystems: copy next to the destination, rename the copy into
/// place (so the destination is never half-copied), then remove the source.
fn copy_then_remove(from: &Path, to: &Path) -> io::Result<()> {
    let parent = to.parent().unwrap_or(Path::new("/"));
    let temp = parent.join(format!("{TEMP_PREFIX}{}", unique_suffix()));
    let copied = copy_tree(from, &temp).and_then(|()| fs::rename(&temp, to));
    if let Err(err) = copied {
        let _ = remove_any(&temp);
        return Err(err);
    }
    remove_any(from)
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// Copies a tree keeping modes, mtimes and symbolic links (as links).
fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(src)?;
    let file_type = meta.file_type();
    let mode = meta.mode() & 0o7777;
    if file_type.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)
    } else if file_type.is_dir() {
        // Owner-writable until its children are in; its own mode comes last.
        DirBuilder::new().mode(0o700).create(dst)?;
        for item in fs::read_dir(src)? {
            let item = item?;
            copy_tree(&item.path(), &dst.join(item.file_name()))?;
        }
        fs::File::open(dst)?.set_modified(meta.modified()?)?;
        fs::set_permissions(dst, Permissions::from_mode(mode))
    } else if file_type.is_file() {
        let mut input = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(src)?;
        let mut output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)?;
        io::copy(&mut input, &mut output)?;
        output.set_modified(meta.modified()?)?;
        output.set_permissions(Permissions::from_mode(mode))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cannot copy special file {} across filesystems",
                src.display()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    use crate::api::files::tests::no_leftovers;

    #[tokio::test]
    async fn remove_never_follows_links_and_guards_directories() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::write(real.join("keep"), b"k").unwrap();
        let link = dir.path().join("link");
        symlink(&real, &link).unwrap();
        let remove = |path: &Path, recursive| RemoveQuery {
            path: format!("{}/", path.display()),
            recursive,
        };

        let _ = remove_path(ApiQuery(remove(&link, true))).await.unwrap();
        assert!(!link.exists() && fs::symlink_metadata(&link).is_err());
        assert!(real.join("keep").exists());

        let err = remove_path(ApiQuery(remove(&real, false)))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::DirectoryNotEmpty);
        let _ = remove_path(ApiQuery(remove(&real, true))).await.unwrap();
        assert!(!real.exists());

        let root = RemoveQuery {
            path: "/".into(),
            recursive: true,
        };
        assert_eq!(
            remove_path(ApiQuery(root)).await.unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        let missing = RemoveQuery {
            path: real.to_string_lossy().into_owned(),
            recursive: false,
        };
        assert_eq!(
            remove_path(ApiQuery(missing)).await.unwrap_err().code,
            ErrorCode::NotFound
        );
    }

    #[test]
    fn mkdir_creates_parents_with_the_exact_mode() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("x/y/z");
        make_dirs(&deep, 0o750, "deep").unwrap();
        for p in ["x", "x/y", "x/y/z"] {
            assert_eq!(
                fs::metadata(dir.path().join(p)).unwrap().mode() & 0o7777,
                0o750
            );
        }
        make_dirs(&deep, 0o700, "deep").unwrap();
        assert_eq!(fs::metadata(&deep).unwrap().mode() & 0o7777, 0o750);
        fs::write(dir.path().join("file"), b"").unwrap();
        let err = make_dirs(&dir.path().join("file"), 0o755, "file").unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        let err = make_dirs(&dir.path().join("file/sub"), 0o755, "file/sub").unwrap_err();
        assert_eq!(err.code, ErrorCode::NotADirectory);
        assert_eq!(
            check_mode(0o10000).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn move_respects_overwrite_and_creates_parents() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("new/parent/to");
        fs::write(&from, b"1").unwrap();
        move_blocking(&from, &to, false, "m").unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"1");
        assert!(!from.exists());

        fs::write(&from, b"2").unwrap();
        let err = move_blocking(&from, &to, false, "m").unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        move_blocking(&from, &to, true, "m").unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"2");

        let err = move_blocking(&from, &to, true, "m").unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    #[test]
    fn cross_device_fallback_copies_trees_with_links_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/run"), b"#!").unwrap();
        fs::set_permissions(src.join("sub/run"), Permissions::from_mode(0o751)).unwrap();
        symlink("sub/run", src.join("link")).unwrap();
        let dst = dir.path().join("dst");
        copy_then_remove(&src, &dst).unwrap();
        assert!(!src.exists());
        assert_eq!(fs::read(dst.join("sub/run")).unwrap(), b"#!");
        assert_eq!(
            fs::metadata(dst.join("sub/run")).unwrap().mode() & 0o7777,
            0o751
        );
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            PathBuf::from("sub/run")
        );
        assert!(no_leftovers(dir.path()));
    }
}
