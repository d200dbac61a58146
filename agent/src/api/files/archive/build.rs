//! Building: a tar.gz of one path streamed into any writer, symbolic links stored as
//! links, sockets, fifos and devices skipped (a tar cannot carry them usefully).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use tar::{EntryType, Header, HeaderMode};

use super::error::ArchiveError;

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
