//! Captured layers: a sandbox's overlay upper directory copied, while the sandbox is
//! frozen, into a content-addressed directory `<root>/layers/<sha256 hex>` that forks
//! mount as a read-only overlay lower layer.
//!
//! An upper directory is itself a layer in overlayfs' own format, so the copy keeps
//! that format exactly: whiteouts (character devices 0:0) and opaque directories
//! (`trusted.overlay.opaque`) stay what they are, and overlayfs reads them in a lower
//! layer as it does in an upper one. Owners, modes (set-id bits included), times,
//! other extended attributes (file capabilities), symlinks, devices, FIFOs, sockets and
//! hard links within the layer are kept. overlayfs' bookkeeping of an upper layer
//! (`trusted.overlay.origin`, `impure` and the like) is not: it describes the upper's
//! relation to its own lower layers and means nothing in a lower one.
//!
//! The digest is a hash over a canonical listing of the tree (paths in sorted order,
//! kinds, owners, modes, attributes, each file's SHA-256 and size, link targets,
//! devices), computed while copying, so each byte is read once. Times are copied but
//! not hashed: the same content written at another time is the same layer. Written
//! first under `.tmp-*` and renamed into place: a layer directory that exists is whole.
//!
//! Hand-written rather than a copy crate: none keeps whiteout devices, overlay xattrs
//! and hard links together, and this one must hash as it copies.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, CWD};
use sha2::{Digest, Sha256};

/// Deepest directory nesting a captured layer may have. A sandbox can nest directories
/// without limit (with relative paths); the copy recurses per level, so it refuses a
/// deeper tree instead of running out of stack.
pub const MAX_DEPTH: usize = 256;

/// Errors of capturing or removing a layer.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The tree nests directories deeper than [`MAX_DEPTH`].
    #[error("{0}: directories nested more than {MAX_DEPTH} deep, too deep to snapshot")]
    TooDeep(PathBuf),
    /// A file could not be read, made or changed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LayerError + 'a {
    move |source| LayerError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// A layer as captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Hex SHA-256 of its canonical listing; its directory's name.
    pub hex: String,
    /// Bytes it is charged: its file content (hard links counted once) plus
    /// [`ENTRY_BYTES`] for each entry (file, directory, link, whiteout).
    pub bytes: u64,
    /// Its directory.
    pub dir: PathBuf,
}

/// What one entry of a layer is charged beyond its content: an inode and a directory
/// entry on the host. Without it, 16,000 symlinks (71 MiB and 18,000 inodes on the
/// host) were charged 4 bytes against the snapshot quota (issue 30).
pub const ENTRY_BYTES: u64 = 512;

/// Prefix of a layer being written.
pub const TMP_PREFIX: &str = ".tmp-";

/// Extended attributes kept in a captured layer: overlayfs' opaque markers (which are
/// the layer's content) and everything that is not overlayfs' own bookkeeping.
fn keep_xattr(name: &[u8]) -> bool {
    match name.strip_prefix(b"trusted.overlay.") {
        Some(rest) => rest == b"opaque",
        None => !name.starts_with(b"user.overlay."),
    }
}

/// Copies `upper` into `layers_dir/.tmp-<tmp_name>` and hashes it, leaving out the
/// entries at the relative paths `skip` (the runtime's mount points, which are not the
/// sandbox's content). The caller renames the result into place ([`install`]). On
/// error the temporary copy is removed.
pub fn copy(
    upper: &Path,
    layers_dir: &Path,
    tmp_name: &str,
    skip: &[PathBuf],
) -> Result<Captured, LayerError> {
    fs::create_dir_all(layers_dir).map_err(io("creating", layers_dir))?;
    let tmp = layers_dir.join(format!("{TMP_PREFIX}{tmp_name}"));
    let mut copier = Copier {
        listing: Sha256::new(),
        bytes: 0,
        links: HashMap::new(),
        buf: vec![0; 1 << 20],
        skip: skip.to_vec(),
    };
    let result = copier.dir(upper, &tmp, Path::new(""), 0);
    match result {
        Ok(()) => Ok(Captured {
            hex: hex(&copier.listing.finalize()),
            bytes: copier.bytes,
            dir: tmp,
        }),
        Err(e) => {
            let _ = remove(&tmp);
            Err(e)
        }
    }
}

/// Copies what directory `src` holds into the existing directory `dst` (a fork's fresh
/// `/tmp`), owners, modes, times and links kept; answers the bytes copied.
pub fn fill(src: &Path, dst: &Path) -> Result<u64, LayerError> {
    let mut copier = Copier {
        listing: Sha256::new(),
        bytes: 0,
        links: HashMap::new(),
        buf: vec![0; 1 << 20],
        skip: Vec::new(),
    };
    copier.entries(src, dst, Path::new(""), 0)?;
    Ok(copier.bytes)
}

/// Moves a copied layer to `layers_dir/<hex>`; when that layer exists already (the
/// same content captured before), the copy is removed. Answers the layer's directory.
pub fn install(captured: &Captured, layers_dir: &Path) -> Result<PathBuf, LayerError> {
    let dest = layers_dir.join(&captured.hex);
    if dest.is_dir() {
        remove(&captured.dir)?;
        return Ok(dest);
    }
    fs::rename(&captured.dir, &dest).map_err(io("renaming", &captured.dir))?;
    Ok(dest)
}

/// Removes a layer directory; answers the bytes of content it held.
pub fn remove(dir: &Path) -> Result<u64, LayerError> {
    let bytes = content_bytes(dir);
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(LayerError::Io {
            op: "removing",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

/// Bytes `dir` is charged: its file content (hard links once, holes not counted) plus
/// [`ENTRY_BYTES`] per entry; 0 when unreadable.
pub fn content_bytes(dir: &Path) -> u64 {
    fn walk(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>, depth: usize) -> u64 {
        let Ok(entries) = fs::read_dir(dir) else {
            return 0;
        };
        if depth > MAX_DEPTH {
            return 0;
        }
        let mut n = 0;
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            n += ENTRY_BYTES;
            if m.is_dir() {
                n += walk(&e.path(), seen, depth + 1);
            } else if m.is_file() && seen.insert((m.dev(), m.ino())) {
                // A sparse file's holes hold nothing.
                n += m.len().min(m.blocks() * 512);
            }
        }
        n
    }
    if !dir.is_dir() {
        return 0;
    }
    // The root is an entry of the layer too, as the capture charges it.
    ENTRY_BYTES + walk(dir, &mut Default::default(), 0)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Copier {
    listing: Sha256,
    bytes: u64,
    /// Files with more than one link already copied: (dev, ino) to the copy and its
    /// path in the layer.
    links: HashMap<(u64, u64), (PathBuf, PathBuf)>,
    buf: Vec<u8>,
    /// Paths relative to the copied tree that are left out.
    skip: Vec<PathBuf>,
}

impl Copier {
    fn record(&mut self, rel: &Path, fields: &[&[u8]]) {
        // Every entry is charged its inode, whatever it holds.
        self.bytes += ENTRY_BYTES;
        self.listing.update(rel.as_os_str().as_bytes());
        for f in fields {
            self.listing.update(b"\0");
            self.listing.update(f);
        }
        self.listing.update(b"\n");
    }

    /// Copies directory `src` to `dst` (made here), its entries in name order.
    fn dir(&mut self, src: &Path, dst: &Path, rel: &Path, depth: usize) -> Result<(), LayerError> {
        if depth > MAX_DEPTH {
            return Err(LayerError::TooDeep(rel.to_path_buf()));
        }
        let meta = src.symlink_metadata().map_err(io("reading", src))?;
        fs::create_dir(dst).map_err(io("creating", dst))?;
        let xattrs = self.xattrs(src, dst)?;
        self.record(
            rel,
            &[
                b"dir",
                format!("{:o} {} {}", meta.mode() & 0o7777, meta.uid(), meta.gid()).as_bytes(),
                &xattrs,
            ],
        );
        self.entries(src, dst, rel, depth)?;
        // The directory's own owner, mode and times last: its entries changed its mtime.
        self.finish(src, dst, &meta, true)
    }

    /// Copies the entries of directory `src` into the existing directory `dst`, in name
    /// order.
    fn entries(
        &mut self,
        src: &Path,
        dst: &Path,
        rel: &Path,
        depth: usize,
    ) -> Result<(), LayerError> {
        let mut names: Vec<_> = fs::read_dir(src)
            .map_err(io("listing", src))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io("listing", src))?;
        names.sort();
        for name in names {
            let (s, d, r) = (src.join(&name), dst.join(&name), rel.join(&name));
            if self.skip.contains(&r) {
                continue;
            }
            let m = s.symlink_metadata().map_err(io("reading", &s))?;
            let ft = m.file_type();
            if ft.is_dir() {
                self.dir(&s, &d, &r, depth + 1)?;
            } else if !ft.is_dir() && m.nlink() > 1 && self.linked(&m, &d, &r)? {
                continue;
            } else if ft.is_file() {
                self.file(&s, &d, &r, &m)?;
            } else if ft.is_symlink() {
                let target = fs::read_link(&s).map_err(io("reading the link", &s))?;
                std::os::unix::fs::symlink(&target, &d).map_err(io("creating", &d))?;
                self.record(&r, &[b"link", target.as_os_str().as_bytes()]);
            } else {
                self.special(&d, &r, &m)?;
            }
            if !ft.is_dir() {
                self.finish(&s, &d, &m, !ft.is_symlink())?;
            }
        }
        Ok(())
    }

    /// A second link to a file copied already: linked to that copy.
    fn linked(&mut self, m: &fs::Metadata, dst: &Path, rel: &Path) -> Result<bool, LayerError> {
        match self.links.get(&(m.dev(), m.ino())) {
            Some((first, first_rel)) => {
                fs::hard_link(first, dst).map_err(io("linking", dst))?;
                // The listing names the layer's own path, not where it was copied to.
                let first_rel = first_rel.clone();
                self.record(rel, &[b"hardlink", first_rel.as_os_str().as_bytes()]);
                Ok(true)
            }
            None => {
                self.links
                    .insert((m.dev(), m.ino()), (dst.to_path_buf(), rel.to_path_buf()));
                Ok(false)
            }
        }
    }

    fn file(
        &mut self,
        src: &Path,
        dst: &Path,
        rel: &Path,
        m: &fs::Metadata,
    ) -> Result<(), LayerError> {
        let mut from = fs::File::open(src).map_err(io("opening", src))?;
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)
            .map_err(io("creating", dst))?;
        // Data extents only: holes stay holes. A sandbox's `truncate -s 1T` is a few
        // bytes to copy, not a terabyte of zeros on the host's disk. The hash covers
        // each extent's offset and bytes, and the length.
        let mut content = Sha256::new();
        let mut n = 0u64;
        let len = m.len();
        let mut at = 0u64;
        while at < len {
            let start = match rustix::fs::seek(&from, rustix::fs::SeekFrom::Data(at)) {
                Ok(start) => start,
                // No data after `at`: the rest is a hole.
                Err(rustix::io::Errno::NXIO) => break,
                Err(e) => return Err(io("seeking in", src)(e.into())),
            };
            let end = rustix::fs::seek(&from, rustix::fs::SeekFrom::Hole(start))
                .map_err(|e| io("seeking in", src)(e.into()))?
                .min(len);
            from.seek(SeekFrom::Start(start))
                .map_err(io("seeking in", src))?;
            to.seek(SeekFrom::Start(start))
                .map_err(io("seeking in", dst))?;
            content.update(format!("@{start}\0").as_bytes());
            let mut left = end.saturating_sub(start);
            while left > 0 {
                let want = self
                    .buf
                    .len()
                    .min(usize::try_from(left).unwrap_or(usize::MAX));
                let k = from
                    .read(&mut self.buf[..want])
                    .map_err(io("reading", src))?;
                if k == 0 {
                    // Shorter than it said (it cannot change: the sandbox is frozen).
                    break;
                }
                content.update(&self.buf[..k]);
                to.write_all(&self.buf[..k]).map_err(io("writing", dst))?;
                n += k as u64;
                left -= k as u64;
            }
            at = end;
        }
        to.set_len(len).map_err(io("setting the length of", dst))?;
        self.bytes += n;
        let xattrs = self.xattrs(src, dst)?;
        self.record(
            rel,
            &[
                b"file",
                format!(
                    "{:o} {} {} {len} {}",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid(),
                    hex(&content.finalize())
                )
                .as_bytes(),
                &xattrs,
            ],
        );
        Ok(())
    }

    /// Whiteouts (character devices 0:0), other devices, FIFOs and sockets.
    fn special(&mut self, dst: &Path, rel: &Path, m: &fs::Metadata) -> Result<(), LayerError> {
        let ft = m.file_type();
        let kind = if ft.is_char_device() {
            rustix::fs::FileType::CharacterDevice
        } else if ft.is_block_device() {
            rustix::fs::FileType::BlockDevice
        } else if ft.is_fifo() {
            rustix::fs::FileType::Fifo
        } else {
            rustix::fs::FileType::Socket
        };
        rustix::fs::mknodat(
            CWD,
            dst,
            kind,
            Mode::from_raw_mode(m.mode() & 0o7777),
            m.rdev(),
        )
        .map_err(|e| LayerError::Io {
            op: "creating the special file",
            path: dst.to_path_buf(),
            source: e.into(),
        })?;
        let xattrs = self.xattrs(Path::new(""), dst).unwrap_or_default();
        self.record(
            rel,
            &[
                b"special",
                format!(
                    "{:?} {:o} {} {} {}",
                    kind,
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid(),
                    m.rdev()
                )
                .as_bytes(),
                &xattrs,
            ],
        );
        Ok(())
    }

    /// Copies the kept extended attributes of `src` to `dst`; answers them in the
    /// listing's form. An empty `src` reads none (special files).
    fn xattrs(&mut self, src: &Path, dst: &Path) -> Result<Vec<u8>, LayerError> {
        if src.as_os_str().is_empty() {
            return Ok(Vec::new());
        }
        let names = list_xattrs(src).map_err(io("listing the attributes of", src))?;
        let mut out = Vec::new();
        for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            if !keep_xattr(name) {
                continue;
            }
            let name_c = std::ffi::OsStr::from_bytes(name);
            let value = get_xattr(src, name_c).map_err(io("reading an attribute of", src))?;
            rustix::fs::lsetxattr(dst, name_c, &value, rustix::fs::XattrFlags::empty()).map_err(
                |e| LayerError::Io {
                    op: "setting an attribute of",
                    path: dst.to_path_buf(),
                    source: e.into(),
                },
            )?;
            out.extend_from_slice(name);
            out.push(b'=');
            out.extend_from_slice(hex(&value).as_bytes());
            out.push(b';');
        }
        Ok(out)
    }

    /// Owner, mode and times of a copy. A symlink gets owner and times, not a mode.
    fn finish(
        &mut self,
        _src: &Path,
        dst: &Path,
        m: &fs::Metadata,
        set_mode: bool,
    ) -> Result<(), LayerError> {
        let err = |op: &'static str| {
            move |e: rustix::io::Errno| LayerError::Io {
                op,
                path: dst.to_path_buf(),
                source: e.into(),
            }
        };
        rustix::fs::chownat(
            CWD,
            dst,
            Some(rustix::fs::Uid::from_raw(m.uid())),
            Some(rustix::fs::Gid::from_raw(m.gid())),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(err("setting the owner of"))?;
        if set_mode {
            // After chown, which clears set-id bits.
            fs::set_permissions(dst, fs::Permissions::from_mode(m.mode() & 0o7777))
                .map_err(io("setting the mode of", dst))?;
        }
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: m.atime(),
                tv_nsec: m.atime_nsec() as _,
            },
            last_modification: Timespec {
                tv_sec: m.mtime(),
                tv_nsec: m.mtime_nsec() as _,
            },
        };
        rustix::fs::utimensat(CWD, dst, &times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(err("setting the times of"))?;
        Ok(())
    }
}

/// The NUL-separated names of `path`'s extended attributes (not following a symlink).
fn list_xattrs(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::llistxattr(path, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => buf.resize(buf.len() * 4, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

fn get_xattr(path: &Path, name: &std::ffi::OsStr) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match rustix::fs::lgetxattr(path, name, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e.into()),
        }
    }
}

use std::os::unix::fs::OpenOptionsExt;

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    fn upper_with_everything(root: &Path) -> PathBuf {
        let upper = root.join("upper");
        fs::create_dir_all(upper.join("etc/sub")).unwrap();
        fs::write(upper.join("etc/a.txt"), b"hello").unwrap();
        fs::hard_link(upper.join("etc/a.txt"), upper.join("etc/b.txt")).unwrap();
        std::os::unix::fs::symlink("a.txt", upper.join("etc/link")).unwrap();
        fs::set_permissions(upper.join("etc/a.txt"), fs::Permissions::from_mode(0o4755)).unwrap();
        rustix::fs::mknodat(
            CWD,
            upper.join("gone"),
            rustix::fs::FileType::CharacterDevice,
            Mode::empty(),
            0,
        )
        .unwrap();
        rustix::fs::lsetxattr(
            upper.join("etc/sub"),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        rustix::fs::lsetxattr(
            upper.join("etc"),
            "trusted.overlay.origin",
            b"xx",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        upper
    }

    #[test]
    fn a_captured_layer_keeps_whiteouts_opaque_dirs_links_and_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = upper_with_everything(tmp.path());
        let layers = tmp.path().join("layers");
        let c = copy(&upper, &layers, "one", &[]).unwrap();
        // 5 bytes of content (the hard link's once) and the 7 entries' inodes.
        assert_eq!(
            c.bytes,
            5 + 7 * ENTRY_BYTES,
            "the hard link is counted once"
        );
        let dir = install(&c, &layers).unwrap();
        assert_eq!(dir, layers.join(&c.hex));
        let a = dir.join("etc/a.txt").symlink_metadata().unwrap();
        assert_eq!(a.mode() & 0o7777, 0o4755);
        assert_eq!(
            a.ino(),
            dir.join("etc/b.txt").symlink_metadata().unwrap().ino()
        );
        assert_eq!(
            fs::read_link(dir.join("etc/link")).unwrap(),
            Path::new("a.txt")
        );
        let w = dir.join("gone").symlink_metadata().unwrap();
        assert!(w.file_type().is_char_device() && w.rdev() == 0);
        assert_eq!(
            get_xattr(&dir.join("etc/sub"), "trusted.overlay.opaque".as_ref()).unwrap(),
            b"y"
        );
        assert!(
            get_xattr(&dir.join("etc"), "trusted.overlay.origin".as_ref()).is_err(),
            "overlayfs' bookkeeping of the upper layer is not copied"
        );
    }

    #[test]
    fn a_sparse_file_is_copied_as_its_data_not_its_length() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path().join("upper");
        fs::create_dir(&upper).unwrap();
        let f = fs::File::create(upper.join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        f.write_all_at(b"end", (1 << 40) - 3).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        let layers = tmp.path().join("layers");
        let c = copy(&upper, &layers, "s", &[]).unwrap();
        assert!(c.bytes < 1 << 20, "{} bytes copied", c.bytes);
        let copy = c.dir.join("sparse");
        let m = copy.metadata().unwrap();
        assert_eq!(m.len(), 1 << 40);
        assert!(m.blocks() * 512 < 1 << 20, "the holes stayed holes");
        let mut buf = [0u8; 5];
        let g = fs::File::open(&copy).unwrap();
        g.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"start");
        g.read_exact_at(&mut buf[..3], (1 << 40) - 3).unwrap();
        assert_eq!(&buf[..3], b"end");
        g.read_exact_at(&mut buf, 1 << 30).unwrap();
        assert_eq!(buf, [0; 5]);
    }

    #[test]
    fn the_same_content_is_the_same_layer_and_a_change_is_another() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = upper_with_everything(tmp.path());
        let layers = tmp.path().join("layers");
        let first = copy(&upper, &layers, "1", &[]).unwrap();
        let first_dir = install(&first, &layers).unwrap();
        // Times differ, content does not.
        fs::write(upper.join("etc/a.txt"), b"hello").unwrap();
        let second = copy(&upper, &layers, "2", &[]).unwrap();
        assert_eq!(first.hex, second.hex);
        assert_eq!(install(&second, &layers).unwrap(), first_dir);
        assert!(!second.dir.exists(), "the duplicate copy is removed");
        fs::write(upper.join("etc/a.txt"), b"hellO").unwrap();
        let third = copy(&upper, &layers, "3", &[]).unwrap();
        assert_ne!(first.hex, third.hex);
        assert_eq!(
            remove(&install(&third, &layers).unwrap()).unwrap(),
            third.bytes,
            "what was charged is freed"
        );
    }

    #[test]
    fn skipped_paths_are_neither_copied_nor_hashed() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = upper_with_everything(tmp.path());
        let layers = tmp.path().join("layers");
        let plain = copy(&upper, &layers, "1", &[]).unwrap();
        fs::write(upper.join("etc/hosts"), b"").unwrap();
        let skip = [PathBuf::from("etc/hosts")];
        let skipped = copy(&upper, &layers, "2", &skip).unwrap();
        assert!(!skipped.dir.join("etc/hosts").exists());
        assert!(skipped.dir.join("etc/a.txt").exists(), "the rest is copied");
        assert_eq!(plain.hex, skipped.hex, "the mount point changes nothing");
    }
}
