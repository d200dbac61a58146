//! Extraction, all or nothing: the archive is unpacked into a staging directory inside
//! the target ([`super::unpack`]), read to the end of its input, and only then merged
//! into the target ([`super::merge`]); any failure removes the staging directory.

use std::fs::{self, DirBuilder};
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::error::{invalid, ArchiveError};
use super::merge::{apply_dir_metadata, check_merge, merge};
use super::unpack::{ExtractStats, Unpacker, STAGED_DIR_MODE};

/// First two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Prefix of the staging directory created inside the target during extraction.
pub const STAGING_PREFIX: &str = ".orchard-extract-";

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
            let path = dir.join(format!("{STAGING_PREFIX}{}", crate::sys::unique_suffix()));
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

fn extract_into<R: Read>(reader: R, dir: &Path) -> Result<ExtractStats, ArchiveError> {
    let staging = Staging::create(dir)?;
    let mut unpacker = Unpacker::new(staging.path.clone(), dir.to_path_buf());
    read_archive(reader, &mut unpacker)?;
    check_merge(&staging.path, dir, Path::new(""))?;
    merge(&staging.path, dir, Path::new(""))?;
    drop(staging);
    apply_dir_metadata(dir, &mut unpacker.dirs)?;
    Ok(unpacker.stats)
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
