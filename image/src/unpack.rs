//! Unpacking one layer into its own directory, in the form overlayfs reads as a lower dir.
//!
//! The layer arrives as a stream (from the network or a file) that may be gzip, zstd or
//! plain tar; the kind is sniffed from the first bytes rather than trusted from a media
//! type, because `docker save` archives and OCI layouts label layers loosely. While the
//! stream is read, two digests are computed: the blob's (the bytes as they came, to check
//! against the manifest) and the diff_id (the uncompressed tar, to check against the
//! config). A layer that fails either check is never installed.
//!
//! OCI whiteouts become overlayfs ones: `.wh.NAME` is a 0/0 character device named
//! `NAME`, and `.wh..wh..opq` sets `trusted.overlay.opaque=y` on its directory. Owners,
//! modes (setuid bits too: images need them), symbolic links, hard links, devices, mtimes
//! and extended attributes are kept.
//!
//! A layer is untrusted input. Entry names with `..` are refused, no entry is written
//! through a symbolic link (every parent directory is checked with `lstat`, and the
//! layer's directory starts empty, so nothing else can plant one), and hard links may
//! only point at entries already unpacked in this layer. Symbolic links are stored as
//! they are, never followed: they resolve inside the sandbox's root at run time.
//!
//! The caller unpacks into a temporary directory and renames it into place only when
//! everything checked out (see `store`), so a failure or crash never leaves a partial
//! layer that looks complete.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use flate2::read::MultiGzDecoder;
use rustix::fs::{AtFlags, FileType, Gid, Mode, Timespec, Timestamps, Uid, XattrFlags, CWD};
use rustix::io::Errno;
use tar::EntryType;

use super::digest::HashingReader;
use super::manifest::{OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD};
use super::ImageError;

/// First bytes of a gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// First bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// Prefix of OCI whiteout entries.
const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// Name (after the prefix) of the opaque-directory marker.
const OPAQUE_MARKER: &[u8] = b".wh..opq";
/// The xattr overlayfs reads to hide a lower directory's contents.
pub const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// Extended attributes in this namespace are overlayfs's own: an image must not be able
/// to set them other than through whiteouts.
const OVERLAY_XATTR_PREFIX: &str = "trusted.overlay.";
/// PAX records carrying extended attributes.
const PAX_XATTR_PREFIX: &str = "SCHILY.xattr.";
/// Copy buffer size.
const CHUNK: usize = 128 * 1024;
/// Mode of directories an entry needs but the layer does not list.
const IMPLICIT_DIR_MODE: u32 = 0o755;

/// How a layer blob was compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain tar.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The OCI layer media type for this compression.
    pub fn media_type(self) -> &'static str {
        match self {
            Compression::None => OCI_LAYER_TAR,
            Compression::Gzip => OCI_LAYER_GZIP,
            Compression::Zstd => OCI_LAYER_ZSTD,
        }
    }
}

/// What unpacking a layer found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// `sha256:` digest of the uncompressed tar.
    pub diff_id: String,
    /// How the blob was compressed.
    pub compression: Compression,
    /// Number of tar entries.
    pub entries: u64,
}

/// A layer unpacked and checked against its digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `sha256:` digest of the blob as read.
    pub blob_digest: String,
    /// Size of the blob as read.
    pub blob_size: u64,
    /// How the blob was compressed.
    pub compression: Compression,
}

/// Unpacks the layer blob `reader` into the empty directory `dest` and checks it: the
/// blob against `expected_blob` (when known; `docker save` archives do not say) and the
/// uncompressed tar against `expected_diff_id`. `what` names the layer in errors.
///
/// The whole stream is always read, even after an unpack error, so that a corrupted blob
/// is reported as the digest mismatch it is rather than as whatever the decompressor
/// tripped on. `dest` is left for the caller to remove on error.
pub fn unpack_verified(
    reader: impl Read,
    dest: &Path,
    expected_blob: Option<&str>,
    expected_diff_id: &str,
    what: &str,
) -> Result<Verified, ImageError> {
    let mut hashed = HashingReader::new(reader);
    let unpacked = unpack(&mut hashed, dest, what);
    let drained = io::copy(&mut hashed, &mut io::sink());
    let (blob_digest, blob_size) = hashed.finish();
    if let Err(err) = drained {
        return Err(ImageError::invalid_by(
            what,
            format!("reading the layer failed: {err}"),
            err,
        ));
    }
    if let Some(expected) = expected_blob {
        if blob_digest != expected {
            return Err(ImageError::DigestMismatch {
                what: format!("{what} (blob {expected})"),
                expected: expected.to_string(),
                actual: blob_digest,
            });
        }
    }
    let unpacked = unpacked?;
    if unpacked.diff_id != expected_diff_id {
        return Err(ImageError::DigestMismatch {
            what: format!("{what} (uncompressed, the config's diff_id)"),
            expected: expected_diff_id.to_string(),
            actual: unpacked.diff_id,
        });
    }
    Ok(Verified {
        blob_digest,
        blob_size,
        compression: unpacked.compression,
    })
}

/// Unpacks a layer blob (any compression) into the empty directory `dest`.
pub fn unpack(reader: &mut dyn Read, dest: &Path, what: &str) -> Result<Unpacked, ImageError> {
    let bad_stream =
        |err: io::Error| ImageError::invalid_by(what, format!("cannot read the layer: {err}"), err);
    let mut magic = [0u8; 4];
    let mut sniffed = 0;
    while sniffed < magic.len() {
        match reader.read(&mut magic[sniffed..]) {
            Ok(0) => break,
            Ok(n) => sniffed += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(bad_stream(err)),
        }
    }
    let stream = io::Cursor::new(magic[..sniffed].to_vec()).chain(reader);
    let (compression, decoded): (Compression, Box<dyn Read + '_>) =
        if magic[..sniffed].starts_with(&GZIP_MAGIC) {
            // Multi-member: some tools write a layer as concatenated gzip members.
            (Compression::Gzip, Box::new(MultiGzDecoder::new(stream)))
        } else if magic[..sniffed] == ZSTD_MAGIC {
            let decoder = zstd::stream::read::Decoder::new(stream).map_err(bad_stream)?;
            (Compression::Zstd, Box::new(decoder))
        } else {
            (Compression::None, Box::new(stream))
        };
    let mut tar_stream = HashingReader::new(decoded);
    let mut unpacker = Unpacker::new(dest, what);
    {
        let mut archive = tar::Archive::new(&mut tar_stream);
        let entries = archive.entries().map_err(|err| unpacker.tar_error(err))?;
        for entry in entries {
            let mut entry = entry.map_err(|err| unpacker.tar_error(err))?;
            unpacker.entry(&mut entry)?;
        }
    }
    unpacker.finish()?;
    // The tar ends before the stream does (end-of-archive blocks, record padding): the
    // diff_id covers all of it.
    io::copy(&mut tar_stream, &mut io::sink()).map_err(|err| unpacker.tar_error(err))?;
    let (diff_id, _) = tar_stream.finish();
    Ok(Unpacked {
        diff_id,
        compression,
        entries: unpacker.entries,
    })
}

/// Extended attributes of an entry: (name, value).
type Xattrs = Vec<(String, Vec<u8>)>;

/// Owner, mode and time of an entry, from its header and PAX records.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
}

struct Unpacker<'a> {
    root: &'a Path,
    what: &'a str,
    /// Directories (relative) known to be real directories created by this unpack, so
    /// their ancestors need no new `lstat`. Cleared whenever a directory is replaced.
    known_dirs: HashSet<PathBuf>,
    /// Directories listed by the layer, with the metadata applied once all their
    /// children are written (writing a child changes a directory's mtime).
    dirs: Vec<(PathBuf, Meta)>,
    /// Whether owners can be set (only root can give files away).
    chown: bool,
    buffer: Vec<u8>,
    entries: u64,
}

impl<'a> Unpacker<'a> {
    fn new(root: &'a Path, what: &'a str) -> Self {
        Unpacker {
            root,
            what,
            known_dirs: HashSet::new(),
            dirs: Vec::new(),
            chown: rustix::process::geteuid().is_root(),
            buffer: vec![0; CHUNK],
            entries: 0,
        }
    }

    fn tar_error(&self, err: io::Error) -> ImageError {
        ImageError::invalid_by(self.what, format!("not a valid tar stream: {err}"), err)
    }

    fn refuse(&self, entry: &Path, reason: impl std::fmt::Display) -> ImageError {
        ImageError::invalid(self.what, format!("entry {}: {reason}", entry.display()))
    }

    /// [`Self::refuse`] for a refusal an error found, kept as the source.
    fn refuse_by(
        &self,
        entry: &Path,
        reason: impl std::fmt::Display,
        err: io::Error,
    ) -> ImageError {
        ImageError::invalid_by(
            self.what,
            format!("entry {}: {reason}", entry.display()),
            err,
        )
    }

    fn io_error(&self, doing: &str, path: &Path, err: io::Error) -> ImageError {
        let shown = path.strip_prefix(self.root).unwrap_or(path);
        ImageError::invalid_by(
            self.what,
            format!("{doing} /{}: {err}", shown.display()),
            err,
        )
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        self.entries += 1;
        let raw_path = entry
            .path()
            .map_err(|err| self.tar_error(err))?
            .into_owned();
        let rel = clean(&raw_path).map_err(|reason| self.refuse(&raw_path, reason))?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            return Ok(());
        }
        let (meta, xattrs) = self.meta(entry, &raw_path)?;

        if let Some(name) = rel.file_name() {
            if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT_PREFIX) {
                return self.whiteout(&rel, hidden);
            }
        }
        if rel.as_os_str().is_empty() {
            // "./": the layer's root directory itself.
            if !kind.is_dir() {
                return Err(self.refuse(&raw_path, "the layer root must be a directory"));
            }
            self.set_owner(self.root, &meta)?;
            self.set_xattrs(self.root, &xattrs);
            self.dirs.push((self.root.to_path_buf(), meta));
            return Ok(());
        }
        self.parent_dirs(&rel, &raw_path)?;
        let path = self.root.join(&rel);
        match kind {
            EntryType::Directory => self.directory(rel, path, meta, &xattrs)?,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.regular_file(entry, &path, &meta, &xattrs)?
            }
            EntryType::Symlink => self.symlink(entry, &raw_path, &path, &meta, &xattrs)?,
            EntryType::Link => self.hard_link(entry, &raw_path, &rel, &path)?,
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                self.device(entry, kind, &path, &meta)?
            }
            // Other types (GNU volume labels, multi-volume continuations) carry nothing a
            // root file system can hold; like Docker, skip them.
            _ => {}
        }
        Ok(())
    }

    /// An entry's step for a directory: made unless one is there, replacing anything else.
    fn directory(
        &mut self,
        rel: PathBuf,
        path: PathBuf,
        meta: Meta,
        xattrs: &Xattrs,
    ) -> Result<(), ImageError> {
        match fs::symlink_metadata(&path) {
            Ok(existing) if existing.is_dir() => {}
            Ok(_) => {
                self.remove(&path)?;
                self.mkdir(&path, 0o700)?;
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => self.mkdir(&path, 0o700)?,
            Err(err) => return Err(self.io_error("cannot inspect", &path, err)),
        }
        self.set_owner(&path, &meta)?;
        self.set_xattrs(&path, xattrs);
        self.known_dirs.insert(rel);
        self.dirs.push((path, meta));
        Ok(())
    }

    /// An entry's step for a regular file: created afresh and filled from the stream.
    fn regular_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: &Path,
        meta: &Meta,
        xattrs: &Xattrs,
    ) -> Result<(), ImageError> {
        self.remove(path)?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|err| self.io_error("cannot create", path, err))?;
        loop {
            let n = match entry.read(&mut self.buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(self.tar_error(err)),
            };
            file.write_all(&self.buffer[..n])
                .map_err(|err| self.io_error("cannot write", path, err))?;
        }
        drop(file);
        self.set_owner(path, meta)?;
        self.set_mode(path, meta.mode)?;
        self.set_xattrs(path, xattrs);
        self.set_mtime(path, meta.mtime)?;
        Ok(())
    }

    /// An entry's step for a symbolic link, whose target is taken as it is.
    fn symlink<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw_path: &Path,
        path: &Path,
        meta: &Meta,
        xattrs: &Xattrs,
    ) -> Result<(), ImageError> {
        let target = entry
            .link_name()
            .map_err(|err| self.tar_error(err))?
            .ok_or_else(|| self.refuse(raw_path, "symbolic link without a target"))?
            .into_owned();
        self.remove(path)?;
        std::os::unix::fs::symlink(&target, path)
            .map_err(|err| self.io_error("cannot create symbolic link", path, err))?;
        self.set_owner(path, meta)?;
        self.set_xattrs(path, xattrs);
        self.set_mtime(path, meta.mtime)?;
        Ok(())
    }

    /// An entry's step for a hard link, to a file already unpacked in this root.
    fn hard_link<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw_path: &Path,
        rel: &Path,
        path: &Path,
    ) -> Result<(), ImageError> {
        let raw_target = entry
            .link_name()
            .map_err(|err| self.tar_error(err))?
            .ok_or_else(|| self.refuse(raw_path, "hard link without a target"))?
            .into_owned();
        let target_rel = clean(&raw_target).map_err(|reason| {
            self.refuse(
                raw_path,
                format!("hard link target {}: {reason}", raw_target.display()),
            )
        })?;
        if target_rel == rel {
            return Ok(());
        }
        let target = self.existing_file(&target_rel, raw_path)?;
        self.remove(path)?;
        // link(2) does not follow a symbolic link target: it links the link itself.
        fs::hard_link(&target, path)
            .map_err(|err| self.io_error("cannot create hard link", path, err))?;
        Ok(())
    }

    /// An entry's step for a device node or a FIFO.
    fn device<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: EntryType,
        path: &Path,
        meta: &Meta,
    ) -> Result<(), ImageError> {
        let file_type = match kind {
            EntryType::Char => libc::S_IFCHR,
            EntryType::Block => libc::S_IFBLK,
            _ => libc::S_IFIFO,
        };
        let header = entry.header();
        let major = header.device_major().ok().flatten().unwrap_or(0);
        let minor = header.device_minor().ok().flatten().unwrap_or(0);
        self.remove(path)?;
        self.mknod(
            path,
            file_type | (meta.mode & 0o7777),
            libc::makedev(major, minor),
        )?;
        self.set_owner(path, meta)?;
        self.set_mode(path, meta.mode)?;
        self.set_mtime(path, meta.mtime)?;
        Ok(())
    }

    /// Owner, mode, mtime and extended attributes, PAX records overriding the header.
    fn meta<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        raw_path: &Path,
    ) -> Result<(Meta, Xattrs), ImageError> {
        let header = entry.header();
        let raw = header.as_old();
        // Like Go's archive/tar (which wrote most layers in the wild), an empty numeric
        // field is 0; anything else unparsable is refused.
        let field = |value: io::Result<u64>, bytes: &[u8], name: &str| match value {
            Ok(value) => Ok(value),
            Err(_) if bytes.iter().all(|b| *b == 0 || *b == b' ') => Ok(0),
            Err(err) => Err(self.refuse_by(raw_path, format!("bad {name} field: {err}"), err)),
        };
        let mode = field(header.mode().map(u64::from), &raw.mode, "mode")? as u32;
        let mut uid = field(header.uid(), &raw.uid, "uid")?;
        let mut gid = field(header.gid(), &raw.gid, "gid")?;
        let mut mtime =
            i64::try_from(field(header.mtime(), &raw.mtime, "mtime")?).unwrap_or(i64::MAX);
        let mut xattrs = Vec::new();
        if let Some(extensions) = entry.pax_extensions().map_err(|err| self.tar_error(err))? {
            for extension in extensions {
                let extension = extension.map_err(|err| self.tar_error(err))?;
                let Ok(key) = extension.key() else { continue };
                let value = extension.value_bytes();
                let number = || {
                    std::str::from_utf8(value)
                        .ok()
                        .map(|v| v.split('.').next().unwrap_or(v).trim())
                };
                match key {
                    "uid" => uid = number().and_then(|v| v.parse().ok()).unwrap_or(uid),
                    "gid" => gid = number().and_then(|v| v.parse().ok()).unwrap_or(gid),
                    "mtime" => mtime = number().and_then(|v| v.parse().ok()).unwrap_or(mtime),
                    _ => {
                        if let Some(name) = key.strip_prefix(PAX_XATTR_PREFIX) {
                            if !name.starts_with(OVERLAY_XATTR_PREFIX) {
                                xattrs.push((name.to_string(), value.to_vec()));
                            }
                        }
                    }
                }
            }
        }
        let id = |value: u64, name: &str| {
            u32::try_from(value)
                .map_err(|_| self.refuse(raw_path, format!("{name} {value} is out of range")))
        };
        Ok((
            Meta {
                mode: mode & 0o7777,
                uid: id(uid, "uid")?,
                gid: id(gid, "gid")?,
                mtime,
            },
            xattrs,
        ))
    }

    /// `.wh.NAME` and `.wh..wh..opq` entries.
    fn whiteout(&mut self, rel: &Path, hidden: &[u8]) -> Result<(), ImageError> {
        self.parent_dirs(rel, rel)?;
        let parent = match rel.parent() {
            Some(parent) => self.root.join(parent),
            None => self.root.to_path_buf(),
        };
        if hidden == OPAQUE_MARKER {
            return set_xattr(&parent, OPAQUE_XATTR, b"y")
                .map_err(|err| self.io_error("cannot mark opaque", &parent, err));
        }
        if hidden.starts_with(WHITEOUT_PREFIX) {
            // Other `.wh..wh.` names are aufs bookkeeping (hard link dirs): not content.
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
            return Err(self.refuse(rel, "whiteout of an invalid name"));
        }
        let target = parent.join(std::ffi::OsStr::from_bytes(hidden));
        self.remove(&target)?;
        // A 0/0 character device is overlayfs's whiteout.
        self.mknod(&target, libc::S_IFCHR, 0)
    }

    /// Makes sure every ancestor of `rel` is a real directory in the layer, creating the
    /// missing ones; refuses to go through a symbolic link or a non-directory.
    fn parent_dirs(&mut self, rel: &Path, shown: &Path) -> Result<(), ImageError> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        let mut current = PathBuf::new();
        for component in parent.components() {
            current.push(component);
            if self.known_dirs.contains(&current) {
                continue;
            }
            let path = self.root.join(&current);
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_dir() => {}
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(self.refuse(
                        shown,
                        format!(
                            "it would be written through the symbolic link {}",
                            current.display()
                        ),
                    ))
                }
                Ok(_) => {
                    return Err(
                        self.refuse(shown, format!("{} is not a directory", current.display()))
                    );
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    self.mkdir(&path, IMPLICIT_DIR_MODE)?;
                }
                Err(err) => return Err(self.io_error("cannot inspect", &path, err)),
            }
            self.known_dirs.insert(current.clone());
        }
        Ok(())
    }

    /// The path of an already unpacked non-directory, reached without symbolic links.
    fn existing_file(&mut self, rel: &Path, shown: &Path) -> Result<PathBuf, ImageError> {
        let mut current = PathBuf::new();
        if let Some(parent) = rel.parent() {
            for component in parent.components() {
                current.push(component);
                let path = self.root.join(&current);
                match fs::symlink_metadata(&path) {
                    Ok(meta) if meta.file_type().is_dir() => {}
                    _ => {
                        return Err(self.refuse(
                            shown,
                            format!("hard link target {} is not inside the layer", rel.display()),
                        ))
                    }
                }
            }
        }
        let path = self.root.join(rel);
        match fs::symlink_metadata(&path) {
            Ok(meta) if !meta.is_dir() => Ok(path),
            Ok(_) => Err(self.refuse(shown, "hard link to a directory")),
            Err(_) => Err(self.refuse(
                shown,
                format!(
                    "hard link target {} is not in the layer (yet)",
                    rel.display()
                ),
            )),
        }
    }

    /// Removes whatever is at `path` (a later entry replaces an earlier one).
    fn remove(&mut self, path: &Path) -> Result<(), ImageError> {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => {
                self.known_dirs.clear();
                fs::remove_dir_all(path).map_err(|err| self.io_error("cannot replace", path, err))
            }
            Ok(_) => {
                fs::remove_file(path).map_err(|err| self.io_error("cannot replace", path, err))
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(self.io_error("cannot inspect", path, err)),
        }
    }

    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), ImageError> {
        DirBuilder::new()
            .mode(mode)
            .create(path)
            .map_err(|err| self.io_error("cannot create directory", path, err))
    }

    fn mknod(&self, path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> Result<(), ImageError> {
        let c_path = c_path(path).map_err(|err| self.io_error("cannot create", path, err))?;
        let (kind, perms) = (FileType::from_raw_mode(mode), Mode::from_raw_mode(mode));
        rustix::fs::mknodat(CWD, c_path.as_c_str(), kind, perms, dev)
            .map_err(|err| self.io_error("cannot create device node", path, err.into()))
    }

    fn set_owner(&self, path: &Path, meta: &Meta) -> Result<(), ImageError> {
        if !self.chown {
            return Ok(());
        }
        let c_path = c_path(path).map_err(|err| self.io_error("cannot chown", path, err))?;
        let (uid, gid) = (Uid::from_raw(meta.uid), Gid::from_raw(meta.gid));
        // SYMLINK_NOFOLLOW: a link itself is chowned (lchown), never its target.
        rustix::fs::chownat(
            CWD,
            c_path.as_c_str(),
            Some(uid),
            Some(gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|err| self.io_error("cannot chown", path, err.into()))
    }

    fn set_mode(&self, path: &Path, mode: u32) -> Result<(), ImageError> {
        // Only called on non-links, so following is harmless; after chown, which clears
        // setuid bits.
        fs::set_permissions(path, Permissions::from_mode(mode))
            .map_err(|err| self.io_error("cannot chmod", path, err))
    }

    fn set_mtime(&self, path: &Path, mtime: i64) -> Result<(), ImageError> {
        set_mtime(path, mtime).map_err(|err| self.io_error("cannot set the mtime of", path, err))
    }

    /// Best effort: a file system without some xattr namespace still gives a usable
    /// layer, and Docker ignores such failures too.
    fn set_xattrs(&self, path: &Path, xattrs: &[(String, Vec<u8>)]) {
        for (name, value) in xattrs {
            let _ = set_xattr(path, name, value);
        }
    }

    /// Applies directory modes and mtimes, children before parents.
    fn finish(&mut self) -> Result<(), ImageError> {
        let dirs = std::mem::take(&mut self.dirs);
        for (path, meta) in dirs.into_iter().rev() {
            match fs::symlink_metadata(&path) {
                Ok(existing) if existing.is_dir() => {}
                // Replaced by a later entry: its metadata no longer applies.
                _ => continue,
            }
            fs::set_permissions(&path, Permissions::from_mode(meta.mode))
                .map_err(|err| self.io_error("cannot chmod", &path, err))?;
            set_mtime(&path, meta.mtime)
                .map_err(|err| self.io_error("cannot set the mtime of", &path, err))?;
        }
        Ok(())
    }
}

/// An entry name as a relative path without `.` or `/` components; `..` is refused.
fn clean(raw: &Path) -> Result<PathBuf, &'static str> {
    let mut out = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err("a name with .. could escape the layer"),
            Component::Prefix(_) => return Err("unsupported path prefix"),
        }
    }
    Ok(out)
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))
}

/// Sets atime and mtime of `path` itself (not a link's target).
fn set_mtime(path: &Path, mtime: i64) -> io::Result<()> {
    let c_path = c_path(path)?;
    let time = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    let times = Timestamps {
        last_access: time,
        last_modification: time,
    };
    rustix::fs::utimensat(CWD, c_path.as_c_str(), &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Sets an extended attribute on `path` itself (not a link's target).
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c_path = c_path(path)?;
    let c_name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name has a NUL byte"))?;
    rustix::fs::lsetxattr(
        c_path.as_c_str(),
        c_name.as_c_str(),
        value,
        XattrFlags::empty(),
    )?;
    Ok(())
}

/// Reads an extended attribute of `path` itself; `None` when it is not set.
pub fn get_xattr(path: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let c_path = c_path(path)?;
    let c_name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name has a NUL byte"))?;
    let mut buffer = vec![0u8; 256];
    match rustix::fs::lgetxattr(c_path.as_c_str(), c_name.as_c_str(), &mut buffer[..]) {
        Ok(len) => {
            buffer.truncate(len);
            Ok(Some(buffer))
        }
        Err(Errno::NODATA) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests;
