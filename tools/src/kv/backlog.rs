//! The master's bounded backlog: the most recent bytes of the log, by position.
//!
//! Positions count log bytes since the replication id began (Redis's
//! `master_repl_offset`). The backlog holds `[start, head)`; appending beyond
//! its capacity drops whole chunks from the front, so a reader whose cursor
//! falls below `start` can no longer be served from it and needs a full
//! resync. Chunks are `Bytes`: readers get slices without copying.

use std::collections::VecDeque;

use bytes::Bytes;

/// The bounded backlog of one replication id.
#[derive(Debug)]
pub struct Backlog {
    chunks: VecDeque<Bytes>,
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
        self.len += data.len() as u64;
        self.chunks.push_back(data);
        while self.len > self.capacity {
            let over = self.len - self.capacity;
            let front = self.chunks.front_mut().expect("len > 0 means a chunk");
            if front.len() as u64 <= over {
                self.start += front.len() as u64;
                self.len -= front.len() as u64;
                self.chunks.pop_front();
            } else {
                // Trim part of the oldest chunk: the capacity is exact.
                *front = front.slice(over as usize..);
                self.start += over;
                self.len -= over;
            }
        }
    }

    /// Up to `max` bytes from `position` (a slice of one chunk: callers loop).
    /// `None` when `position` is no longer (or not yet) held; an empty slice
    /// at the head.
    pub fn read(&self, position: u64, max: usize) -> Option<Bytes> {
        if !self.contains(position) {
            return None;
        }
        let mut at = self.start;
        for c in &self.chunks {
            let end = at + c.len() as u64;
            if position < end {
                let off = (position - at) as usize;
                let n = (c.len() - off).min(max);
                return Some(c.slice(off..off + n));
            }
            at = end;
        }
        Some(Bytes::new())
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
