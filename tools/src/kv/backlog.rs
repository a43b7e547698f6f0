//! The master's bounded backlog: the most recent bytes of the log, by position.
//!
//! Positions count log bytes since the replication id began (Redis's
//! `master_repl_offset`). The backlog holds `[start, head)`; appending beyond
//! its capacity drops whole chunks from the front, so a reader whose cursor
//! falls below `start` can no longer be served from it and needs a full
//! resync. Chunks are `Bytes`: readers get slices without copying.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// A read whose first chunk offers fewer bytes than this (and than the
/// reader's `max`) gathers the chunks after it into one piece: a log that
/// arrives in small pieces (a Redis master's stream of small commands comes
/// in reads of a few hundred bytes) still goes out in chunks of the size the
/// reader asked for, not in as many tiny frames and QUIC writes.
pub const GATHER_BELOW: usize = 64 << 10;

/// The bounded backlog of one replication id.
#[derive(Debug)]
pub struct Backlog {
    /// The chunks, oldest first, each with the position of its first byte
    /// (ascending and contiguous, so a reader's chunk is found by binary
    /// search however many small chunks are held).
    chunks: VecDeque<(u64, Bytes)>,
    /// Position of the first byte of `chunks[0]`.
    start: u64,
    /// Bytes held.
    len: u64,
    capacity: u64,
}

impl Backlog {
    /// An empty backlog whose log begins at `position`, holding at most
    /// `capacity` bytes (at least one byte).
    pub fn new(position: u64, capacity: u64) -> Backlog {
        Backlog {
            chunks: VecDeque::new(),
            start: position,
            len: 0,
            capacity: capacity.max(1),
        }
    }

    /// The first position still held.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The position after the last byte appended.
    pub fn head(&self) -> u64 {
        self.start + self.len
    }

    /// Bytes held now.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most bytes it holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether a reader at `position` can be served from here.
    pub fn contains(&self, position: u64) -> bool {
        (self.start..=self.head()).contains(&position)
    }

    /// Append `data` at the head, dropping the oldest chunks beyond capacity.
    /// A chunk larger than the whole capacity keeps only its tail.
    pub fn append(&mut self, mut data: Bytes) {
        if data.is_empty() {
            return;
        }
        if data.len() as u64 > self.capacity {
            let cut = data.len() - self.capacity as usize;
            let head = self.head() + cut as u64;
            self.chunks.clear();
            self.len = 0;
            self.start = head;
            data = data.slice(cut..);
        }
        let at = self.head();
        self.len += data.len() as u64;
        self.chunks.push_back((at, data));
        while self.len > self.capacity {
            let over = self.len - self.capacity;
            let (front_at, front) = self.chunks.front_mut().expect("len > 0 means a chunk");
            if front.len() as u64 <= over {
                self.start += front.len() as u64;
                self.len -= front.len() as u64;
                self.chunks.pop_front();
            } else {
                // Trim part of the oldest chunk: the capacity is exact.
                *front = front.slice(over as usize..);
                *front_at += over;
                self.start += over;
                self.len -= over;
            }
        }
    }

    /// Up to `max` bytes from `position` (callers loop): a slice of the
    /// chunk holding it, without a copy, when that offers `max` bytes or at
    /// least [`GATHER_BELOW`]; else that slice and the chunks after it copied
    /// into one piece of up to `max` bytes. `None` when `position` is no
    /// longer (or not yet) held; an empty slice at the head.
    ///
    /// The cost is logarithmic in the number of chunks held (plus the bytes
    /// gathered), not linear: a backlog of 64 MiB in pieces of a few hundred
    /// bytes holds hundreds of thousands of chunks, and every session reads
    /// it under the master's lock after every append.
    pub fn read(&self, position: u64, max: usize) -> Option<Bytes> {
        if !self.contains(position) {
            return None;
        }
        // The first chunk ending after `position`.
        let i = self
            .chunks
            .partition_point(|(at, c)| at + c.len() as u64 <= position);
        let Some((at, c)) = self.chunks.get(i) else {
            return Some(Bytes::new());
        };
        let off = (position - at) as usize;
        let first = c.slice(off..off + (c.len() - off).min(max));
        if first.len() >= max.min(GATHER_BELOW) || i + 1 == self.chunks.len() {
            return Some(first);
        }
        let want = (max as u64).min(self.head() - position) as usize;
        let mut out = BytesMut::with_capacity(want);
        out.extend_from_slice(&first);
        for (_, c) in self.chunks.range(i + 1..) {
            let n = (want - out.len()).min(c.len());
            out.extend_from_slice(&c[..n]);
            if out.len() == want {
                break;
            }
        }
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the appends, the backlog holds exactly the last
        /// `capacity` bytes of the log and reads them back by position.
        #[test]
        fn holds_the_tail(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..40),
                          cap in 1u64..2000, base in 0u64..1_000_000) {
            let mut b = Backlog::new(base, cap);
            let mut all = Vec::new();
            for c in chunks {
                all.extend_from_slice(&c);
                b.append(Bytes::from(c));
            }
            prop_assert_eq!(b.head(), base + all.len() as u64);
            prop_assert_eq!(b.len(), (all.len() as u64).min(cap));
            let mut pos = b.start();
            let mut got = Vec::new();
            while pos < b.head() {
                let s = b.read(pos, 77).unwrap();
                prop_assert!(!s.is_empty() && s.len() <= 77);
                pos += s.len() as u64;
                got.extend_from_slice(&s);
            }
            prop_assert_eq!(&got[..], &all[all.len() - got.len()..]);
            prop_assert!(b.start() == base || b.read(b.start() - 1, 1).is_none());
        }
    }

    #[test]
    fn small_chunks_are_read_together_up_to_max() {
        let mut b = Backlog::new(1000, 1 << 20);
        for i in 0..100u8 {
            b.append(Bytes::from(vec![i; 10]));
        }
        // From inside a chunk, across the chunks after it, up to `max`.
        let r = b.read(1005, 64).unwrap();
        assert_eq!(r.len(), 64);
        assert_eq!(&r[..5], &[0; 5]);
        assert_eq!(&r[5..15], &[1; 10]);
        assert_eq!(r[63], 6);
        // Up to the head at most.
        assert_eq!(b.read(1990, 4096).unwrap(), Bytes::from(vec![99; 10]));
        assert_eq!(b.read(1980, 4096).unwrap().len(), 20);
        // A large chunk is handed out as it is, without the ones after it.
        let mut b = Backlog::new(0, 1 << 20);
        b.append(Bytes::from(vec![1; GATHER_BELOW]));
        b.append(Bytes::from_static(b"x"));
        assert_eq!(b.read(0, 1 << 20).unwrap().len(), GATHER_BELOW);
        assert_eq!(b.read(1, 1 << 20).unwrap().len(), GATHER_BELOW);
    }

    #[test]
    fn many_small_chunks_are_read_in_pieces_of_max() {
        // 64 MiB in 300-byte appends (~220k chunks, as a Redis master's
        // stream of small commands arrives): a reader from the start gets
        // pieces of the size it asked for, not one frame per append, and
        // every byte in order. (Finding a reader's chunk is a binary search;
        // its cost was measured for RESULTS.md, not timed here.)
        let mut b = Backlog::new(0, 64 << 20);
        let mut pos = 0;
        for n in 0..(64u32 << 20) / 300 {
            let piece = vec![(n % 251) as u8; 300];
            b.append(Bytes::from(piece));
            // A caught-up reader looks at the head after every append.
            assert!(b.read(b.head(), 128 << 10).unwrap().is_empty());
            pos += b.read(pos, 128 << 10).unwrap().len() as u64;
        }
        assert_eq!(pos, b.head());
        assert_eq!(b.start(), 0, "64 MiB fit: nothing trimmed");
        let (mut pos, mut reads) = (0, 0);
        while pos < b.head() {
            let r = b.read(pos, 128 << 10).unwrap();
            for (k, v) in r.iter().enumerate() {
                let at = pos + k as u64;
                assert_eq!(*v as u64, (at / 300) % 251, "byte {at}");
            }
            pos += r.len() as u64;
            reads += 1;
        }
        assert_eq!(reads, (b.head() - b.start()).div_ceil(128 << 10));
    }

    #[test]
    fn a_reader_past_the_head_or_below_the_start_is_refused() {
        let mut b = Backlog::new(100, 10);
        b.append(Bytes::from_static(b"0123456789abc"));
        assert_eq!(b.start(), 103);
        assert_eq!(b.read(102, 5), None);
        assert_eq!(b.read(103, 3).unwrap(), Bytes::from_static(b"345"));
        assert_eq!(b.read(113, 3).unwrap(), Bytes::new());
        assert_eq!(b.read(114, 3), None);
    }
}
