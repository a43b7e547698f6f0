//! The simulated wire: packets in flight with a delivery time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::packet::Packet;

struct Timed {
    at: Instant,
    seq: u64,
    pkt: Packet,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    // Min-heap on (time, sequence): equal times keep send order.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Packets in flight with a delivery time.
#[derive(Default)]
pub(crate) struct Wire {
    heap: BinaryHeap<Timed>,
    seq: u64,
}

impl Wire {
    /// Packets in flight.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Hold `pkt` until `at`.
    pub(crate) fn hold(&mut self, at: Instant, pkt: Packet) {
        let seq = self.seq;
        self.seq += 1;
        self.heap.push(Timed { at, seq, pkt });
    }

    /// When the next packet is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|t| t.at)
    }

    /// The next packet due at or before `now`, in (time, send order).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Packet> {
        if self.heap.peek()?.at > now {
            return None;
        }
        self.heap.pop().map(|t| t.pkt)
    }
}
