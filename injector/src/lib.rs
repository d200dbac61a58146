//! `orchard-injector`: puts the agent, and the harness bundle when there is one, into the
//! directory every sandbox mounts read-only at `/.orchard`, and proves that the copy is
//! right before any sandbox uses it.
//!
//! Layout of the target directory:
//!
//! ```text
//! TARGET/bin/orchard-agent   the static agent, mode 0755
//! TARGET/harness/...         the harness bundle: files, directories, symlinks, modes kept
//! TARGET/manifest.json       every file and symlink with its size, sha256 and mode
//! ```
//!
//! Kubernetes runs the `orchard-injector` binary as an init container into an emptyDir;
//! the local backend calls [`inject`] on its one shared directory. Both run this code, so
//! the init-container path is exercised by every local test.
//!
//! Files are replaced by rename, never rewritten in place: a running sandbox keeps
//! executing the agent it started with (writing into a running binary fails with
//! `ETXTBSY`, and would change it under the running process if it did not).
//! One injector at a time per target directory.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Name of the manifest in the target directory.
pub const MANIFEST_NAME: &str = "manifest.json";
/// Where the agent goes, relative to the target directory.
pub const AGENT_PATH: &str = "bin/orchard-agent";
/// Where the harness bundle goes, relative to the target directory.
pub const HARNESS_DIR: &str = "harness";
/// Version of the manifest format.
pub const MANIFEST_VERSION: u32 = 1;

/// Mode of the injected agent: everyone may run it (commands may later run as the
/// image's non-root user), nobody but root may change it.
const AGENT_MODE: u32 = 0o755;
/// Largest ELF program header table we are willing to read.
const MAX_PHDRS: usize = 4096;

/// What went wrong; every variant names the path it is about.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The agent binary is not there.
    #[error("the agent binary {0} does not exist")]
    AgentMissing(PathBuf),
    /// The agent is a directory, a device, ...
    #[error("the agent {0} is not a regular file")]
    AgentNotFile(PathBuf),
    /// The agent is an empty file (an interrupted build, a failed download).
    #[error("the agent {0} is empty")]
    AgentEmpty(PathBuf),
    /// The agent is not an ELF executable (a script, a text file, an HTML error page).
    #[error("the agent {0} is not an ELF executable")]
    NotElf(PathBuf),
    /// The agent needs a dynamic loader, which an arbitrary image may not have.
    #[error(
        "the agent {path} is dynamically linked (interpreter {interpreter}); sandboxes may \
         have no libc at all: use the static musl build (`make agent`)"
    )]
    DynamicallyLinked {
        /// The agent.
        path: PathBuf,
        /// Its `PT_INTERP`.
        interpreter: String,
    },
    /// The harness bundle is not a directory.
    #[error("the harness bundle {0} does not exist or is not a directory")]
    HarnessMissing(PathBuf),
    /// The harness holds a FIFO, socket or device.
    #[error("harness entry {0} is neither a file, a directory nor a symlink")]
    UnsupportedEntry(PathBuf),
    /// A path is not UTF-8, so the manifest cannot name it.
    #[error("path {0} is not valid UTF-8")]
    NonUtf8Path(PathBuf),
    /// A command of the harness cannot be run.
    #[error("harness command {0} is not executable (every file in harness/bin is put on PATH)")]
    NotExecutable(PathBuf),
    /// The copy's content differs from its source, or from the manifest.
    #[error("digest mismatch for {path}: expected sha256:{expected}, found sha256:{actual}")]
    DigestMismatch {
        /// The copy.
        path: PathBuf,
        /// Digest of the source (or the manifest's).
        expected: String,
        /// Digest of the copy.
        actual: String,
    },
    /// The copy's size differs from its source, or from the manifest.
    #[error("size mismatch for {path}: expected {expected} bytes, found {actual}")]
    SizeMismatch {
        /// The copy.
        path: PathBuf,
        /// Expected size.
        expected: u64,
        /// Size found.
        actual: u64,
    },
    /// The copy's mode (run bits included) differs from what it must be.
    #[error("mode mismatch for {path}: expected {expected:04o}, found {actual:04o}")]
    ModeMismatch {
        /// The copy.
        path: PathBuf,
        /// Expected permission bits.
        expected: u32,
        /// Permission bits found.
        actual: u32,
    },
    /// A symlink points somewhere else than its source (or the manifest) says.
    #[error("symlink {path} points to {actual}, expected {expected}")]
    LinkMismatch {
        /// The symlink.
        path: PathBuf,
        /// Expected target.
        expected: String,
        /// Target found.
        actual: String,
    },
    /// A file listed in the manifest is not in the target directory.
    #[error("{0} is listed in the manifest but missing")]
    MissingFromTarget(PathBuf),
    /// The manifest is missing, unreadable or inconsistent.
    #[error("manifest {path}: {reason}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An I/O operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

type Result<T> = std::result::Result<T, InjectError>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> InjectError + 'a {
    move |source| InjectError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What to inject where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectRequest {
    /// The static agent binary.
    pub agent: PathBuf,
    /// The harness bundle directory, if any.
    pub harness: Option<PathBuf>,
    /// The target directory (created if missing).
    pub target: PathBuf,
}

/// Kind of a manifest entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
}

/// One file or symlink of the target directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path relative to the target directory, `/`-separated.
    pub path: String,
    /// File or symlink.
    pub kind: EntryKind,
    /// Size in bytes (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Hex sha256 of the content (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Permission bits as octal text, e.g. `"0755"` (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Link target (symlinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// `manifest.json`: what the target directory holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// Whether a harness bundle was injected.
    pub harness: bool,
    /// Total bytes of all files.
    pub total_bytes: u64,
    /// Every file and symlink, sorted by path.
    pub files: Vec<ManifestEntry>,
}

impl Manifest {
    /// The entry of `path` (relative, `/`-separated).
    pub fn entry(&self, path: &str) -> Option<&ManifestEntry> {
        self.files.iter().find(|e| e.path == path)
    }
}

/// Copies the agent (and the harness) into `req.target`, verifies every copy against its
/// source and writes the manifest. Answers the manifest written.
pub fn inject(req: &InjectRequest) -> Result<Manifest> {
    check_agent(&req.agent)?;
    if let Some(harness) = &req.harness {
        if !fs::metadata(harness).is_ok_and(|m| m.is_dir()) {
            return Err(InjectError::HarnessMissing(harness.clone()));
        }
    }
    let target = &req.target;
    fs::create_dir_all(target.join("bin")).map_err(io_err("creating", target))?;
    remove_leftovers(target)?;

    let mut files = vec![inject_agent(&req.agent, target)?];
    let harness_dst = target.join(HARNESS_DIR);
    match &req.harness {
        Some(src) => files.extend(inject_harness(src, target)?),
        // A harness left from an earlier run would be on disk but not in the manifest.
        None => remove_tree(&harness_dst)?,
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        harness: req.harness.is_some(),
        total_bytes: files.iter().filter_map(|e| e.size).sum(),
        files,
    };
    write_manifest(target, &manifest)?;
    Ok(manifest)
}

/// Re-checks a target directory against its manifest: every file present with its size,
/// digest and mode, every symlink with its target, and the agent runnable. Answers the
/// manifest.
pub fn verify(target: &Path) -> Result<Manifest> {
    let path = target.join(MANIFEST_NAME);
    let bad = |reason: String| InjectError::Manifest {
        path: path.clone(),
        reason,
    };
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(bad("missing: the target was never injected".into()))
        }
        Err(e) => return Err(io_err("reading", &path)(e)),
    };
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
    if manifest.version != MANIFEST_VERSION {
        return Err(bad(format!(
            "version {} (this injector reads {MANIFEST_VERSION})",
            manifest.version
        )));
    }
    if manifest.entry(AGENT_PATH).is_none() {
        return Err(bad(format!("lists no {AGENT_PATH}")));
    }
    for entry in &manifest.files {
        if entry
            .path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            || entry.path.starts_with('/')
        {
            return Err(bad(format!(
                "entry {:?} is not a plain relative path",
                entry.path
            )));
        }
        let file = target.join(&entry.path);
        match entry.kind {
            EntryKind::File => {
                let (Some(size), Some(sha), Some(mode)) = (entry.size, &entry.sha256, &entry.mode)
                else {
                    return Err(bad(format!(
                        "file {} lacks size, sha256 or mode",
                        entry.path
                    )));
                };
                let mode = u32::from_str_radix(mode, 8)
                    .map_err(|_| bad(format!("mode {mode:?} of {} is not octal", entry.path)))?;
                check_copy(&file, size, sha, mode)?;
            }
            EntryKind::Symlink => {
                let Some(expected) = &entry.link else {
                    return Err(bad(format!("symlink {} lacks its target", entry.path)));
                };
                let actual = match fs::read_link(&file) {
                    Ok(l) => l,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        return Err(InjectError::MissingFromTarget(file))
                    }
                    Err(e) => return Err(io_err("reading link", &file)(e)),
                };
                if actual.as_os_str() != expected.as_str() {
                    return Err(InjectError::LinkMismatch {
                        path: file,
                        expected: expected.clone(),
                        actual: actual.to_string_lossy().into_owned(),
                    });
                }
            }
        }
    }
    Ok(manifest)
}

/// Checks that `path` is a non-empty, statically linked ELF file.
pub fn check_agent(path: &Path) -> Result<()> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InjectError::AgentMissing(path.to_path_buf()))
        }
        Err(e) => return Err(io_err("inspecting", path)(e)),
    };
    if !meta.is_file() {
        return Err(InjectError::AgentNotFile(path.to_path_buf()));
    }
    if meta.len() == 0 {
        return Err(InjectError::AgentEmpty(path.to_path_buf()));
    }
    let bytes = read_prefix(path, 64 * 1024)?;
    match elf_interpreter(&bytes) {
        None => Err(InjectError::NotElf(path.to_path_buf())),
        Some(None) => Ok(()),
        Some(Some(interpreter)) => Err(InjectError::DynamicallyLinked {
            path: path.to_path_buf(),
            interpreter,
        }),
    }
}

fn read_prefix(path: &Path, max: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(max).read_to_end(&mut bytes))
        .map_err(io_err("reading", path))?;
    Ok(bytes)
}

/// `None` if `bytes` do not start an ELF file; `Some(None)` for an ELF without a
/// `PT_INTERP` (static); `Some(Some(interp))` for a dynamically linked one. The program
/// headers must lie in `bytes` (they follow the ELF header in every linker's output).
fn elf_interpreter(bytes: &[u8]) -> Option<Option<String>> {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 52 || &bytes[..4] != b"\x7fELF" {
        return None;
    }
    let big = match bytes[5] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let uint = |off: usize, len: usize| -> Option<u64> {
        let b = bytes.get(off..off.checked_add(len)?)?;
        let mut v = 0u64;
        for i in 0..len {
            let byte = if big { b[i] } else { b[len - 1 - i] };
            v = (v << 8) | u64::from(byte);
        }
        Some(v)
    };
    // (e_phoff, e_phentsize, e_phnum, p_offset, p_filesz) offsets per ELF class.
    let (phoff, phentsize, phnum, p_offset, p_filesz, word) = match bytes[4] {
        1 => (
            uint(0x1c, 4)?,
            uint(0x2a, 2)?,
            uint(0x2c, 2)?,
            0x04,
            0x10,
            4,
        ),
        2 => (
            uint(0x20, 8)?,
            uint(0x36, 2)?,
            uint(0x38, 2)?,
            0x08,
            0x20,
            8,
        ),
        _ => return None,
    };
    let (phoff, phentsize, phnum) = (
        usize::try_from(phoff).ok()?,
        usize::try_from(phentsize).ok()?,
        usize::try_from(phnum).ok()?,
    );
    if phnum > MAX_PHDRS {
        return None;
    }
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if uint(ph, 4)? as u32 != PT_INTERP {
            continue;
        }
        let off = usize::try_from(uint(ph.checked_add(p_offset)?, word)?).ok()?;
        let len = usize::try_from(uint(ph.checked_add(p_filesz)?, word)?)
            .ok()?
            .min(4096);
        let interp = bytes
            .get(off..off.checked_add(len)?)
            .map(|s| {
                String::from_utf8_lossy(s)
                    .trim_end_matches('\0')
                    .to_string()
            })
            .unwrap_or_else(|| "(beyond the first 64 KiB)".into());
        return Some(Some(interp));
    }
    Some(None)
}

/// Hex sha256 and size of a file.
pub fn file_digest(path: &Path) -> Result<(String, u64)> {
    let mut file = fs::File::open(path).map_err(io_err("opening", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io_err("reading", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex(&hasher.finalize()), size))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mode_of(meta: &fs::Metadata) -> u32 {
    meta.mode() & 0o7777
}

/// Checks a copy's size, digest and mode.
fn check_copy(path: &Path, size: u64, sha256: &str, mode: u32) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InjectError::MissingFromTarget(path.to_path_buf()))
        }
        Err(e) => return Err(io_err("inspecting", path)(e)),
    };
    if !meta.is_file() {
        return Err(InjectError::Manifest {
            path: path.to_path_buf(),
            reason: "listed as a file but is not a regular file".into(),
        });
    }
    if meta.len() != size {
        return Err(InjectError::SizeMismatch {
            path: path.to_path_buf(),
            expected: size,
            actual: meta.len(),
        });
    }
    if mode_of(&meta) != mode {
        return Err(InjectError::ModeMismatch {
            path: path.to_path_buf(),
            expected: mode,
            actual: mode_of(&meta),
        });
    }
    let (actual, _) = file_digest(path)?;
    if actual != sha256 {
        return Err(InjectError::DigestMismatch {
            path: path.to_path_buf(),
            expected: sha256.to_string(),
            actual,
        });
    }
    Ok(())
}

/// Copies `src` to the new file `dst` with `mode`, hashing on the way, then re-reads the
/// copy and checks it against the source. Answers (sha256, size).
fn copy_verified(src: &Path, dst: &Path, mode: u32) -> Result<(String, u64)> {
    let mut input = fs::File::open(src).map_err(io_err("opening", src))?;
    let mut output = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dst)
        .map_err(io_err("creating", dst))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = input.read(&mut buf).map_err(io_err("reading", src))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        output
            .write_all(&buf[..n])
            .map_err(io_err("writing", dst))?;
        size += n as u64;
    }
    drop(output);
    // The umask may have cleared bits of `mode` at creation.
    fs::set_permissions(dst, fs::Permissions::from_mode(mode))
        .map_err(io_err("setting the mode of", dst))?;
    let digest = hex(&hasher.finalize());
    check_copy(dst, size, &digest, mode)?;
    Ok((digest, size))
}

fn file_entry(path: &str, sha256: String, size: u64, mode: u32) -> ManifestEntry {
    ManifestEntry {
        path: path.to_string(),
        kind: EntryKind::File,
        size: Some(size),
        sha256: Some(sha256),
        mode: Some(format!("{mode:04o}")),
        link: None,
    }
}

fn inject_agent(src: &Path, target: &Path) -> Result<ManifestEntry> {
    let dst = target.join(AGENT_PATH);
    let (src_digest, src_size) = file_digest(src)?;
    // Already there (a restarted backend): keep the file, and with it the inode running
    // sandboxes execute.
    if check_copy(&dst, src_size, &src_digest, AGENT_MODE).is_ok() {
        return Ok(file_entry(AGENT_PATH, src_digest, src_size, AGENT_MODE));
    }
    let tmp = target.join(format!("bin/.orchard-agent.tmp-{}", std::process::id()));
    let (digest, size) = copy_verified(src, &tmp, AGENT_MODE)?;
    if digest != src_digest {
        // The source changed while we copied it (a rebuild); refuse a torn copy.
        let _ = fs::remove_file(&tmp);
        return Err(InjectError::DigestMismatch {
            path: dst,
            expected: src_digest,
            actual: digest,
        });
    }
    fs::rename(&tmp, &dst).map_err(io_err("renaming into place", &dst))?;
    Ok(file_entry(AGENT_PATH, digest, size, AGENT_MODE))
}

/// Copies the harness tree into a fresh directory, then swaps it in.
fn inject_harness(src: &Path, target: &Path) -> Result<Vec<ManifestEntry>> {
    let staging = target.join(format!(".harness.tmp-{}", std::process::id()));
    fs::create_dir(&staging).map_err(io_err("creating", &staging))?;
    let mut entries = Vec::new();
    let copied = copy_tree(src, &staging, Path::new(""), &mut entries);
    if let Err(e) = copied {
        let _ = remove_tree(&staging);
        return Err(e);
    }
    let dst = target.join(HARNESS_DIR);
    let old = target.join(format!(".harness.old-{}", std::process::id()));
    if fs::symlink_metadata(&dst).is_ok() {
        fs::rename(&dst, &old).map_err(io_err("moving aside", &dst))?;
    }
    fs::rename(&staging, &dst).map_err(io_err("renaming into place", &dst))?;
    remove_tree(&old)?;
    Ok(entries)
}

/// Copies directory `src_root/rel` into `dst_root/rel`, recording files and symlinks as
/// `harness/<rel>/...`.
fn copy_tree(
    src_root: &Path,
    dst_root: &Path,
    rel: &Path,
    entries: &mut Vec<ManifestEntry>,
) -> Result<()> {
    let dir = src_root.join(rel);
    let mut children: Vec<_> = fs::read_dir(&dir)
        .map_err(io_err("listing", &dir))?
        .collect::<io::Result<_>>()
        .map_err(io_err("listing", &dir))?;
    children.sort_by_key(|e| e.file_name());
    for child in children {
        let rel_child = rel.join(child.file_name());
        let src = src_root.join(&rel_child);
        let dst = dst_root.join(&rel_child);
        let name = rel_child
            .to_str()
            .ok_or_else(|| InjectError::NonUtf8Path(src.clone()))?;
        let manifest_path = format!("{HARNESS_DIR}/{name}");
        let meta = fs::symlink_metadata(&src).map_err(io_err("inspecting", &src))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            fs::create_dir(&dst).map_err(io_err("creating", &dst))?;
            copy_tree(src_root, dst_root, &rel_child, entries)?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(mode_of(&meta)))
                .map_err(io_err("setting the mode of", &dst))?;
        } else if ft.is_symlink() {
            let link = fs::read_link(&src).map_err(io_err("reading link", &src))?;
            let link_text = link
                .to_str()
                .ok_or_else(|| InjectError::NonUtf8Path(src.clone()))?
                .to_string();
            symlink(&link, &dst).map_err(io_err("creating symlink", &dst))?;
            entries.push(ManifestEntry {
                path: manifest_path,
                kind: EntryKind::Symlink,
                size: None,
                sha256: None,
                mode: None,
                link: Some(link_text),
            });
        } else if ft.is_file() {
            let mode = mode_of(&meta);
            if rel == Path::new("bin") && mode & 0o111 == 0 {
                return Err(InjectError::NotExecutable(src));
            }
            let (digest, size) = copy_verified(&src, &dst, mode)?;
            entries.push(file_entry(&manifest_path, digest, size, mode));
        } else {
            return Err(InjectError::UnsupportedEntry(src));
        }
    }
    Ok(())
}

fn write_manifest(target: &Path, manifest: &Manifest) -> Result<()> {
    let path = target.join(MANIFEST_NAME);
    let tmp = target.join(format!(".{MANIFEST_NAME}.tmp-{}", std::process::id()));
    let bytes = serde_json::to_vec_pretty(manifest).map_err(|e| InjectError::Manifest {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    fs::write(&tmp, bytes).map_err(io_err("writing", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))
        .map_err(io_err("setting the mode of", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("renaming into place", &path))
}

/// Removes temporary files of an injector that died mid-copy.
fn remove_leftovers(target: &Path) -> Result<()> {
    for dir in [target.to_path_buf(), target.join("bin")] {
        let entries = fs::read_dir(&dir).map_err(io_err("listing", &dir))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".harness.")
                || name.starts_with(".orchard-agent.tmp-")
                || name.starts_with(&format!(".{MANIFEST_NAME}.tmp-"))
            {
                remove_tree(&entry.path())?;
            }
        }
    }
    Ok(())
}

/// Removes a file or a directory tree; a missing path is fine.
fn remove_tree(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("inspecting", path)(e)),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io_err("removing", path)),
        Ok(_) => fs::remove_file(path).map_err(io_err("removing", path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A static ELF that is always on these machines (busybox-static).
    const STATIC_ELF: &str = "/bin/busybox";

    fn static_agent(dir: &Path) -> PathBuf {
        let path = dir.join("agent");
        fs::copy(STATIC_ELF, &path).unwrap();
        path
    }

    fn harness(dir: &Path) -> PathBuf {
        let h = dir.join("harness-src");
        fs::create_dir_all(h.join("bin")).unwrap();
        fs::create_dir_all(h.join("lib/node")).unwrap();
        fs::write(h.join("lib/node/cli.js"), "console.log('hi')\n").unwrap();
        fs::write(h.join("bin/codex"), "#!/bin/sh\necho codex\n").unwrap();
        fs::set_permissions(h.join("bin/codex"), fs::Permissions::from_mode(0o755)).unwrap();
        symlink("codex", h.join("bin/codex-alias")).unwrap();
        h
    }

    fn request(dir: &Path, harness: Option<PathBuf>) -> InjectRequest {
        InjectRequest {
            agent: static_agent(dir),
            harness,
            target: dir.join("target"),
        }
    }

    #[test]
    fn injects_the_agent_and_the_harness_and_writes_a_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let req = request(dir.path(), Some(harness(dir.path())));
        let manifest = inject(&req).unwrap();
        let agent = req.target.join(AGENT_PATH);
        assert_eq!(fs::read(&agent).unwrap(), fs::read(STATIC_ELF).unwrap());
        assert_eq!(mode_of(&fs::metadata(&agent).unwrap()), 0o755);
        let paths: Vec<&str> = manifest.files.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "bin/orchard-agent",
                "harness/bin/codex",
                "harness/bin/codex-alias",
                "harness/lib/node/cli.js"
            ]
        );
        let (digest, size) = file_digest(Path::new(STATIC_ELF)).unwrap();
        let e = manifest.entry(AGENT_PATH).unwrap();
        assert_eq!(
            (e.sha256.as_deref(), e.size),
            (Some(digest.as_str()), Some(size))
        );
        assert_eq!(
            manifest
                .entry("harness/bin/codex-alias")
                .unwrap()
                .link
                .as_deref(),
            Some("codex")
        );
        assert_eq!(
            manifest.entry("harness/bin/codex").unwrap().mode.as_deref(),
            Some("0755")
        );
        let on_disk: Manifest =
            serde_json::from_slice(&fs::read(req.target.join(MANIFEST_NAME)).unwrap()).unwrap();
        assert_eq!(on_disk, manifest);
        assert_eq!(verify(&req.target).unwrap(), manifest);
    }

    #[test]
    fn injecting_again_keeps_the_running_agent_and_drops_a_stale_harness() {
        let dir = tempfile::tempdir().unwrap();
        let req = request(dir.path(), Some(harness(dir.path())));
        inject(&req).unwrap();
        let ino = fs::metadata(req.target.join(AGENT_PATH)).unwrap().ino();
        let again = InjectRequest {
            harness: None,
            ..req.clone()
        };
        let manifest = inject(&again).unwrap();
        assert_eq!(
            fs::metadata(req.target.join(AGENT_PATH)).unwrap().ino(),
            ino
        );
        assert!(!req.target.join(HARNESS_DIR).exists());
        assert_eq!(manifest.files.len(), 1);
        assert!(!manifest.harness);
        verify(&req.target).unwrap();
    }

    #[test]
    fn a_changed_agent_replaces_the_file_by_rename() {
        let dir = tempfile::tempdir().unwrap();
        let req = request(dir.path(), None);
        inject(&req).unwrap();
        let ino = fs::metadata(req.target.join(AGENT_PATH)).unwrap().ino();
        let mut bytes = fs::read(&req.agent).unwrap();
        bytes.extend_from_slice(b"trailer");
        fs::write(&req.agent, &bytes).unwrap();
        inject(&req).unwrap();
        let copy = req.target.join(AGENT_PATH);
        assert_ne!(fs::metadata(&copy).unwrap().ino(), ino);
        assert_eq!(fs::read(&copy).unwrap(), bytes);
    }

    #[test]
    fn missing_empty_non_elf_and_dynamic_agents_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        let run = |agent: PathBuf| {
            inject(&InjectRequest {
                agent,
                harness: None,
                target: target.clone(),
            })
            .unwrap_err()
        };
        let e = run(dir.path().join("nope"));
        assert!(matches!(e, InjectError::AgentMissing(_)), "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(matches!(
            run(dir.path().to_path_buf()),
            InjectError::AgentNotFile(_)
        ));
        let empty = dir.path().join("empty");
        fs::write(&empty, b"").unwrap();
        assert!(matches!(run(empty), InjectError::AgentEmpty(_)));
        let script = dir.path().join("script");
        fs::write(&script, b"#!/bin/sh\necho hi\n").unwrap();
        assert!(matches!(run(script), InjectError::NotElf(_)));
        // Debian's coreutils are dynamically linked.
        let e = run(PathBuf::from("/bin/ls"));
        match &e {
            InjectError::DynamicallyLinked { interpreter, .. } => {
                assert!(interpreter.contains("ld-linux"), "{interpreter}")
            }
            other => panic!("expected DynamicallyLinked, got {other}"),
        }
        assert!(e.to_string().contains("make agent"), "{e}");
        assert!(!target.join(MANIFEST_NAME).exists());
    }

    #[test]
    fn a_harness_problem_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let e = inject(&request(dir.path(), Some(dir.path().join("no-harness")))).unwrap_err();
        assert!(matches!(e, InjectError::HarnessMissing(_)), "{e}");
        let h = harness(dir.path());
        fs::write(h.join("bin/notes"), "not a program").unwrap();
        let e = inject(&request(dir.path(), Some(h.clone()))).unwrap_err();
        match &e {
            InjectError::NotExecutable(p) => assert!(p.ends_with("bin/notes")),
            other => panic!("expected NotExecutable, got {other}"),
        }
        // Nothing half-copied stays behind.
        let names: Vec<_> = fs::read_dir(dir.path().join("target"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(".harness")),
            "{names:?}"
        );
    }

    #[test]
    fn verify_catches_tampering_missing_files_and_lost_run_bits() {
        let dir = tempfile::tempdir().unwrap();
        let req = request(dir.path(), Some(harness(dir.path())));
        inject(&req).unwrap();
        let js = req.target.join("harness/lib/node/cli.js");
        fs::write(&js, "console.log('HI')\n").unwrap();
        assert!(matches!(
            verify(&req.target).unwrap_err(),
            InjectError::DigestMismatch { .. }
        ));
        fs::write(&js, "x").unwrap();
        assert!(matches!(
            verify(&req.target).unwrap_err(),
            InjectError::SizeMismatch { .. }
        ));
        inject(&req).unwrap();
        let agent = req.target.join(AGENT_PATH);
        fs::set_permissions(&agent, fs::Permissions::from_mode(0o644)).unwrap();
        let e = verify(&req.target).unwrap_err();
        assert!(
            matches!(
                e,
                InjectError::ModeMismatch {
                    expected: 0o755,
                    actual: 0o644,
                    ..
                }
            ),
            "{e}"
        );
        inject(&req).unwrap();
        fs::remove_file(req.target.join("harness/bin/codex-alias")).unwrap();
        assert!(matches!(
            verify(&req.target).unwrap_err(),
            InjectError::MissingFromTarget(_)
        ));
        fs::remove_file(req.target.join(MANIFEST_NAME)).unwrap();
        let e = verify(&req.target).unwrap_err();
        assert!(e.to_string().contains("never injected"), "{e}");
    }

    #[test]
    fn elf_parsing_survives_truncated_and_hostile_headers() {
        assert_eq!(elf_interpreter(b""), None);
        assert_eq!(elf_interpreter(b"\x7fELF"), None);
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        // A program header table far beyond the bytes.
        h[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&3u16.to_le_bytes());
        h[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        assert_eq!(elf_interpreter(&h), None);
        h[0x38..0x3a].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(elf_interpreter(&h), Some(None));
    }
}
