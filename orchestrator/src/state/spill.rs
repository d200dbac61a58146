//! Big job output kept beside the memory store's journal, raw, one file per job
//! (`<dir>/output/<job id>`: stdout's bytes, then stderr's).
//!
//! Why (issue 30): in the journal, output is a JSON string (a control byte takes six
//! bytes) and a restart parsed all of it: 8 to 17 s with a big journal. Output past
//! [`SPILL_ABOVE`] bytes is written here once, as it is, and the journal's line for the
//! job holds only its lengths, so a restart reads lines of metadata whatever the output
//! was, and reads a job's output only when the job is asked for. Small output stays in
//! the journal: a file per job costs an inode (0.2 to 0.4 ms) on every exec.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

/// Output (stdout and stderr together) past which a finished job's output is spilled.
pub const SPILL_ABOVE: u64 = 64 << 10;

/// Where spilled output lives under the journal's directory.
pub fn dir_of(journal_dir: &Path) -> PathBuf {
    journal_dir.join("output")
}

fn path_of(journal_dir: &Path, job_id: &str) -> Option<PathBuf> {
    // Job ids are made by the server (`job-<hex>`); anything else is not a file name.
    let safe = !job_id.is_empty()
        && job_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    safe.then(|| dir_of(journal_dir).join(job_id))
}

/// Writes a job's output; answers the lengths written.
pub fn write(
    journal_dir: &Path,
    job_id: &str,
    stdout: &str,
    stderr: &str,
) -> io::Result<(u64, u64)> {
    let path = path_of(journal_dir, job_id)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a job id"))?;
    let dir = dir_of(journal_dir);
    std::fs::create_dir_all(&dir)?;
    let mut bytes = Vec::with_capacity(stdout.len() + stderr.len());
    bytes.extend_from_slice(stdout.as_bytes());
    bytes.extend_from_slice(stderr.as_bytes());
    crate::atomic_file::write_private(&path, &bytes)?;
    Ok((stdout.len() as u64, stderr.len() as u64))
}

/// Opens a job's output file for reading.
pub fn open(journal_dir: &Path, job_id: &str) -> io::Result<std::fs::File> {
    let path = path_of(journal_dir, job_id)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a job id"))?;
    std::fs::File::open(path)
}

/// Reads a job's output back, split at `stdout_len`.
#[cfg(test)]
pub fn read(journal_dir: &Path, job_id: &str, stdout_len: u64) -> io::Result<(String, String)> {
    read_file(&open(journal_dir, job_id)?, stdout_len)
}

/// Reads a job's output back from its open file, split at `stdout_len`.
pub fn read_file(file: &std::fs::File, stdout_len: u64) -> io::Result<(String, String)> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &*file, &mut bytes)?;
    let split = usize::try_from(stdout_len)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let stderr = bytes.split_off(split);
    // Written from strings: valid UTF-8 unless the file was damaged.
    Ok((
        String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()),
        String::from_utf8(stderr).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()),
    ))
}

/// Removes a job's output file, if any.
pub fn remove(journal_dir: &Path, job_id: &str) {
    if let Some(path) = path_of(journal_dir, job_id) {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes every output file whose job is not in `keep` (jobs purged or emptied while
/// the server was down, files of writes torn by a kill).
pub fn sweep(journal_dir: &Path, keep: &HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir_of(journal_dir)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(|n| keep.contains(n)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_comes_back_as_written_and_strange_ids_are_no_files() {
        let dir = tempfile::tempdir().unwrap();
        let (o, e) = write(dir.path(), "job-1", "out\u{1}é", "err").unwrap();
        assert_eq!((o, e), (6, 3));
        assert_eq!(
            read(dir.path(), "job-1", o).unwrap(),
            ("out\u{1}é".to_string(), "err".to_string())
        );
        assert!(write(dir.path(), "../x", "a", "b").is_err());
        assert!(write(dir.path(), "", "a", "b").is_err());
        write(dir.path(), "job-2", "x", "").unwrap();
        sweep(dir.path(), &HashSet::from(["job-1".to_string()]));
        assert!(read(dir.path(), "job-2", 1).is_err(), "swept");
        remove(dir.path(), "job-1");
        assert!(read(dir.path(), "job-1", 1).is_err());
    }
}
