//! Binary framing of a streamed exec, for clients that ask for it with
//! `Accept: application/vnd.orchard.exec-frames` on `POST /v1/exec/stream` (NDJSON with
//! base64 output stays the default).
//!
//! Why: NDJSON frames carry output as base64 inside JSON, which costs a third more bytes
//! and an encode and a decode per chunk; a client reading a large output through it got
//! a fraction of a pipe's speed. Here output is carried as it was read.
//!
//! A frame is a 5-byte header, then the payload:
//!
//! | bytes | meaning |
//! |---|---|
//! | 0 | kind: 1 stdout bytes, 2 stderr bytes, 3 an [`ExecEvent`](crate::ExecEvent) as JSON |
//! | 1..5 | payload length, unsigned 32-bit big-endian |
//!
//! Kind 3 carries the events NDJSON has (`start`, `exit`, `error`, `keepalive`) in the
//! same JSON, without the newline; output never comes as kind 3. A reader must skip
//! frames of a kind it does not know (the payload length says how far).

/// Media type of the binary framing.
pub const EXEC_FRAMES: &str = "application/vnd.orchard.exec-frames";

/// Bytes of a frame's header.
pub const HEADER_LEN: usize = 5;

/// Kind of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Bytes the command wrote to stdout.
    Stdout,
    /// Bytes the command wrote to stderr.
    Stderr,
    /// An exec event as JSON.
    Event,
    /// A kind this version does not know (skip it).
    Unknown(u8),
}

impl FrameKind {
    /// The kind's byte.
    pub fn byte(self) -> u8 {
        match self {
            FrameKind::Stdout => 1,
            FrameKind::Stderr => 2,
            FrameKind::Event => 3,
            FrameKind::Unknown(b) => b,
        }
    }

    /// The kind of byte `b`.
    pub fn from_byte(b: u8) -> FrameKind {
        match b {
            1 => FrameKind::Stdout,
            2 => FrameKind::Stderr,
            3 => FrameKind::Event,
            b => FrameKind::Unknown(b),
        }
    }
}

/// The header of a frame of `kind` with `len` payload bytes (`len` must fit in 32
/// bits: output chunks are at most 256 KiB).
pub fn header(kind: FrameKind, len: usize) -> [u8; HEADER_LEN] {
    let n = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    [kind.byte(), n[0], n[1], n[2], n[3]]
}

/// The kind and payload length of the frame starting `buf`, if its header is whole.
pub fn parse_header(buf: &[u8]) -> Option<(FrameKind, usize)> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    Some((FrameKind::from_byte(buf[0]), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let h = header(FrameKind::Stderr, 70_000);
        assert_eq!(h, [2, 0, 1, 0x11, 0x70]);
        assert_eq!(parse_header(&h), Some((FrameKind::Stderr, 70_000)));
        assert_eq!(parse_header(&h[..4]), None);
        assert_eq!(
            parse_header(&[9, 0, 0, 0, 0]),
            Some((FrameKind::Unknown(9), 0))
        );
    }
}
