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
//!
//! One file per step: `unpack` checks every entry and writes it into the staging
//! directory (the path policy: names, parents, links), `merge` moves the staged tree
//! into the target, `extract` runs the two over a reader ([`extract()`]), and `build`
//! writes an archive ([`build()`]); `error` holds the error they share.

mod build;
mod error;
mod extract;
mod merge;
#[cfg(test)]
mod tests;
mod unpack;

pub use self::build::{build, check_readable};
pub use self::error::ArchiveError;
pub use self::extract::{extract, STAGING_PREFIX};
pub use self::unpack::ExtractStats;
