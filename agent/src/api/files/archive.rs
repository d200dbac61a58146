//! Tar upload and download, as plain synchronous functions over `Read` and `Write`.
//!
//! Extraction is all or nothing: the archive is unpacked into a staging directory
//! created inside the target directory (same filesystem, so moving entries out of it is
//! a rename), every entry is validated on the way in, and only once the whole archive
//! has been read successfully are the staged entries merged into the target. Any
//! failure removes the staging directory, so the target is left as it was.
//!
//! An archive is untrusted input. Entry names may not be absolute or contain `..`, no
//! entry may be written through a symbolic link (whether the link came from the archive
//! or already sits in the target directory), and hard links may only point at entries
//! of the same archive. Symbolic links themselves may point anywhere: they are stored,
//! never followed.
//!
//! Building streams a tar.gz of one path into any writer, storing symbolic links as
//! links and skipping sockets, fifos and devices, which a tar cannot carry usefully.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use orchard_protocol::ErrorCode;
use tar::{EntryType, Header, HeaderMode};

use crate::error::ApiError;

/// First two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Prefix of the staging directory created inside the target during extraction.
pub const STAGING_PREFIX: &str = ".orchard-extract-";
/// Copy buffer size.
const CHUNK: usize = 64 * 1024;
/// Permission bits kept from an archive: setuid and setgid are dropped so an upload
/// cannot plant privileged executables.
const MODE_MASK: u32 = 0o1777;
/// Mode of directories created only because an entry needed a parent.
const IMPLICIT_DIR_MODE: u32 = 0o755;
/// Mode of directories the archive lists, until their own mode is applied after the
/// merge: owner-only and writable, so the merge and a cleanup can always work in them.
const STAGED_DIR_MODE: u32 = 0o700;

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
    fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ArchiveError {
        let path = path.display().to_string();
        move |source| ArchiveError::Io { what, path, source }
    }

    fn unsafe_path(entry: &str, reason: impl Into<String>) -> Self {
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

/// What an extraction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtractStats {
    /// Entries extracted (files, directories, links).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Extracts a tar or tar.gz read from `reader` into `dir`, all or nothing.
///
/// `dir` is created when missing (and removed again if the extraction fails). The
/// reader is read to its end before anything is merged, so an input that fails late
/// (a body over its size limit, a dropped connection) still leaves `dir` unchanged.
pub fn extract<R: Read>(reader: R, dir: &Path) -> Result<ExtractStats, ArchiveError> {
    let created = prepare_target(dir)?;
    let result = extract_into(reader, dir);
    if result.is_err() && created {
        // Only the leaf we made, and only if empty: a concurrent writer's files stay.
        let _ = fs::remove_dir(dir);
    }
    result
}

/// Makes sure `dir` is a directory; returns whether it had to be created.
fn prepare_target(dir: &Path) -> Result<bool, ArchiveError> {
    // Following a link here is right: the caller named this directory explicitly.
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(false),
        Ok(_) => Err(ArchiveError::io("extract into", dir)(io::Error::from(
            io::ErrorKind::NotADirectory,
        ))),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(ArchiveError::io("create", dir))?;
            Ok(true)
        }
        Err(err) => Err(ArchiveError::io("extract into", dir)(err)),
    }
}

/// Removes the staging directory however the extraction ends.
struct Staging {
    path: PathBuf,
}

impl Staging {
    fn create(dir: &Path) -> Result<Self, ArchiveError> {
        let mut last = None;
        for _ in 0..16 {
            let path = dir.join(format!(
                "{STAGING_PREFIX}{}",
                crate::api::files::unique_suffix()
            ));
            match DirBuilder::new().mode(STAGED_DIR_MODE).create(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => last = Some(err),
                Err(err) => return Err(ArchiveError::io("extract into", dir)(err)),
            }
        }
        let err = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists));
        Err(ArchiveError::io("extract into", dir)(err))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // remove_dir_all never follows links, so staged links cannot redirect it.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Metadata of a directory the archive lists, applied once it sits in the target.
struct DirMeta {
    rel: PathBuf,
    mode: u32,
    mtime: Option<SystemTime>,
}

fn extract_into<R: Read>(reader: R, dir: &Path) -> Result<ExtractStats, ArchiveError> {
    let staging = Staging::create(dir)?;
    let mut unpacker = Unpacker {
        root: staging.path.clone(),
        display_root: dir.to_path_buf(),
        stats: ExtractStats::default(),
        dirs: Vec::new(),
    };
    read_archive(reader, &mut unpacker)?;
    check_merge(&staging.path, dir, Path::new(""))?;
    merge(&staging.path, dir, Path::new(""))?;
    drop(staging);
    apply_dir_metadata(dir, &mut unpacker.dirs)?;
    Ok(unpacker.stats)
}

fn invalid(err: io::Error) -> ArchiveError {
    ArchiveError::Invalid(crate::error::describe_io(&err))
}

fn read_archive<R: Read>(mut reader: R, unpacker: &mut Unpacker) -> Result<(), ArchiveError> {
    let mut magic = [0u8; 2];
    let n = read_up_to(&mut reader, &mut magic).map_err(invalid)?;
    let mut input = (&magic[..n]).chain(reader);
    if magic[..n] == GZIP_MAGIC {
        let mut gz = GzDecoder::new(&mut input);
        unpack_entries(&mut gz, unpacker)?;
        // The rest of the tar stream, and the gzip trailer whose checksum catches a
        // corrupt stream that still parsed as tar.
        io::copy(&mut gz, &mut io::sink()).map_err(invalid)?;
    } else {
        unpack_entries(&mut input, unpacker)?;
    }
    // Whatever follows the archive is read too, so an input error surfaces here,
    // before the merge, rather than after the target was changed.
    io::copy(&mut input, &mut io::sink()).map_err(invalid)?;
    Ok(())
}

/// Fills `buf` as far as the reader allows; a short count means the input ended.
fn read_up_to<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

fn unpack_entries<R: Read>(reader: R, unpacker: &mut Unpacker) -> Result<(), ArchiveError> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(invalid)? {
        let mut entry = entry.map_err(invalid)?;
        unpacker.unpack(&mut entry)?;
    }
    Ok(())
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
struct Unpacker {
    root: PathBuf,
    /// The target directory, for messages: staging names mean nothing to a client.
    display_root: PathBuf,
    stats: ExtractStats,
    dirs: Vec<DirMeta>,
}

impl Unpacker {
    fn unpack<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ArchiveError> {
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

/// Checks, before anything moves, that merging `staged` into `dest` cannot write
/// through a link of the target and has no file/directory conflicts.
fn check_merge(staged: &Path, dest: &Path, rel: &Path) -> Result<(), ArchiveError> {
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
fn merge(staged: &Path, dest: &Path, rel: &Path) -> Result<(), ArchiveError> {
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
fn apply_dir_metadata(dir: &Path, dirs: &mut [DirMeta]) -> Result<(), ArchiveError> {
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

/// Whether [`build`] can start on `src` with this thread's identity: it exists, and a
/// regular file can be opened or a directory listed. Lets a caller answer a clear
/// error before a streamed archive has begun; entries deeper down that turn out to be
/// unreadable still abort the stream.
pub fn check_readable(src: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(src)?;
    if meta.is_file() {
        File::open(src).map(drop)
    } else if meta.is_dir() {
        fs::read_dir(src).map(drop)
    } else {
        Ok(())
    }
}

/// Writes a tar.gz of `src` into `out` and returns the writer, flushed.
///
/// Entry names are relative: `src`'s own name is the top entry (`.` for `/`), like
/// `tar czf - -C parent name`. Links are stored as links. Files are stored with the
/// size they had when opened, padded or cut to it if they change while being read, so
/// the archive stays well-formed.
pub fn build<W: Write>(src: &Path, out: W) -> Result<W, ArchiveError> {
    let meta = fs::symlink_metadata(src).map_err(ArchiveError::io("archive", src))?;
    let top = src
        .file_name()
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let mut builder = tar::Builder::new(GzEncoder::new(out, Compression::default()));
    // Depth first with sorted children: a directory is followed by its contents, and
    // the same tree always gives the same archive.
    let mut stack = vec![(src.to_path_buf(), top, meta)];
    while let Some((path, name, meta)) = stack.pop() {
        if !append_entry(&mut builder, &path, &name, &meta)? || !meta.is_dir() {
            continue;
        }
        let mut children = Vec::new();
        for item in fs::read_dir(&path).map_err(ArchiveError::io("archive", &path))? {
            let item = item.map_err(ArchiveError::io("archive", &path))?;
            children.push(item.file_name());
        }
        children.sort();
        for child in children.into_iter().rev() {
            let child_path = path.join(&child);
            match fs::symlink_metadata(&child_path) {
                Ok(child_meta) => stack.push((child_path, name.join(&child), child_meta)),
                // Gone since the listing: a live directory, not an error.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(ArchiveError::io("archive", &child_path)(err)),
            }
        }
    }
    let gz = builder
        .into_inner()
        .map_err(ArchiveError::io("archive", src))?;
    let mut out = gz.finish().map_err(ArchiveError::io("archive", src))?;
    out.flush().map_err(ArchiveError::io("archive", src))?;
    Ok(out)
}

/// Appends one path; returns false when it was skipped (special file, or gone).
fn append_entry<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    name: &Path,
    meta: &fs::Metadata,
) -> Result<bool, ArchiveError> {
    let wrap = ArchiveError::io("archive", path);
    let file_type = meta.file_type();
    let mut header = Header::new_gnu();
    if file_type.is_dir() {
        header.set_metadata_in_mode(meta, HeaderMode::Complete);
        header.set_entry_type(EntryType::Directory);
        header.set_size(0);
        builder
            .append_data(&mut header, name, io::empty())
            .map_err(wrap)?;
    } else if file_type.is_symlink() {
        let target = match fs::read_link(path) {
            Ok(target) => target,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(err) => return Err(wrap(err)),
        };
        header.set_metadata_in_mode(meta, HeaderMode::Complete);
        header.set_entry_type(EntryType::Symlink);
        header.set_size(0);
        builder
            .append_link(&mut header, name, &target)
            .map_err(wrap)?;
    } else if file_type.is_file() {
        // O_NOFOLLOW: if the file was swapped for a link since the lstat, skip it
        // rather than archive whatever the link points at.
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(err) if err.raw_os_error() == Some(libc::ELOOP) => return Ok(false),
            Err(err) => return Err(wrap(err)),
        };
        let meta = file.metadata().map_err(ArchiveError::io("archive", path))?;
        if !meta.is_file() {
            return Ok(false);
        }
        let size = meta.len();
        header.set_metadata_in_mode(&meta, HeaderMode::Complete);
        header.set_entry_type(EntryType::Regular);
        header.set_size(size);
        let data = file.take(size).chain(io::repeat(0)).take(size);
        builder
            .append_data(&mut header, name, data)
            .map_err(ArchiveError::io("archive", path))?;
    } else {
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    /// A raw tar entry, bypassing the builder's refusal of `..` and absolute names.
    fn raw_entry(
        builder: &mut tar::Builder<Vec<u8>>,
        name: &[u8],
        kind: EntryType,
        link: &[u8],
        data: &[u8],
    ) {
        let mut header = Header::new_gnu();
        {
            let gnu = header.as_gnu_mut().expect("gnu header");
            gnu.name[..name.len()].copy_from_slice(name);
            gnu.linkname[..link.len()].copy_from_slice(link);
        }
        header.set_entry_type(kind);
        header.set_mode(if kind == EntryType::Directory {
            0o750
        } else {
            0o644
        });
        header.set_size(data.len() as u64);
        header.set_mtime(1_600_000_000);
        header.set_cksum();
        builder.append(&header, data).expect("append");
    }

    /// Name, type, link target, data.
    type RawEntry<'a> = (&'a [u8], EntryType, &'a [u8], &'a [u8]);

    fn tar_of(entries: &[RawEntry<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, link, data) in entries {
            raw_entry(&mut builder, name, *kind, link, data);
        }
        builder.into_inner().expect("finish")
    }

    /// Names in `dir`, sorted, recursively, with a marker for kind.
    fn snapshot(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for item in fs::read_dir(&d).unwrap() {
                let item = item.unwrap();
                let path = item.path();
                let ft = item.file_type().unwrap();
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                if ft.is_dir() {
                    out.push(format!("{rel}/"));
                    stack.push(path);
                } else if ft.is_symlink() {
                    out.push(format!(
                        "{rel} -> {}",
                        fs::read_link(&path).unwrap().display()
                    ));
                } else {
                    out.push(format!("{rel} = {:?}", fs::read(&path).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    fn code_of(err: ArchiveError) -> ErrorCode {
        ApiError::from(err).code
    }

    #[test]
    fn extraction_refuses_parent_dir_entries() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("keep"), b"k").unwrap();
        let before = snapshot(dir.path());
        let tar = tar_of(&[
            (b"ok.txt", EntryType::Regular, b"", b"fine"),
            (b"../x", EntryType::Regular, b"", b"evil"),
        ]);
        let err = extract(&tar[..], dir.path()).unwrap_err();
        assert!(err.to_string().contains("../x"), "{err}");
        assert_eq!(code_of(err), ErrorCode::UnsafePath);
        assert_eq!(snapshot(dir.path()), before);
        assert!(!dir.path().parent().unwrap().join("x").exists());
    }

    #[test]
    fn extraction_refuses_absolute_entries() {
        let dir = tempfile::tempdir().unwrap();
        let tar = tar_of(&[(b"/abs", EntryType::Regular, b"", b"evil")]);
        let err = extract(&tar[..], dir.path()).unwrap_err();
        assert!(err.to_string().contains("/abs"), "{err}");
        assert_eq!(code_of(err), ErrorCode::UnsafePath);
        assert!(snapshot(dir.path()).is_empty());
    }

    #[test]
    fn extraction_refuses_writing_through_an_archived_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("keep"), b"k").unwrap();
        let before = snapshot(dir.path());
        let target = elsewhere.path().as_os_str().as_encoded_bytes().to_vec();
        let tar = tar_of(&[
            (b"first.txt", EntryType::Regular, b"", b"partial?"),
            (b"link", EntryType::Symlink, &target, b""),
            (b"link/file", EntryType::Regular, b"", b"evil"),
        ]);
        let err = extract(&tar[..], dir.path()).unwrap_err();
        assert!(err.to_string().contains("link/file"), "{err}");
        assert_eq!(code_of(err), ErrorCode::UnsafePath);
        assert_eq!(
            snapshot(dir.path()),
            before,
            "no staged leftovers, no partial files"
        );
        assert!(snapshot(elsewhere.path()).is_empty());
    }

    #[test]
    fn extraction_refuses_writing_through_a_symlink_in_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        symlink(elsewhere.path(), dir.path().join("sub")).unwrap();
        let before = snapshot(dir.path());
        let tar = tar_of(&[
            (b"a.txt", EntryType::Regular, b"", b"a"),
            (b"sub/file", EntryType::Regular, b"", b"evil"),
        ]);
        let err = extract(&tar[..], dir.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::UnsafePath);
        assert_eq!(snapshot(dir.path()), before);
        assert!(snapshot(elsewhere.path()).is_empty());
    }

    #[test]
    fn hard_links_inside_the_archive_work_and_escaping_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tar = tar_of(&[
            (b"a/data", EntryType::Regular, b"", b"shared"),
            (b"b/alias", EntryType::Link, b"a/data", b""),
        ]);
        let stats = extract(&tar[..], dir.path()).unwrap();
        assert_eq!(
            stats,
            ExtractStats {
                entries: 2,
                bytes: 6
            }
        );
        let a = fs::metadata(dir.path().join("a/data")).unwrap();
        let b = fs::metadata(dir.path().join("b/alias")).unwrap();
        assert_eq!(a.ino(), b.ino());

        let dir = tempfile::tempdir().unwrap();
        for link in [&b"../../etc/passwd"[..], b"/etc/passwd"] {
            let tar = tar_of(&[(b"x", EntryType::Link, link, b"")]);
            let err = extract(&tar[..], dir.path()).unwrap_err();
            assert_eq!(code_of(err), ErrorCode::UnsafePath);
        }
        let tar = tar_of(&[
            (b"l", EntryType::Symlink, b"/etc", b""),
            (b"x", EntryType::Link, b"l/passwd", b""),
        ]);
        assert_eq!(
            code_of(extract(&tar[..], dir.path()).unwrap_err()),
            ErrorCode::UnsafePath
        );
        assert!(snapshot(dir.path()).is_empty());
    }

    #[test]
    fn device_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tar = tar_of(&[(b"dev", EntryType::Char, b"", b"")]);
        let err = extract(&tar[..], dir.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::InvalidArchive);
        assert!(snapshot(dir.path()).is_empty());
    }

    fn sample_tree() -> tempfile::TempDir {
        let src = tempfile::tempdir().unwrap();
        let root = src.path().join("proj");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::write(root.join("a/b/c/deep.txt"), b"deep").unwrap();
        let binary: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
        fs::write(root.join("a/blob.bin"), &binary).unwrap();
        fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(root.join("run.sh"), Permissions::from_mode(0o755)).unwrap();
        symlink("a/b", root.join("shortcut")).unwrap();
        symlink("/nowhere/at/all", root.join("dangling")).unwrap();
        fs::create_dir(root.join("empty")).unwrap();
        src
    }

    #[test]
    fn tar_gz_round_trips_through_build_and_extract() {
        let src = sample_tree();
        let root = src.path().join("proj");
        let old = UNIX_EPOCH + Duration::from_secs(1_500_000_000);
        File::options()
            .write(true)
            .open(root.join("run.sh"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let gz = build(&root, Vec::new()).unwrap();
        assert_eq!(gz[..2], GZIP_MAGIC);

        let dest = tempfile::tempdir().unwrap();
        let stats = extract(&gz[..], dest.path()).unwrap();
        // proj, a, a/b, a/b/c, deep.txt, blob.bin, run.sh, shortcut, dangling, empty
        assert_eq!(stats.entries, 10);
        assert_eq!(stats.bytes, 4 + 200_000 + 18);
        let out = dest.path().join("proj");
        assert_eq!(snapshot(&out), snapshot(&root));
        let mode = fs::metadata(out.join("run.sh")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        assert_eq!(
            fs::metadata(out.join("run.sh"))
                .unwrap()
                .modified()
                .unwrap(),
            old
        );
        assert!(fs::symlink_metadata(out.join("shortcut"))
            .unwrap()
            .file_type()
            .is_symlink());
        let leftovers: Vec<_> = fs::read_dir(dest.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("proj")]);
    }

    #[test]
    fn plain_tar_is_accepted_too() {
        let tar = tar_of(&[
            (b"./", EntryType::Directory, b"", b""),
            (b"./d/", EntryType::Directory, b"", b""),
            (b"./d/f", EntryType::Regular, b"", b"xyz"),
        ]);
        let dest = tempfile::tempdir().unwrap();
        let stats = extract(&tar[..], &dest.path().join("new/dir")).unwrap();
        assert_eq!(
            stats,
            ExtractStats {
                entries: 2,
                bytes: 3
            }
        );
        assert_eq!(fs::read(dest.path().join("new/dir/d/f")).unwrap(), b"xyz");
        let mode = fs::metadata(dest.path().join("new/dir/d")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o750);
    }

    #[test]
    fn truncated_archives_are_invalid_and_leave_nothing() {
        let src = sample_tree();
        let gz = build(&src.path().join("proj"), Vec::new()).unwrap();
        let dest = tempfile::tempdir().unwrap();
        fs::write(dest.path().join("keep"), b"k").unwrap();
        let before = snapshot(dest.path());
        for cut in [gz.len() / 2, gz.len() - 4, 10] {
            let err = extract(&gz[..cut], dest.path()).unwrap_err();
            assert_eq!(code_of(err), ErrorCode::InvalidArchive, "cut at {cut}");
            assert_eq!(snapshot(dest.path()), before);
        }

        let tar = tar_of(&[
            (b"one", EntryType::Regular, b"", b"complete"),
            (b"two", EntryType::Regular, b"", &[7u8; 2000]),
        ]);
        for cut in [512 * 3 + 100, 512 * 2 + 100, 700] {
            let err = extract(&tar[..cut], dest.path()).unwrap_err();
            assert_eq!(code_of(err), ErrorCode::InvalidArchive, "cut at {cut}");
            assert_eq!(snapshot(dest.path()), before);
        }

        let missing = dest.path().join("not/yet");
        assert!(extract(&gz[..gz.len() / 2], &missing).is_err());
        assert!(!missing.exists());
    }

    #[test]
    fn garbage_is_an_invalid_archive() {
        let dest = tempfile::tempdir().unwrap();
        let err = extract(&[0x55u8; 1024][..], dest.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::InvalidArchive);
        let err = extract(&[0x1f, 0x8b, 0, 1, 2, 3][..], dest.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::InvalidArchive);
        assert!(snapshot(dest.path()).is_empty());
    }

    #[test]
    fn merge_into_an_existing_directory_keeps_unrelated_files() {
        let dest = tempfile::tempdir().unwrap();
        fs::create_dir_all(dest.path().join("proj/a")).unwrap();
        fs::write(dest.path().join("proj/a/mine.txt"), b"mine").unwrap();
        fs::write(dest.path().join("proj/run.sh"), b"old").unwrap();
        fs::write(dest.path().join("other.txt"), b"other").unwrap();
        let src = sample_tree();
        let gz = build(&src.path().join("proj"), Vec::new()).unwrap();
        extract(&gz[..], dest.path()).unwrap();
        assert_eq!(
            fs::read(dest.path().join("proj/a/mine.txt")).unwrap(),
            b"mine"
        );
        assert_eq!(fs::read(dest.path().join("other.txt")).unwrap(), b"other");
        assert_eq!(
            fs::read(dest.path().join("proj/run.sh")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
        assert_eq!(
            fs::read(dest.path().join("proj/a/b/c/deep.txt")).unwrap(),
            b"deep"
        );
    }

    #[test]
    fn merge_conflicts_are_refused_before_anything_moves() {
        let dest = tempfile::tempdir().unwrap();
        fs::create_dir(dest.path().join("x")).unwrap();
        fs::write(dest.path().join("y"), b"file").unwrap();
        let before = snapshot(dest.path());
        let tar = tar_of(&[
            (b"new.txt", EntryType::Regular, b"", b"n"),
            (b"x", EntryType::Regular, b"", b"file over dir"),
        ]);
        let err = extract(&tar[..], dest.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::IsADirectory);
        assert_eq!(snapshot(dest.path()), before);
        let tar = tar_of(&[(b"y/z", EntryType::Regular, b"", b"dir over file")]);
        let err = extract(&tar[..], dest.path()).unwrap_err();
        assert_eq!(code_of(err), ErrorCode::NotADirectory);
        assert_eq!(snapshot(dest.path()), before);
    }

    #[test]
    fn later_entries_replace_links_instead_of_writing_through_them() {
        let dest = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let outside = elsewhere.path().join("victim");
        fs::write(&outside, b"safe").unwrap();
        let target = outside.as_os_str().as_encoded_bytes().to_vec();
        let tar = tar_of(&[
            (b"f", EntryType::Symlink, &target, b""),
            (b"f", EntryType::Regular, b"", b"new"),
        ]);
        extract(&tar[..], dest.path()).unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"safe");
        assert_eq!(fs::read(dest.path().join("f")).unwrap(), b"new");
        assert!(fs::symlink_metadata(dest.path().join("f"))
            .unwrap()
            .is_file());
    }

    #[test]
    fn a_single_file_archives_under_its_own_name() {
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("one.txt"), b"1").unwrap();
        let gz = build(&src.path().join("one.txt"), Vec::new()).unwrap();
        let mut names = Vec::new();
        let mut archive = tar::Archive::new(GzDecoder::new(&gz[..]));
        for entry in archive.entries().unwrap() {
            names.push(entry.unwrap().path().unwrap().display().to_string());
        }
        assert_eq!(names, vec!["one.txt"]);
    }
}
