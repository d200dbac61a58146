//! Captured command output on the wire.
//!
//! Output is bytes, not text: a program may print anything. [`Output`] carries the kept
//! bytes as UTF-8 when they are valid UTF-8 (the common case, readable with curl) and as
//! base64 otherwise, and says which; [`Output::bytes`] gives the exact bytes back either
//! way. When a stream was larger than its cap, the head and the tail are kept and
//! `omitted_at` marks where the middle was cut.

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How [`Output::data`] is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// `data` is the bytes themselves (they were valid UTF-8).
    Utf8,
    /// `data` is standard base64 with padding.
    Base64,
}

/// One captured stream (stdout or stderr).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Output {
    /// The kept bytes, encoded as `encoding` says.
    pub data: String,
    /// Encoding of `data`.
    pub encoding: Encoding,
    /// True when bytes were dropped from the middle because the stream exceeded its cap.
    pub truncated: bool,
    /// Bytes the process wrote to this stream in total, kept or not.
    pub total_bytes: u64,
    /// When truncated: offset in the decoded `data` where the omitted bytes were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted_at: Option<u64>,
}

impl Output {
    /// Encodes kept bytes, choosing UTF-8 when possible.
    pub fn from_bytes(kept: Vec<u8>, total_bytes: u64, omitted_at: Option<u64>) -> Self {
        let truncated = omitted_at.is_some();
        let (data, encoding) = match String::from_utf8(kept) {
            Ok(text) => (text, Encoding::Utf8),
            Err(err) => (b64_encode(err.as_bytes()), Encoding::Base64),
        };
        Self {
            data,
            encoding,
            truncated,
            total_bytes,
            omitted_at,
        }
    }

    /// The exact kept bytes.
    pub fn bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        match self.encoding {
            Encoding::Utf8 => Ok(self.data.clone().into_bytes()),
            Encoding::Base64 => b64_decode(&self.data),
        }
    }

    /// The kept bytes as text, replacing invalid UTF-8 sequences.
    pub fn text_lossy(&self) -> String {
        match self.bytes() {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => String::new(),
        }
    }
}

/// Standard base64 with padding, as used for every binary field on the wire.
pub fn b64_encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard base64 with padding.
pub fn b64_decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_utf8_is_sent_as_text() {
        let out = Output::from_bytes(b"hello\n".to_vec(), 6, None);
        assert_eq!(out.encoding, Encoding::Utf8);
        assert_eq!(out.data, "hello\n");
        assert!(!out.truncated);
    }

    #[test]
    fn binary_is_sent_as_base64_and_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        let out = Output::from_bytes(bytes.clone(), 256, None);
        assert_eq!(out.encoding, Encoding::Base64);
        assert_eq!(out.bytes().unwrap(), bytes);
    }
}
