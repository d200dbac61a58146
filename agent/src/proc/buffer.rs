//! Bounded output buffers.
//!
//! [`HeadTail`] keeps the first and last bytes of a stream of unknown length, which is
//! what a reader of a huge build log or test run wants: how it started and how it ended.
//! [`Ring`] keeps the most recent bytes of a long-running process, addressed by absolute
//! offsets so readers can resume where they stopped and learn what they missed.

use std::collections::VecDeque;

use orchard_protocol::Output;

/// Keeps at most `cap` bytes: the first `cap / 2` and the last `cap - cap / 2`.
#[derive(Debug)]
pub struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    /// An empty buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Appends bytes.
    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head.len() < self.head_cap {
            let take = (self.head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(data);
    }

    /// Bytes pushed in total.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept bytes, and where the gap is when bytes were dropped.
    pub fn finish(self) -> (Vec<u8>, Option<u64>) {
        let kept = self.head.len() + self.tail.len();
        let omitted = self.total > kept as u64;
        let gap = omitted.then_some(self.head.len() as u64);
        let mut out = self.head;
        out.extend(self.tail);
        (out, gap)
    }

    /// The wire form.
    pub fn into_output(self) -> Output {
        let total = self.total;
        let (kept, gap) = self.finish();
        Output::from_bytes(kept, total, gap)
    }
}

/// The last `cap` bytes of a stream, addressed by absolute offset.
#[derive(Debug)]
pub struct Ring {
    cap: usize,
    buf: VecDeque<u8>,
    /// Absolute offset of `buf[0]`.
    start: u64,
}

/// A read from a [`Ring`].
#[derive(Debug, PartialEq, Eq)]
pub struct RingRead {
    /// Absolute offset of the first returned byte.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
    /// Bytes between the requested offset and `offset` already dropped.
    pub lost: u64,
}

impl Ring {
    /// An empty ring of `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            buf: VecDeque::new(),
            start: 0,
        }
    }

    /// Appends bytes, dropping the oldest beyond the capacity.
    pub fn push(&mut self, data: &[u8]) {
        if data.len() >= self.cap {
            self.start += (self.buf.len() + data.len() - self.cap) as u64;
            self.buf.clear();
            self.buf.extend(&data[data.len() - self.cap..]);
            return;
        }
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.start += overflow as u64;
        self.buf.extend(data);
    }

    /// Bytes pushed in total (the offset after the last byte).
    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Up to `max` bytes from absolute offset `from`.
    pub fn read(&self, from: u64, max: usize) -> RingRead {
        let from_clamped = from.clamp(self.start, self.end());
        let lost = from_clamped - from.min(from_clamped);
        let skip = (from_clamped - self.start) as usize;
        let data: Vec<u8> = self.buf.iter().skip(skip).take(max).copied().collect();
        RingRead {
            offset: from_clamped,
            data,
            lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_tail_keeps_everything_under_the_cap() {
        let mut b = HeadTail::new(10);
        b.push(b"hello");
        b.push(b"world");
        assert_eq!(b.finish(), (b"helloworld".to_vec(), None));
    }

    #[test]
    fn head_tail_keeps_head_and_tail_over_the_cap() {
        let mut b = HeadTail::new(6);
        for chunk in [&b"abcd"[..], b"efgh", b"ijkl"] {
            b.push(chunk);
        }
        assert_eq!(b.total(), 12);
        assert_eq!(b.finish(), (b"abcjkl".to_vec(), Some(3)));
    }

    #[test]
    fn head_tail_with_one_huge_chunk() {
        let mut b = HeadTail::new(4);
        b.push(&[7u8; 1000]);
        b.push(b"xy");
        let (kept, gap) = b.finish();
        assert_eq!(kept, vec![7, 7, b'x', b'y']);
        assert_eq!(gap, Some(2));
    }

    #[test]
    fn head_tail_matches_a_naive_model() {
        // Every split of a 0..40 byte stream into pushes must keep the same bytes.
        let stream: Vec<u8> = (0..40).collect();
        for cap in [1usize, 2, 7, 8, 39, 40, 41] {
            for step in 1..9 {
                let mut b = HeadTail::new(cap);
                for chunk in stream.chunks(step) {
                    b.push(chunk);
                }
                let (kept, _) = b.finish();
                let mut expect: Vec<u8> = stream.iter().take(cap / 2).copied().collect();
                let tail_cap = cap - cap / 2;
                let rest = &stream[cap / 2..];
                expect.extend(&rest[rest.len().saturating_sub(tail_cap)..]);
                if stream.len() <= cap {
                    expect = stream.clone();
                }
                assert_eq!(kept, expect, "cap {cap} step {step}");
            }
        }
    }

    #[test]
    fn ring_reads_by_offset_and_reports_loss() {
        let mut r = Ring::new(4);
        r.push(b"abc");
        assert_eq!(
            r.read(0, 100),
            RingRead {
                offset: 0,
                data: b"abc".to_vec(),
                lost: 0
            }
        );
        r.push(b"defg");
        assert_eq!(r.end(), 7);
        assert_eq!(
            r.read(1, 100),
            RingRead {
                offset: 3,
                data: b"defg".to_vec(),
                lost: 2
            }
        );
        assert_eq!(r.read(5, 1).data, b"f".to_vec());
        assert_eq!(r.read(99, 10).offset, 7);
        r.push(&[1u8; 10]);
        assert_eq!(r.end(), 17);
        assert_eq!(r.read(0, 100).offset, 13);
    }
}
