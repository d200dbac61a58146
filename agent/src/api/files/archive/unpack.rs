//! Unpacking into the staging directory, one entry at a time, under the path policy
//! of the module docs of [`super`]: a name that is absolute or has `..` is refused,
//! every parent is checked with lstat on the way down so nothing is written through a
//! symbolic link (one from the archive, or one created for an earlier entry), and a
//! hard link must point at an entry staged before it.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tar::{EntryType, Header};

use super::error::{invalid, ArchiveError};

/// Copy buffer size.
const CHUNK: usize = 64 * 1024;
/// Permission bits kept from an archive: setuid and setgid are dropped so an upload
/// cannot plant privileged executables.
const MODE_MASK: u32 = 0o1777;
/// Mode of directories created only because an entry needed a parent.
const IMPLICIT_DIR_MODE: u32 = 0o755;
/// Mode of directories the archive lists, until their own mode is applied after the
/// merge: owner-only and writable, so the merge and a cleanup can always work in them.
pub(super) const STAGED_DIR_MODE: u32 = 0o700;

/// What an extraction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtractStats {
    /// Entries extracted (files, directories, links).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Metadata of a directory the archive lists, applied once it sits in the target.
pub(super) struct DirMeta {
    pub(super) rel: PathBuf,
    pub(super) mode: u32,
    pub(super) mtime: Option<SystemTime>,
}

/// The name of an entry inside the target: absolute paths and `..` are refused, `.`
/// components dropped. An empty result is the target directory itself.
fn relative_name(path: &Path) -> Result<PathBuf, &'static str> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err("absolute paths are not allowed")
            }
            Component::ParentDir => return Err("`..` components are not allowed"),
        }
    }
    Ok(out)
}

fn mtime_of(header: &Header) -> Option<SystemTime> {
    let secs = header.mtime().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Unpacks entries into the staging directory.
pub(super) struct Unpacker {
    root: PathBuf,
    /// The target directory, for messages: staging names mean nothing to a client.
    display_root: PathBuf,
    /// What was unpacked so far.
    pub(super) stats: ExtractStats,
    /// The directories the archive lists, for their metadata after the merge.
    pub(super) dirs: Vec<DirMeta>,
}

impl Unpacker {
    /// Unpacks into `root`, a staging directory inside `display_root`.
    pub(super) fn new(root: PathBuf, display_root: PathBuf) -> Self {
        Self {
            root,
            display_root,
            stats: ExtractStats::default(),
            dirs: Vec::new(),
        }
    }

    /// Checks `entry` and writes it into staging.
    pub(super) fn unpack<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
    ) -> Result<(), ArchiveError> {
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            // Defaults for later entries (comments, charset); nothing to create.
            return Ok(());
        }
        let path = entry.path().map_err(invalid)?;
        let rel =
            relative_name(&path).map_err(|reason| ArchiveError::unsafe_path(&name, reason))?;
        if rel.as_os_str().is_empty() {
            // "./": the target directory itself, whose metadata an upload must not change.
            return Ok(());
        }
        let target = self.ensure_parents(&rel, &name)?;
        let mode = entry.header().mode().map_err(invalid)? & MODE_MASK;
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.write_file(entry, &name, &rel, &target, mode)?
            }
            EntryType::Directory => {
                self.make_dir(&rel, &target)?;
                self.dirs.push(DirMeta {
                    rel,
                    mode,
                    mtime: mtime_of(entry.header()),
                });
            }
            EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(invalid)?
                    .filter(|link| !link.as_os_str().is_empty())
                    .ok_or_else(|| {
                        ArchiveError::Invalid(format!(
                            "entry {name}: symbolic link without a target"
                        ))
                    })?;
                self.clear_for_non_dir(&name, &rel, &target)?;
                std::os::unix::fs::symlink(&link, &target)
                    .map_err(ArchiveError::io("create link", &self.display(&rel)))?;
            }
            EntryType::Link => self.hard_link(entry, &name, &rel, &target)?,
            other => {
                return Err(ArchiveError::Invalid(format!(
                    "entry {name}: entries of type {other:?} are not supported \
                     (only files, directories and links)"
                )))
            }
        }
        self.stats.entries += 1;
        Ok(())
    }

    fn display(&self, rel: &Path) -> PathBuf {
        self.display_root.join(rel)
    }

    /// Creates the missing parents of `rel` in staging, refusing to go through a link.
    /// Each level is checked with lstat from the staging root down, so no ancestor of
    /// the returned path can be a link.
    fn ensure_parents(&self, rel: &Path, name: &str) -> Result<PathBuf, ArchiveError> {
        let mut current = self.root.clone();
        let mut current_rel = PathBuf::new();
        if let Some(parent) = rel.parent() {
            for component in parent.components() {
                current.push(component);
                current_rel.push(component);
                match fs::symlink_metadata(&current) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        return Err(ArchiveError::unsafe_path(
                            name,
                            format!(
                                "its parent {} is a symbolic link in the archive",
                                current_rel.display()
                            ),
                        ))
                    }
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => {
                        return Err(ArchiveError::Invalid(format!(
                            "entry {name}: its parent {} is not a directory",
                            current_rel.display()
                        )))
                    }
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {
                        DirBuilder::new()
                            .mode(IMPLICIT_DIR_MODE)
                            .create(&current)
                            .map_err(ArchiveError::io("create", &self.display(&current_rel)))?;
                    }
                    Err(err) => {
                        return Err(ArchiveError::io("extract", &self.display(&current_rel))(
                            err,
                        ))
                    }
                }
            }
        }
        Ok(self.root.join(rel))
    }

    /// Removes an earlier entry of the same name so a file or link can take its place;
    /// removing (rather than opening) is what keeps a staged link from being written
    /// through.
    fn clear_for_non_dir(&self, name: &str, rel: &Path, target: &Path) -> Result<(), ArchiveError> {
        match fs::symlink_metadata(target) {
            Ok(meta) if meta.is_dir() => Err(ArchiveError::Invalid(format!(
                "entry {name}: a directory of the same name is already in the archive"
            ))),
            Ok(_) => {
                fs::remove_file(target).map_err(ArchiveError::io("replace", &self.display(rel)))
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(ArchiveError::io("extract", &self.display(rel))(err)),
        }
    }

    fn make_dir(&self, rel: &Path, target: &Path) -> Result<(), ArchiveError> {
        match fs::symlink_metadata(target) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(_) => {
                // A link or file listed earlier under this name; the directory replaces it.
                fs::remove_file(target).map_err(ArchiveError::io("replace", &self.display(rel)))?;
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(ArchiveError::io("extract", &self.display(rel))(err)),
        }
        DirBuilder::new()
            .mode(STAGED_DIR_MODE)
            .create(target)
            .map_err(ArchiveError::io("create", &self.display(rel)))
    }

    fn write_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        name: &str,
        rel: &Path,
        target: &Path,
        mode: u32,
    ) -> Result<(), ArchiveError> {
        self.clear_for_non_dir(name, rel, target)?;
        let shown = self.display(rel);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(target)
            .map_err(ArchiveError::io("create", &shown))?;
        let expected = entry.size();
        let mut buf = vec![0u8; CHUNK];
        let mut written = 0u64;
        loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    return Err(ArchiveError::Invalid(format!(
                        "entry {name}: {}",
                        crate::error::describe_io(&err)
                    )))
                }
            };
            file.write_all(&buf[..n])
                .map_err(ArchiveError::io("write", &shown))?;
            written += n as u64;
        }
        // The tar reader ends an entry quietly at end of input; a short entry is how a
        // truncated archive shows.
        if written != expected {
            return Err(ArchiveError::Invalid(format!(
                "entry {name}: the archive ends inside this entry ({written} of {expected} bytes); \
                 it is truncated"
            )));
        }
        if let Some(mtime) = mtime_of(entry.header()) {
            file.set_modified(mtime)
                .map_err(ArchiveError::io("set time of", &shown))?;
        }
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(ArchiveError::io("set mode of", &shown))?;
        self.stats.bytes += written;
        Ok(())
    }

    fn hard_link<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        name: &str,
        rel: &Path,
        target: &Path,
    ) -> Result<(), ArchiveError> {
        let link = entry.link_name().map_err(invalid)?.ok_or_else(|| {
            ArchiveError::Invalid(format!("entry {name}: hard link without a target"))
        })?;
        let link_rel = relative_name(&link).map_err(|reason| {
            ArchiveError::unsafe_path(
                name,
                format!("hard link target {}: {reason}", link.display()),
            )
        })?;
        if link_rel.as_os_str().is_empty() {
            return Err(ArchiveError::unsafe_path(
                name,
                "hard link to the target directory",
            ));
        }
        if link_rel == rel {
            return Ok(());
        }
        // The source must be an entry already staged, reached without crossing a link.
        let mut current = self.root.clone();
        let mut components = link_rel.components().peekable();
        while let Some(component) = components.next() {
            current.push(component);
            let last = components.peek().is_none();
            match fs::symlink_metadata(&current) {
                Ok(meta) if !last && meta.file_type().is_symlink() => {
                    return Err(ArchiveError::unsafe_path(
                        name,
                        format!(
                            "hard link target {} goes through a symbolic link",
                            link.display()
                        ),
                    ))
                }
                Ok(meta) if meta.is_dir() && last => {
                    return Err(ArchiveError::Invalid(format!(
                        "entry {name}: hard link to a directory"
                    )))
                }
                Ok(meta) if !last && !meta.is_dir() => {
                    return Err(ArchiveError::Invalid(format!(
                        "entry {name}: hard link target {} is not in the archive",
                        link.display()
                    )))
                }
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    return Err(ArchiveError::Invalid(format!(
                        "entry {name}: hard link target {} is not in the archive before it",
                        link.display()
                    )))
                }
                Err(err) => return Err(ArchiveError::io("extract", &self.display(&link_rel))(err)),
            }
        }
        self.clear_for_non_dir(name, rel, target)?;
        // linkat without AT_SYMLINK_FOLLOW: a staged symlink is linked as the link itself.
        fs::hard_link(&current, target).map_err(ArchiveError::io("link", &self.display(rel)))
    }
}
