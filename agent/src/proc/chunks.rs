//! Read buffers for a command's output that come back to their reader when the last
//! [`Bytes`] made of them is dropped.
//!
//! Why: a large output is read 256 KiB at a time and each chunk waits in the stream's
//! queue until the connection has written it. Copying each chunk into a fresh
//! allocation cost a copy and, worse, a fresh `mmap` from musl's allocator for every
//! chunk: one page fault per 4 KiB written, which measured a third of the agent's time
//! when streaming (334,000 faults for 1.3 GB). A chunk now *is* the buffer it was read
//! into, and the buffer goes back to the pool when the connection is done with it, so
//! a steady stream reuses a handful of buffers that are already faulted in.
//!
//! Invariants:
//! - a buffer in the pool is empty (`len == 0`) and keeps its capacity;
//! - at most [`MAX_LOANED`] buffers are out as chunks at once: the reader waits for one
//!   to come back before handing over another (backpressure, like a full queue), so a
//!   stream holds at most `MAX_LOANED` + 1 buffers (the loans and the one being read
//!   into: 2.25 MiB at 256 KiB) however slow its consumer, and the pool never needs to
//!   allocate past that; the pool lives as long as its reader;
//! - the pool keeps at most [`MAX_LOANED`] empty buffers;
//! - a small read is copied out (see [`ChunkPool::chunk`]) so that a short line never
//!   pins a 256 KiB buffer while it waits in a queue.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Buffers out as chunks at once, and kept for reuse, per pool.
pub const MAX_LOANED: usize = 8;

/// Reads shorter than this are copied into a chunk of their own size; longer ones hand
/// over their buffer.
pub const HAND_OVER_AT: usize = 16 * 1024;

/// Empty buffers waiting for their next read.
#[derive(Debug)]
pub struct ChunkPool {
    free: Mutex<Vec<Vec<u8>>>,
    loans: Arc<Semaphore>,
}

impl ChunkPool {
    /// A new, empty pool.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            free: Mutex::new(Vec::new()),
            loans: Arc::new(Semaphore::new(MAX_LOANED)),
        })
    }

    /// An empty buffer of at least `capacity` bytes: a pooled one when there is one,
    /// else a new allocation. Pooled buffers that are too small are dropped.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(buf) = free.pop() {
            if buf.capacity() >= capacity {
                return buf;
            }
        }
        Vec::with_capacity(capacity)
    }

    /// Buffers in the pool now.
    pub fn pooled(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < MAX_LOANED {
            free.push(buf);
        }
    }

    /// Turns the bytes read into `buf` into a chunk. A large read hands `buf` over (it
    /// comes back to this pool when the chunk's last clone is dropped) and `buf` is
    /// replaced by an empty buffer of at least `next` bytes; a small one is copied and
    /// `buf` is emptied for the next read. Handing over waits while [`MAX_LOANED`]
    /// chunks are out.
    pub async fn chunk(self: &Arc<Self>, buf: &mut Vec<u8>, next: usize) -> Bytes {
        let permit = if buf.len() < HAND_OVER_AT {
            None
        } else {
            // The semaphore is never closed; were it, the read is copied instead.
            self.loans.clone().acquire_owned().await.ok()
        };
        let Some(permit) = permit else {
            let out = Bytes::copy_from_slice(buf);
            buf.clear();
            return out;
        };
        let full = std::mem::replace(buf, self.take(next));
        Bytes::from_owner(Pooled {
            buf: full,
            pool: self.clone(),
            _permit: permit,
        })
    }
}

/// A buffer on loan as a [`Bytes`]; returns to its pool on drop.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<ChunkPool>,
    /// Released after the buffer is back in the pool (fields drop after `drop`).
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_large_chunk_hands_over_its_buffer_and_it_comes_back_when_dropped() {
        let pool = ChunkPool::new();
        let mut buf = pool.take(64 * 1024);
        buf.extend(std::iter::repeat_n(7u8, 40_000));
        let first = buf.as_ptr();
        let chunk = pool.chunk(&mut buf, 64 * 1024).await;
        assert_eq!(chunk.len(), 40_000);
        assert!(chunk.iter().all(|b| *b == 7));
        assert_eq!(chunk.as_ptr(), first, "the chunk is the buffer, not a copy");
        assert!(buf.is_empty() && buf.capacity() >= 64 * 1024);
        assert_eq!(pool.pooled(), 0);
        let clone = chunk.slice(10..20);
        drop(chunk);
        assert_eq!(pool.pooled(), 0, "a slice still holds the buffer");
        drop(clone);
        assert_eq!(pool.pooled(), 1);
        let again = pool.take(64 * 1024);
        assert_eq!(again.as_ptr(), first, "the next read reuses it");
        assert!(again.is_empty());
    }

    #[tokio::test]
    async fn a_small_read_is_copied_and_the_buffer_stays_with_the_reader() {
        let pool = ChunkPool::new();
        let mut buf = pool.take(256 * 1024);
        buf.extend_from_slice(b"one line\n");
        let kept = buf.as_ptr();
        let chunk = pool.chunk(&mut buf, 64 * 1024).await;
        assert_eq!(&chunk[..], b"one line\n");
        assert_ne!(chunk.as_ptr(), kept);
        assert_eq!(buf.as_ptr(), kept);
        assert!(buf.is_empty());
    }

    #[tokio::test]
    async fn at_most_max_loaned_chunks_are_out_and_the_reader_waits_for_one_to_return() {
        let pool = ChunkPool::new();
        let mut out = Vec::new();
        for _ in 0..MAX_LOANED {
            let mut buf = pool.take(HAND_OVER_AT);
            buf.resize(HAND_OVER_AT, 1);
            out.push(pool.chunk(&mut buf, 64 * 1024).await);
        }
        let mut buf = pool.take(HAND_OVER_AT);
        buf.resize(HAND_OVER_AT, 2);
        let waiting = tokio::time::timeout(
            Duration::from_millis(50),
            pool.chunk(&mut buf, HAND_OVER_AT),
        )
        .await;
        assert!(waiting.is_err(), "a ninth chunk must wait");
        assert_eq!(buf.len(), HAND_OVER_AT, "nothing was taken from the buffer");
        drop(out.pop());
        let ninth = pool.chunk(&mut buf, 64 * 1024).await;
        assert!(ninth.iter().all(|b| *b == 2));
        drop(out);
        drop(ninth);
        assert_eq!(
            pool.pooled(),
            MAX_LOANED,
            "every buffer came back, none past the cap"
        );
        let big = pool.take(HAND_OVER_AT * 4);
        assert!(big.capacity() >= HAND_OVER_AT * 4);
        assert_eq!(pool.pooled(), 0, "smaller buffers were dropped on the way");
    }
}
