//! The in-memory store's job journal, `<dir>/jobs.ndjson`: one JSON [`Line`] per job
//! write, appended before the write is answered, replayed on open ([`replay`]) and
//! rewritten compacted ([`Journal::rewrite`]). A big output is not in its line but in
//! its own file ([`crate::state::spill`]), which the line names by its lengths.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::maps::Spilled;
use crate::state::record::JobRecord;

/// One line of the journal.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum Line {
    /// A job whose output is in its own file ([`crate::state::spill`]); the record's own
    /// stdout and stderr are empty.
    Spilled {
        spilled: Box<JobRecord>,
        stdout_len: u64,
        stderr_len: u64,
    },
    Job(Box<JobRecord>),
    Purged {
        purged: String,
    },
}

pub(super) struct Journal {
    pub(super) file: Option<File>,
    pub(super) lines: usize,
    /// Bytes in the file.
    pub(super) bytes: u64,
    /// Bytes it held after its last compaction (what the live jobs take).
    pub(super) compacted_bytes: u64,
}

/// (so a journal of small jobs is not rewritten at every other append).
pub(super) const JOURNAL_SLACK_BYTES: u64 = 16 << 20;

/// The journal line of a job whose output is in its own file.
pub(super) fn spilled_line(job: &JobRecord, s: &Spilled) -> Line {
    // Every field but the output, which is not copied.
    let j = &job.job;
    let bare = JobRecord {
        tenant: job.tenant.clone(),
        job: orchard_protocol::compat::Job {
            job_id: j.job_id.clone(),
            sandbox_id: j.sandbox_id.clone(),
            command: j.command.clone(),
            status: j.status,
            stdout: String::new(),
            stderr: String::new(),
            exit_code: j.exit_code,
            created_at: j.created_at,
            started_at: j.started_at,
            completed_at: j.completed_at,
            error: j.error.clone(),
            output_truncated: j.output_truncated,
        },
        options: job.options.clone(),
        finished_ms: job.finished_ms,
        fence: job.fence,
    };
    Line::Spilled {
        spilled: Box::new(bare),
        stdout_len: s.stdout_len,
        stderr_len: s.stderr_len,
    }
}

/// The journal's file in `dir`.
pub(super) fn path(dir: &Path) -> PathBuf {
    dir.join("jobs.ndjson")
}

impl Journal {
    /// No file yet: [`Journal::rewrite`] makes it.
    pub(super) fn closed() -> Journal {
        Journal {
            file: None,
            lines: 0,
            bytes: 0,
            compacted_bytes: 0,
        }
    }

    /// Rewrites the journal at `path` with `lines` (one per live job) and reopens it for
    /// appending.
    pub(super) fn rewrite(&mut self, path: &Path, lines: &[Line]) -> std::io::Result<()> {
        let mut out = Vec::new();
        for line in lines {
            if let Ok(mut bytes) = serde_json::to_vec(line) {
                bytes.push(b'\n');
                out.extend_from_slice(&bytes);
            }
        }
        crate::atomic_file::write_private(path, &out)?;
        self.file = Some(std::fs::OpenOptions::new().append(true).open(path)?);
        self.lines = lines.len();
        self.bytes = out.len() as u64;
        self.compacted_bytes = self.bytes;
        Ok(())
    }

    /// Appends `lines`; answers whether the journal now holds about twice what the
    /// `live` jobs need, and is to be compacted.
    pub(super) fn append(&mut self, lines: &[Line], live: usize) -> bool {
        let mut bytes = Vec::new();
        for line in lines {
            if let Ok(mut b) = serde_json::to_vec(line) {
                b.push(b'\n');
                bytes.extend_from_slice(&b);
            }
        }
        if bytes.is_empty() {
            return false;
        }
        // A job whose line cannot be written still runs; only its restart report is lost.
        if let Some(f) = self.file.as_mut() {
            let _ = f.write_all(&bytes);
        }
        self.lines += lines.len();
        self.bytes += bytes.len() as u64;
        // By lines (many small jobs) or by bytes (a few big outputs, each line up to
        // twice the output cap): the journal stays within about twice the live jobs.
        self.lines > 2 * live + 1024 || self.bytes > 2 * self.compacted_bytes + JOURNAL_SLACK_BYTES
    }
}

/// The jobs the journal in `dir` holds, by id, the last line of each (with where its
/// output is, when in a file of its own); purged jobs left out. Read line by line: the
/// journal may be large, only the live jobs are kept.
pub(super) fn replay(dir: &Path) -> HashMap<String, (JobRecord, Option<Spilled>)> {
    let mut last = HashMap::new();
    let Ok(file) = File::open(path(dir)) else {
        return last;
    };
    use std::io::BufRead;
    for line in std::io::BufReader::new(file).lines() {
        // A torn or unreadable line is skipped like a bad one.
        let Ok(line) = line else { continue };
        match serde_json::from_str::<Line>(&line) {
            Ok(Line::Job(j)) => {
                last.insert(j.job.job_id.clone(), (*j, None));
            }
            Ok(Line::Spilled {
                spilled,
                stdout_len,
                stderr_len,
            }) => {
                let s = Spilled {
                    stdout_len,
                    stderr_len,
                    in_memory: false,
                };
                last.insert(spilled.job.job_id.clone(), (*spilled, Some(s)));
            }
            Ok(Line::Purged { purged }) => {
                last.remove(&purged);
            }
            // A line torn by a kill in the middle of a write.
            Err(_) => {}
        }
    }
    last
}
