//! A compatible job as a response body, streamed when its output is big.
//!
//! Orchard's wire format puts a job's whole stdout and stderr in JSON strings, where a
//! control byte takes six bytes (`\u0001`): issue 30 saw one job of 2 x 64 MiB answer
//! with 805 MB, built in memory for every GET and serialised on the server's one worker
//! thread while every other tenant's call waited. Past [`STREAM_ABOVE`] bytes of output
//! the body is therefore made as it is sent: the small fields first, then each stream
//! escaped [`CHUNK`] bytes at a time, so a read costs the job's own bytes plus one
//! chunk, and the worker returns to other requests between chunks (it yields after
//! each). Smaller jobs keep the one-piece `Json` answer.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use orchard_protocol::compat::Job;

/// Output (stdout and stderr together) past which the body is streamed.
pub const STREAM_ABOVE: usize = 1 << 20;
/// Bytes of output escaped per piece of the body.
const CHUNK: usize = 64 << 10;

/// The response for `job`.
pub fn job_response(job: Job) -> Response {
    if job.stdout.len() + job.stderr.len() <= STREAM_ABOVE {
        return Json(job).into_response();
    }
    // One piece per poll, and the task yields between pieces: a client reading as
    // fast as the server escapes would otherwise keep the worker for a whole budget of
    // writes (tokio's 128), tens of MiB of escaping, while other calls wait.
    let pieces = futures_util::stream::unfold(Pieces::new(job), |mut pieces| async move {
        tokio::task::yield_now().await;
        pieces
            .next()
            .map(|b| (Ok::<_, std::convert::Infallible>(b), pieces))
    });
    let mut response = Body::from_stream(pieces).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The body's pieces, made one at a time.
struct Pieces {
    job: Job,
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
    fn new(job: Job) -> Pieces {
        Pieces {
            job,
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

    /// The next escaped piece of `which` from `self.offset`, or `None` at its end.
    fn next_chunk(&mut self, stdout: bool) -> Option<Bytes> {
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
    let quoted = serde_json::to_string(s).unwrap_or_default();
    let inner = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or("");
    Bytes::copy_from_slice(inner.as_bytes())
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
        let streamed: Vec<u8> = Pieces::new(j.clone()).flat_map(|b| b.to_vec()).collect();
        let parsed: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(parsed, serde_json::to_value(&j).unwrap());
        let empty = job(String::new(), String::new());
        let streamed: Vec<u8> = Pieces::new(empty.clone())
            .flat_map(|b| b.to_vec())
            .collect();
        let parsed: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(parsed, serde_json::to_value(&empty).unwrap());
    }
}
