//! A compatible job as a response body, streamed when its output is big.
//!
//! Orchard's wire format puts a job's whole stdout and stderr in JSON strings, where a
//! control byte takes six bytes (`\u0001`): issue 30 saw one job of 2 x 64 MiB answer
//! with 805 MB, built in memory for every GET and serialised on the server's one worker
//! thread while every other tenant's call waited. Past [`STREAM_ABOVE`] bytes of output
//! the body is therefore made as it is sent: the small fields first, then each stream
//! escaped [`CHUNK`] bytes at a time, read from the output's own file where the store
//! keeps one ([`crate::state::JobView`]), so a read costs one chunk of memory whatever
//! the job's size. Each chunk is read and escaped on the server's low-priority bulk
//! thread ([`super::bulk`]), one task per chunk: the request thread only writes the
//! bytes, and a slow reader holds no thread between chunks. Smaller jobs keep the
//! one-piece `Json` answer.
//!
//! A tenant's streamed bodies take turns ([`ReadShares`]): one piece of one of them is
//! made and handed to the connection at a time, whatever number of reads the tenant
//! runs at once, and each tenant has at most one piece in the bulk thread's line, so
//! tenants take turns there too. Issue 30 measured four parallel reads of one big job
//! (made on the blocking pool, one thread each) taking both cores, and another
//! tenant's exec p99 rising sixfold.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use orchard_protocol::compat::Job;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bulk::Bulk;
use crate::state::{JobView, OutputFile};

/// Output (stdout and stderr together) past which the body is streamed.
pub const STREAM_ABOVE: usize = 1 << 20;
/// Bytes of output escaped per piece of the body: at most 96 KiB once escaped (control
/// bytes take six), so that writing one piece keeps the request thread briefly.
const CHUNK: usize = 16 << 10;

/// Each tenant's turn at making a piece of a streamed body: one piece at a time per
/// tenant (see the module's header). A tenant's gate lives while one of its bodies is
/// being sent.
pub struct ReadShares {
    gates: Mutex<HashMap<String, Weak<Semaphore>>>,
    /// Where pieces are made; the blocking pool if the thread could not start.
    bulk: Option<Bulk>,
}

impl ReadShares {
    /// The shares, with their bulk thread started.
    pub fn start() -> ReadShares {
        let bulk = Bulk::start()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "no bulk thread: big bodies are made on the blocking pool");
            })
            .ok();
        ReadShares {
            gates: Mutex::default(),
            bulk,
        }
    }

    /// The next piece of `pieces`, made on the bulk thread; `None` if the server is
    /// stopping.
    async fn make(&self, mut pieces: Pieces) -> Option<(Option<Bytes>, Pieces)> {
        let work = move || {
            let piece = pieces.next();
            (piece, pieces)
        };
        match &self.bulk {
            Some(bulk) => bulk.run(work).await,
            None => tokio::task::spawn_blocking(work).await.ok(),
        }
    }

    /// `tenant`'s gate, shared by all its bodies being sent.
    fn gate(&self, tenant: &str) -> Arc<Semaphore> {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gate) = gates.get(tenant).and_then(Weak::upgrade) {
            return gate;
        }
        // Forget the gates of tenants no longer reading (at most one per tenant).
        gates.retain(|_, g| g.strong_count() > 0);
        let gate = Arc::new(Semaphore::new(1));
        gates.insert(tenant.to_string(), Arc::downgrade(&gate));
        gate
    }
}

/// The response for the job of `view`, streamed from its file if it has one, in turns
/// with the other bodies of the job's tenant in `shares`.
pub fn view_response(shares: &Arc<ReadShares>, view: JobView) -> Response {
    let tenant = view.record.tenant;
    let job = view.record.job;
    let big = match &view.output {
        Some(out) => out.stdout_len + out.stderr_len > STREAM_ABOVE as u64,
        None => job.stdout.len() + job.stderr.len() > STREAM_ABOVE,
    };
    if !big {
        let job = match view.output {
            // Small enough to read in at once (the file is at most STREAM_ABOVE).
            Some(out) => with_output(job, &out),
            None => job,
        };
        return Json(job).into_response();
    }
    let start = Some((Pieces::new(job, view.output), shares.gate(&tenant), None));
    let shares = shares.clone();
    let pieces = futures_util::stream::unfold(start, move |p| {
        let shares = shares.clone();
        async move {
            let (pieces, gate, turn): (Pieces, Arc<Semaphore>, Option<OwnedSemaphorePermit>) = p?;
            // Asked for the next piece: the last one is with the connection, and the
            // turn goes to the tenant's next body in line (the semaphore is first come,
            // first served) before this one takes another.
            drop(turn);
            let turn = gate.clone().acquire_owned().await.ok();
            match shares.make(pieces).await {
                Some((Some(b), pieces)) => Some((Ok(b), Some((pieces, gate, turn)))),
                Some((None, _)) => None,
                // The server is shutting down: the body ends short, as a dropped
                // connection would.
                None => Some((Err(std::io::Error::other("the server is stopping")), None)),
            }
        }
    });
    let mut response = Body::from_stream(pieces).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `job` with the output of `out` read in.
fn with_output(mut job: Job, out: &OutputFile) -> Job {
    match crate::state::read_output(&out.file, out.stdout_len) {
        Ok((stdout, stderr)) => {
            job.stdout = stdout;
            job.stderr = stderr;
        }
        Err(e) => {
            tracing::warn!(job_id = %job.job_id, error = %e, "a job's output is unreadable");
            job.stdout = crate::state::memory::DROPPED_NOTE.to_string();
            job.output_truncated = true;
        }
    }
    job
}

/// The body's pieces, made one at a time.
struct Pieces {
    job: Job,
    file: Option<OutputFile>,
    stage: Stage,
    offset: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Stage {
    Head,
    Stdout,
    Between,
    Stderr,
    Tail,
    Done,
}

impl Pieces {
    fn new(job: Job, file: Option<OutputFile>) -> Pieces {
        Pieces {
            job,
            file,
            stage: Stage::Head,
            offset: 0,
        }
    }

    /// Every field but the two outputs, as an object without its closing brace.
    fn head(&mut self) -> Bytes {
        // The outputs are set aside while the rest is serialised, not copied.
        let stdout = std::mem::take(&mut self.job.stdout);
        let stderr = std::mem::take(&mut self.job.stderr);
        let mut v = serde_json::to_value(&self.job).unwrap_or_default();
        self.job.stdout = stdout;
        self.job.stderr = stderr;
        if let Some(o) = v.as_object_mut() {
            o.remove("stdout");
            o.remove("stderr");
        }
        let mut text = serde_json::to_string(&v).unwrap_or_else(|_| "{".into());
        // `{...}` less its `}`, then the first output's key.
        text.pop();
        if text.len() > 1 {
            text.push(',');
        }
        text.push_str("\"stdout\":\"");
        Bytes::from(text)
    }

    /// The next escaped piece of stdout or stderr from `self.offset`, or `None` at its
    /// end.
    fn next_chunk(&mut self, stdout: bool) -> Option<Bytes> {
        if let Some(out) = &self.file {
            let (start, len) = if stdout {
                (0, out.stdout_len)
            } else {
                (out.stdout_len, out.stderr_len)
            };
            let (piece, used) = file_chunk(&out.file, start, len, self.offset as u64)?;
            self.offset += used;
            return Some(escape(&piece));
        }
        let s = if stdout {
            &self.job.stdout
        } else {
            &self.job.stderr
        };
        if self.offset >= s.len() {
            return None;
        }
        let mut end = (self.offset + CHUNK).min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let piece = escape(&s[self.offset..end]);
        self.offset = end;
        Some(piece)
    }
}

/// Up to [`CHUNK`] bytes of the region `start..start + len` of `file` from `offset`,
/// cut at a character's end; with the bytes used. `None` at the region's end (or the
/// file's, should it be shorter than recorded).
fn file_chunk(file: &std::fs::File, start: u64, len: u64, offset: u64) -> Option<(String, usize)> {
    let want = usize::try_from(len.saturating_sub(offset))
        .unwrap_or(usize::MAX)
        .min(CHUNK);
    if want == 0 {
        return None;
    }
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match file.read_at(&mut buf[got..], start + offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "reading a job's output file");
                break;
            }
        }
    }
    buf.truncate(got);
    if buf.is_empty() {
        return None;
    }
    match String::from_utf8(buf) {
        Ok(text) => Some((text, got)),
        Err(e) => {
            let utf8 = e.utf8_error();
            let valid = utf8.valid_up_to();
            if utf8.error_len().is_none() && valid > 0 {
                // A character cut by the chunk's end: it starts the next chunk.
                let mut bytes = e.into_bytes();
                bytes.truncate(valid);
                let text = String::from_utf8(bytes).unwrap_or_default();
                Some((text, valid))
            } else {
                // Not UTF-8 (a damaged file): shown as the replacement character.
                Some((String::from_utf8_lossy(e.as_bytes()).into_owned(), got))
            }
        }
    }
}

impl Iterator for Pieces {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        loop {
            match self.stage {
                Stage::Head => {
                    self.stage = Stage::Stdout;
                    return Some(self.head());
                }
                Stage::Stdout => match self.next_chunk(true) {
                    Some(b) => return Some(b),
                    None => self.stage = Stage::Between,
                },
                Stage::Between => {
                    self.stage = Stage::Stderr;
                    self.offset = 0;
                    return Some(Bytes::from_static(b"\",\"stderr\":\""));
                }
                Stage::Stderr => match self.next_chunk(false) {
                    Some(b) => return Some(b),
                    None => self.stage = Stage::Tail,
                },
                Stage::Tail => {
                    self.stage = Stage::Done;
                    return Some(Bytes::from_static(b"\"}"));
                }
                Stage::Done => return None,
            }
        }
    }
}

/// `s` escaped as the inside of a JSON string.
fn escape(s: &str) -> Bytes {
    let quoted = Bytes::from(serde_json::to_string(s).unwrap_or_default());
    // Without the quotes, and without copying.
    match quoted.len() {
        0..=1 => Bytes::new(),
        n => quoted.slice(1..n - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_protocol::compat::{CompatCommand, JobStatus};

    fn job(stdout: String, stderr: String) -> Job {
        Job {
            job_id: "job-1".into(),
            sandbox_id: "sb-1".into(),
            command: CompatCommand::Shell("echo \"hi\"".into()),
            status: JobStatus::Succeeded,
            stdout,
            stderr,
            exit_code: Some(0),
            created_at: 1.5,
            started_at: Some(2.0),
            completed_at: None,
            error: Some("quote \" and \n".into()),
            output_truncated: true,
        }
    }

    #[test]
    fn the_streamed_body_is_the_same_json_as_the_one_piece_body() {
        // Control bytes, multi-byte characters across chunk edges, quotes.
        let mut out = String::new();
        while out.len() < 3 * CHUNK + 7 {
            out.push_str("\u{1}é\"\\ línea ✓\n");
        }
        let j = job(out.clone(), "e\u{0}rr".repeat(CHUNK / 2));
        let streamed: Vec<u8> = Pieces::new(j.clone(), None)
            .flat_map(|b| b.to_vec())
            .collect();
        let parsed: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(parsed, serde_json::to_value(&j).unwrap());
        let empty = job(String::new(), String::new());
        let streamed: Vec<u8> = Pieces::new(empty.clone(), None)
            .flat_map(|b| b.to_vec())
            .collect();
        let parsed: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(parsed, serde_json::to_value(&empty).unwrap());
    }

    #[test]
    fn a_body_streamed_from_the_output_file_is_the_same_json() {
        let mut out = String::new();
        while out.len() < 2 * CHUNK + 11 {
            out.push_str("\u{1}é✓\"\\ x");
        }
        let err = "e\u{0}ü".repeat(CHUNK / 3);
        let full = job(out.clone(), err.clone());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        std::fs::write(&path, format!("{out}{err}")).unwrap();
        let file = OutputFile {
            file: std::fs::File::open(&path).unwrap(),
            stdout_len: out.len() as u64,
            stderr_len: err.len() as u64,
        };
        let bare = job(String::new(), String::new());
        let streamed: Vec<u8> = Pieces::new(bare, Some(file))
            .flat_map(|b| b.to_vec())
            .collect();
        let parsed: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(parsed, serde_json::to_value(&full).unwrap());
    }
}
