//! The compatible file upload (`POST /sandboxes/{id}/files`, `{"path", "content":
//! base64}`) read as a stream: the body is parsed as it arrives and the content is
//! decoded straight into a spool file, so memory stays bounded whatever the size (a
//! 512 MiB body used to be held whole, then decoded whole next to it).
//!
//! [`UploadParser`] is a small push parser for exactly this object: keys in any order,
//! `path` a short JSON string, `content` a base64 string (the `\/` escape some encoders
//! write is accepted), any other key skipped whatever its value. Malformed JSON is a 400,
//! a missing or mistyped field a 422, as the buffered route answered.

use base64::Engine;

use crate::service::json::parse_json;
use crate::service::Error;

/// Longest `path` accepted.
const MAX_PATH: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Before `{`.
    Start,
    /// After `{` or `,`: a key or (after `{` only) `}`.
    Key { first: bool },
    /// Inside a key string.
    InKey { escaped: bool },
    /// After a key: `:`.
    Colon,
    /// After `:`: the value of the current key.
    Value,
    /// Inside `path`'s string.
    InPath { escaped: bool },
    /// Inside `content`'s string.
    InContent { escaped: bool },
    /// Skipping another key's value: nesting depth, inside a string, after a backslash.
    Skip {
        depth: u32,
        in_string: bool,
        escaped: bool,
        started: bool,
    },
    /// After a value: `,` or `}`.
    After,
    /// After the closing `}`: only whitespace.
    Done,
    /// Not an object: the body is kept (up to [`MAX_RAW`]) for the JSON parser to say
    /// whether it is malformed (400) or the wrong shape (422).
    Raw,
}

/// Most of a non-object body kept to classify it.
const MAX_RAW: usize = 64 << 10;

/// What the parser found, once the body ended.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    /// The `path` field.
    pub path: String,
    /// Decoded bytes of `content` (written to the sink as they came).
    pub size: u64,
}

/// Push parser of the upload body; decoded content goes to `sink`.
pub struct UploadParser<W> {
    state: State,
    key: Vec<u8>,
    path: Option<Vec<u8>>,
    content_seen: bool,
    /// Base64 characters waiting for a whole group of four.
    pending: Vec<u8>,
    /// A field of the wrong type: answered (422) once the rest proved to be JSON.
    deferred: Option<Error>,
    raw: Vec<u8>,
    size: u64,
    sink: W,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::BadRequest(format!("malformed JSON: {}", msg.into()))
}

fn unprocessable(msg: impl Into<String>) -> Error {
    Error::Unprocessable(msg.into())
}

impl<W: std::io::Write> UploadParser<W> {
    /// A parser writing decoded content to `sink`.
    pub fn new(sink: W) -> Self {
        UploadParser {
            state: State::Start,
            key: Vec::new(),
            path: None,
            content_seen: false,
            pending: Vec::new(),
            deferred: None,
            raw: Vec::new(),
            size: 0,
            sink,
        }
    }

    fn flush_groups(&mut self, last: bool) -> Result<(), Error> {
        let mut whole = if last {
            self.pending.len()
        } else {
            self.pending.len() / 4 * 4
        };
        // Padding is valid only at the very end of the content: a padded group waits
        // for the end, and anything after one is refused (decoded group by group,
        // `aGk=` then `aGk=` would pass where `aGk=aGk=` does not).
        if !last {
            if let Some(at) = self.pending[..whole].iter().position(|&b| b == b'=') {
                let group_end = at / 4 * 4 + 4;
                if group_end < self.pending.len() {
                    return Err(Error::BadRequest(
                        "content is not valid base64: padding before the end".into(),
                    ));
                }
                whole = group_end - 4;
            }
        }
        if whole == 0 {
            return Ok(());
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.pending[..whole])
            .map_err(|e| Error::BadRequest(format!("content is not valid base64: {e}")))?;
        self.sink.write_all(&bytes).map_err(|e| {
            Error::internal("cannot spool the upload", format!("writing the spool: {e}"))
        })?;
        self.size += bytes.len() as u64;
        self.pending.drain(..whole);
        Ok(())
    }

    /// Bytes of content decoded into the sink so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Feeds the next piece of the body.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Error> {
        for &c in chunk {
            self.byte(c)?;
        }
        // Decode what is complete now, so `pending` never holds more than a chunk.
        if matches!(self.state, State::InContent { .. }) {
            self.flush_groups(false)?;
        }
        Ok(())
    }

    /// Feeds one byte to the state machine.
    // Over 100 lines because it is the state machine's one match: a transition per arm.
    fn byte(&mut self, c: u8) -> Result<(), Error> {
        let ws = matches!(c, b' ' | b'\t' | b'\n' | b'\r');
        self.state = match self.state {
            State::Start if ws => State::Start,
            State::Start if c == b'{' => State::Key { first: true },
            State::Start | State::Raw => {
                if self.raw.len() >= MAX_RAW {
                    return Err(bad("not an object"));
                }
                self.raw.push(c);
                State::Raw
            }
            State::Key { first } if ws => State::Key { first },
            State::Key { first: true } if c == b'}' => State::Done,
            State::Key { .. } if c == b'"' => {
                self.key.clear();
                State::InKey { escaped: false }
            }
            State::Key { .. } => return Err(bad("expected a key")),
            State::InKey { escaped: true } => {
                self.key.push(c);
                State::InKey { escaped: false }
            }
            State::InKey { escaped: false } if c == b'\\' => State::InKey { escaped: true },
            State::InKey { escaped: false } if c == b'"' => State::Colon,
            State::InKey { escaped: false } => {
                if self.key.len() < 64 {
                    self.key.push(c);
                }
                State::InKey { escaped: false }
            }
            State::Colon if ws => State::Colon,
            State::Colon if c == b':' => State::Value,
            State::Colon => return Err(bad("expected ':'")),
            State::Value if ws => State::Value,
            State::Value => match (self.key.as_slice(), c) {
                (b"path", b'"') => {
                    self.path = Some(Vec::new());
                    State::InPath { escaped: false }
                }
                (b"content", b'"') => {
                    if self.content_seen {
                        return Err(bad("`content` given twice"));
                    }
                    self.content_seen = true;
                    self.pending.clear();
                    State::InContent { escaped: false }
                }
                (b"path" | b"content", _) => {
                    if self.deferred.is_none() {
                        self.deferred = Some(unprocessable(format!(
                            "invalid request: {}: expected a string",
                            String::from_utf8_lossy(&self.key)
                        )));
                    }
                    self.state = State::Skip {
                        depth: 0,
                        in_string: false,
                        escaped: false,
                        started: false,
                    };
                    return self.skip(c);
                }
                _ => {
                    let mut st = State::Skip {
                        depth: 0,
                        in_string: false,
                        escaped: false,
                        started: false,
                    };
                    std::mem::swap(&mut self.state, &mut st);
                    return self.skip(c);
                }
            },
            State::InPath { escaped } => {
                let path = self.path.get_or_insert_with(Vec::new);
                if path.len() > MAX_PATH {
                    return Err(Error::BadRequest(format!(
                        "path: longer than {MAX_PATH} bytes"
                    )));
                }
                match (escaped, c) {
                    (false, b'\\') => State::InPath { escaped: true },
                    (false, b'"') => State::After,
                    (false, _) => {
                        path.push(c);
                        State::InPath { escaped: false }
                    }
                    (true, _) => {
                        // Kept escaped; the whole string is decoded by serde at the end.
                        path.extend_from_slice(&[b'\\', c]);
                        State::InPath { escaped: false }
                    }
                }
            }
            State::InContent { escaped: true } => match c {
                b'/' => {
                    self.pending.push(b'/');
                    State::InContent { escaped: false }
                }
                _ => {
                    return Err(Error::BadRequest(
                        "content is not valid base64: an escaped character".into(),
                    ))
                }
            },
            State::InContent { escaped: false } => match c {
                b'\\' => State::InContent { escaped: true },
                b'"' => {
                    self.flush_groups(true)?;
                    State::After
                }
                _ => {
                    self.pending.push(c);
                    State::InContent { escaped: false }
                }
            },
            State::Skip { .. } => return self.skip(c),
            State::After if ws => State::After,
            State::After if c == b',' => State::Key { first: false },
            State::After if c == b'}' => State::Done,
            State::After => return Err(bad("expected ',' or '}'")),
            State::Done if ws => State::Done,
            State::Done => return Err(bad("trailing characters")),
        };
        Ok(())
    }

    /// One byte of a skipped value (any JSON value: scalar, string, array, object).
    fn skip(&mut self, c: u8) -> Result<(), Error> {
        let State::Skip {
            mut depth,
            mut in_string,
            mut escaped,
            started,
        } = self.state
        else {
            return Ok(());
        };
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match c {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth > 0 => depth -= 1,
                b',' | b'}' if depth == 0 => {
                    // The end of a scalar: this byte belongs to the object.
                    self.state = State::After;
                    return self.byte(c);
                }
                _ => {}
            }
        }
        let done = started && depth == 0 && !in_string && matches!(c, b'"' | b'}' | b']');
        self.state = if done {
            State::After
        } else {
            State::Skip {
                depth,
                in_string,
                escaped,
                started: true,
            }
        };
        Ok(())
    }

    /// Ends the body: the fields found, and the sink back.
    pub fn finish(mut self) -> Result<(Parsed, W), Error> {
        match self.state {
            State::Done => {}
            State::Start => return Err(Error::BadRequest("expected a JSON body".into())),
            State::Raw => {
                return Err(
                    match parse_json::<serde_json::Map<String, serde_json::Value>>(&self.raw) {
                        Err(e) => e,
                        Ok(_) => bad("not an object"),
                    },
                )
            }
            _ => return Err(bad("the body ended early")),
        }
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let Some(raw) = self.path.take() else {
            return Err(unprocessable("invalid request: missing field `path`"));
        };
        if !self.content_seen {
            return Err(unprocessable("invalid request: missing field `content`"));
        }
        let mut quoted = Vec::with_capacity(raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(&raw);
        quoted.push(b'"');
        let path: String =
            serde_json::from_slice(&quoted).map_err(|e| bad(format!("path: {e}")))?;
        Ok((
            Parsed {
                path,
                size: self.size,
            },
            self.sink,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HTTP status the API answers for `e`.
    fn http_status(e: &Error) -> u16 {
        orchard_protocol::ServiceErrorCode::from(e).http_status()
    }

    fn parse_in_pieces(body: &[u8], piece: usize) -> Result<(Parsed, Vec<u8>), Error> {
        let mut p = UploadParser::new(Vec::new());
        for chunk in body.chunks(piece.max(1)) {
            p.push(chunk)?;
        }
        p.finish()
    }

    #[test]
    fn any_split_of_the_body_gives_the_same_file() {
        let body = br#" {"extra": {"a": [1, "x\"}"]}, "content": "aGk\/aGVsbG8=", "n": 5, "path": "/w/a \u00e9.txt"} "#;
        for piece in 1..body.len() {
            let (parsed, bytes) = parse_in_pieces(body, piece).unwrap();
            assert_eq!(parsed.path, "/w/a é.txt");
            assert_eq!(
                bytes,
                base64::engine::general_purpose::STANDARD
                    .decode("aGk/aGVsbG8=")
                    .unwrap()
            );
            assert_eq!(parsed.size, bytes.len() as u64);
        }
    }

    #[test]
    fn regression_base64_padding_before_the_end_is_a_400_however_the_body_is_cut() {
        let body = br#"{"path": "/a", "content": "aGk=aGk="}"#;
        for piece in 1..=body.len() {
            let err = parse_in_pieces(body, piece).err();
            assert_eq!(err.map(|e| http_status(&e)), Some(400), "pieces of {piece}");
        }
        let padded_last = br#"{"path": "/a", "content": "aGVsbG8haGk="}"#;
        for piece in 1..=padded_last.len() {
            let (_, bytes) = parse_in_pieces(padded_last, piece).unwrap();
            assert_eq!(bytes, b"hello!hi", "pieces of {piece}");
        }
    }

    #[test]
    fn bad_bodies_are_400_and_missing_or_mistyped_fields_422() {
        let status = |b: &[u8]| {
            parse_in_pieces(b, 3)
                .map(|_| 0)
                .unwrap_or_else(|e| http_status(&e))
        };
        assert_eq!(status(b"not json"), 400);
        assert_eq!(status(br#"{"path": "/a", "content": "!!!!"}"#), 400);
        assert_eq!(
            status(br#"{"path": "/a", "content": "aGk="#),
            400,
            "cut short"
        );
        assert_eq!(status(br#"{"path": "/a", "content": "aGk="} x"#), 400);
        assert_eq!(status(b""), 400, "empty");
        assert_eq!(status(b"[]"), 422, "JSON, not an object");
        assert_eq!(status(br#"{"path": 5, "content": "#), 400, "malformed wins");
        assert_eq!(status(br#"{"path": "/a"}"#), 422);
        assert_eq!(status(br#"{"content": "aGk="}"#), 422);
        assert_eq!(status(br#"{"path": 5, "content": "aGk="}"#), 422);
        assert_eq!(status(br#"{"path": "/a", "content": null}"#), 422);
        assert_eq!(
            status(br#"{"path": "/a", "content": ""}"#),
            0,
            "an empty file"
        );
    }
}
