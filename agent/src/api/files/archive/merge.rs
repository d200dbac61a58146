//! Moving a staged extraction into its target: checked whole before anything moves,
//! then whole subtrees renamed, directories merged into directories; the listed
//! directories' metadata last.

use std::fs::{self, File, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::error::ArchiveError;
use super::unpack::DirMeta;

/// Checks, before anything moves, that merging `staged` into `dest` cannot write
/// through a link of the target and has no file/directory conflicts.
pub(super) fn check_merge(staged: &Path, dest: &Path, rel: &Path) -> Result<(), ArchiveError> {
    for item in fs::read_dir(staged).map_err(ArchiveError::io("read", &dest.join(rel)))? {
        let item = item.map_err(ArchiveError::io("read", &dest.join(rel)))?;
        let name = item.file_name();
        let item_rel = rel.join(&name);
        let to = dest.join(&item_rel);
        let staged_is_dir = item
            .file_type()
            .map_err(ArchiveError::io("read", &to))?
            .is_dir();
        let existing = match fs::symlink_metadata(&to) {
            Ok(meta) => meta.file_type(),
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(ArchiveError::io("extract to", &to)(err)),
        };
        if staged_is_dir {
            if existing.is_symlink() {
                return Err(ArchiveError::unsafe_path(
                    &item_rel.display().to_string(),
                    format!(
                        "{} is a symbolic link in the target directory; \
                         extracting would write through it",
                        to.display()
                    ),
                ));
            }
            if !existing.is_dir() {
                return Err(ArchiveError::NotADirectory(to.display().to_string()));
            }
            check_merge(&item.path(), dest, &item_rel)?;
        } else if existing.is_dir() {
            return Err(ArchiveError::IsADirectory(to.display().to_string()));
        }
    }
    Ok(())
}

/// Moves staged entries into the target: whole subtrees by rename when the target has
/// nothing there, directory into directory by recursion, anything else replaced.
pub(super) fn merge(staged: &Path, dest: &Path, rel: &Path) -> Result<(), ArchiveError> {
    for item in fs::read_dir(staged).map_err(ArchiveError::io("read", &dest.join(rel)))? {
        let item = item.map_err(ArchiveError::io("read", &dest.join(rel)))?;
        let item_rel = rel.join(item.file_name());
        let to = dest.join(&item_rel);
        let staged_is_dir = item
            .file_type()
            .map_err(ArchiveError::io("read", &to))?
            .is_dir();
        // Checked again: the target may have changed since check_merge looked.
        match fs::symlink_metadata(&to) {
            Ok(meta) if staged_is_dir && meta.is_dir() => {
                merge(&item.path(), dest, &item_rel)?;
                continue;
            }
            Ok(meta) if staged_is_dir => {
                return Err(if meta.file_type().is_symlink() {
                    ArchiveError::unsafe_path(
                        &item_rel.display().to_string(),
                        format!(
                            "{} is a symbolic link in the target directory",
                            to.display()
                        ),
                    )
                } else {
                    ArchiveError::NotADirectory(to.display().to_string())
                })
            }
            Ok(meta) if meta.is_dir() => {
                return Err(ArchiveError::IsADirectory(to.display().to_string()))
            }
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(ArchiveError::io("extract to", &to)(err)),
        }
        fs::rename(item.path(), &to).map_err(ArchiveError::io("extract to", &to))?;
    }
    Ok(())
}

/// Gives listed directories their archived mode and mtime, deepest first so setting a
/// child's time does not disturb its parent's, and the time before the mode so a
/// directory made unreadable can still be opened.
pub(super) fn apply_dir_metadata(dir: &Path, dirs: &mut [DirMeta]) -> Result<(), ArchiveError> {
    dirs.sort_by_key(|d| std::cmp::Reverse(d.rel.components().count()));
    for meta in dirs.iter() {
        let path = dir.join(&meta.rel);
        match fs::symlink_metadata(&path) {
            Ok(found) if found.is_dir() => {}
            // Replaced by a later entry of the same name, or changed meanwhile.
            _ => continue,
        }
        if let Some(mtime) = meta.mtime {
            let handle = File::open(&path).map_err(ArchiveError::io("set time of", &path))?;
            handle
                .set_modified(mtime)
                .map_err(ArchiveError::io("set time of", &path))?;
        }
        fs::set_permissions(&path, Permissions::from_mode(meta.mode))
            .map_err(ArchiveError::io("set mode of", &path))?;
    }
    Ok(())
}
