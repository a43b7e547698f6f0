//! Unreliable datagrams (RFC 9221) on a connection.
//!
//! Received datagrams are moved (not copied) out of quinn-proto into an
//! engine-owned queue per connection at the end of every poll
//! ([`RecvDatagrams`]), because quinn-proto drops the oldest datagram of a
//! full receive buffer silently and shows neither its fill level nor the
//! drop. Owning the queue lets the engine bound it by the application's
//! choice ([`EngineConfig::datagram_recv_buffer`](super::EngineConfig::datagram_recv_buffer)),
//! count what is dropped and say so ([`Event::DatagramsDropped`](super::Event::DatagramsDropped)).

use std::collections::VecDeque;

use bytes::Bytes;
use quinn_proto::{Connection, ConnectionStats, SendDatagramError};

use super::{ConnHandle, Engine, EngineError};
use crate::fabric::{Timestamp, UdQueuePair};

/// What a queued datagram costs beyond its payload, as quinn-proto counts
/// its own buffer (the `Bytes` handle): the same default size then holds the
/// same number of datagrams as before the engine owned the queue.
const PER_DATAGRAM_OVERHEAD: usize = size_of::<Bytes>();

/// One connection's received datagrams (see [`Engine::datagram_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatagramStats {
    /// DATAGRAM frames received from the peer (quinn-proto's count, so it
    /// includes those quinn-proto itself dropped before the engine saw them).
    pub received: u64,
    /// Datagrams handed to the application by [`Engine::recv_datagram`].
    pub delivered: u64,
    /// Datagrams dropped unread: the oldest go when the receive buffer is
    /// full. `received - delivered - queued`, so nothing goes uncounted —
    /// including frames arriving after the connection was closed.
    pub dropped: u64,
    /// Datagrams waiting for [`Engine::recv_datagram`].
    pub queued: u64,
    /// Bytes those occupy, counted against the buffer's limit (payload plus
    /// a small fixed overhead per datagram).
    pub queued_bytes: u64,
}

/// The engine-owned receive queue of one connection, bounded in bytes; the
/// oldest datagram is dropped when a new one does not fit (a stale datagram
/// is worth less than a fresh one, as quinn-proto also decides). Holds the
/// `Bytes` quinn-proto produced: no copy. Allocates only when it grows past
/// its largest length so far.
#[derive(Debug)]
pub(crate) struct RecvDatagrams {
    /// Each datagram with the arrival stamp of the packet that carried it
    /// (`None` unless the engine stamps completions).
    pub(super) queue: VecDeque<(Bytes, Option<Timestamp>)>,
    /// Taken since the last [`Event::Datagram`](super::Event::Datagram) was
    /// raised (the receive path takes them early when stamping).
    untold: usize,
    bytes: usize,
    limit: usize,
    delivered: u64,
    /// `dropped` as last reported by [`Event::DatagramsDropped`](super::Event::DatagramsDropped).
    reported: u64,
}

impl RecvDatagrams {
    pub(crate) fn new(limit: usize) -> Self {
        RecvDatagrams {
            queue: VecDeque::new(),
            untold: 0,
            bytes: 0,
            limit,
            delivered: 0,
            reported: 0,
        }
    }

    fn cost(d: &Bytes) -> usize {
        d.len() + PER_DATAGRAM_OVERHEAD
    }

    /// Move every datagram quinn-proto holds for `conn` into the queue,
    /// stamped `stamp`, dropping the oldest when over the limit; returns how
    /// many were taken since the last call, [`take_stamped`](Self::take_stamped)'s included.
    pub(crate) fn take_from(&mut self, conn: &mut Connection, stamp: Option<Timestamp>) -> usize {
        self.take_stamped(conn, stamp);
        std::mem::take(&mut self.untold)
    }

    /// Move what quinn-proto holds into the queue right after the packet
    /// stamped `stamp` was handled, so each datagram keeps its own packet's
    /// arrival time; [`take_from`](Self::take_from) reports them.
    pub(crate) fn take_stamped(&mut self, conn: &mut Connection, stamp: Option<Timestamp>) {
        while let Some(d) = conn.datagrams().recv() {
            self.push(d, stamp);
            self.untold += 1;
        }
    }

    /// Queue `d`, dropping the oldest while over the limit. The newest stays
    /// even if it alone exceeds the limit: quinn-proto already refused any
    /// datagram larger than its own buffer.
    fn push(&mut self, d: Bytes, stamp: Option<Timestamp>) {
        self.bytes += Self::cost(&d);
        self.queue.push_back((d, stamp));
        while self.bytes > self.limit && self.queue.len() > 1 {
            self.pop();
        }
    }

    fn pop(&mut self) -> Option<Bytes> {
        let (d, _) = self.queue.pop_front()?;
        self.bytes -= Self::cost(&d);
        Some(d)
    }

    /// The counters, from quinn-proto's statistics of the same connection
    /// (taken when quinn-proto's own queue is empty: after a poll).
    pub(crate) fn stats(&self, quinn: &ConnectionStats) -> DatagramStats {
        let received = quinn.frame_rx.datagram;
        let queued = self.queue.len() as u64;
        DatagramStats {
            received,
            delivered: self.delivered,
            dropped: received.saturating_sub(self.delivered + queued),
            queued,
            queued_bytes: self.bytes as u64,
        }
    }

    /// Datagrams dropped since the last call (for the event that reports them).
    pub(crate) fn newly_dropped(&mut self, quinn: &ConnectionStats) -> u64 {
        let dropped = self.stats(quinn).dropped;
        let new = dropped.saturating_sub(self.reported);
        self.reported = dropped;
        new
    }
}

impl<Q: UdQueuePair> Engine<Q> {
    /// Queue `data` as one datagram. `WouldBlock` when the send buffer is full
    /// (nothing is dropped: the caller decides what goes stale);
    /// [`Event::DatagramsWritable`](super::Event::DatagramsWritable) tells
    /// when there is room again.
    pub fn send_datagram(&mut self, conn: ConnHandle, data: &[u8]) -> Result<(), EngineError> {
        let copy = self
            .small_copy(data)
            .unwrap_or_else(|| Bytes::copy_from_slice(data));
        let c = self.conns.get(conn)?;
        c.check_open()?;
        match c.inner.datagrams().send(copy, false) {
            Ok(()) => Ok(()),
            Err(SendDatagramError::TooLarge) => Err(EngineError::DatagramTooLarge {
                len: data.len(),
                max: c.inner.datagrams().max_size().unwrap_or(0),
            }),
            Err(SendDatagramError::UnsupportedByPeer | SendDatagramError::Disabled) => {
                Err(EngineError::DatagramsUnsupported)
            }
            Err(SendDatagramError::Blocked(_)) => Err(EngineError::WouldBlock),
        }
    }

    /// The largest datagram [`send_datagram`](Self::send_datagram) accepts now
    /// (`None` if the peer takes none).
    pub fn max_datagram_size(&mut self, conn: ConnHandle) -> Result<Option<usize>, EngineError> {
        Ok(self.conns.get(conn)?.inner.datagrams().max_size())
    }

    /// Take the next received datagram into `buf`; returns its length.
    /// `WouldBlock` when none is waiting; `BufferTooSmall { needed }` keeps the
    /// datagram for a call with a larger buffer.
    pub fn recv_datagram(
        &mut self,
        conn: ConnHandle,
        buf: &mut [u8],
    ) -> Result<usize, EngineError> {
        let c = self.conns.get(conn)?;
        let q = &mut c.rx_datagrams;
        let Some((d, _)) = q.queue.front() else {
            c.check_open()?;
            return Err(EngineError::WouldBlock);
        };
        if d.len() > buf.len() {
            // Left at the front: a too-small buffer loses nothing.
            return Err(EngineError::BufferTooSmall { needed: d.len() });
        }
        let d = q.pop().expect("front checked above");
        q.delivered += 1;
        buf[..d.len()].copy_from_slice(&d);
        Ok(d.len())
    }

    /// Received datagrams of `conn`: how many arrived, were read, were dropped
    /// unread (the receive buffer was full) and wait now.
    pub fn datagram_stats(&self, conn: ConnHandle) -> Result<DatagramStats, EngineError> {
        let c = self.conns.get_ref(conn)?;
        Ok(c.rx_datagrams.stats(&c.inner.stats()))
    }

    /// Datagrams dropped unread on every connection of this engine so far,
    /// closed connections included.
    pub fn datagrams_dropped(&self) -> u64 {
        self.datagrams_dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_drops_the_oldest_past_its_limit() {
        let d = |b: u8| Bytes::from(vec![b; 100]);
        let per = 100 + PER_DATAGRAM_OVERHEAD;
        let mut q = RecvDatagrams::new(3 * per);
        for b in 0..5 {
            q.push(d(b), None);
        }
        assert_eq!(q.queue.len(), 3);
        assert_eq!(q.bytes, 3 * per);
        assert_eq!(q.pop().unwrap()[0], 2, "the two oldest went");
        let mut quinn = ConnectionStats::default();
        quinn.frame_rx.datagram = 5;
        q.delivered = 1;
        let s = q.stats(&quinn);
        assert_eq!((s.received, s.delivered, s.queued, s.dropped), (5, 1, 2, 2));
        assert_eq!(q.newly_dropped(&quinn), 2);
        assert_eq!(q.newly_dropped(&quinn), 0, "each drop is reported once");
    }
}
