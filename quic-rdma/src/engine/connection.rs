//! Per-connection state and the table of connections, indexed like quinn-proto's.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use quinn_proto::{Connection, ConnectionError, ConnectionHandle, Dir, StreamId};

use super::datagrams::RecvDatagrams;
use super::rtt::RttTrack;
use super::stream_stats::StreamTable;
use super::{ConnHandle, EngineError};

/// One connection as the engine keeps it.
pub(crate) struct Conn {
    pub(crate) inner: Connection,
    /// Why it ended, once it has (kept for [`Engine::close_reason`](super::Engine::close_reason)).
    pub(crate) error: Option<ConnectionError>,
    /// Received datagrams not read yet, bounded; counts what it drops.
    pub(crate) rx_datagrams: RecvDatagrams,
    /// Streams we opened, per direction ([bidi, uni]): ids are handed out in
    /// order (RFC 9000 §2.1), so ours with a lower index exist.
    opened: [u64; 2],
    /// Streams the peer opened that we have seen, per direction: a higher
    /// index implicitly opens every lower one (RFC 9000 §3.2).
    accepted: [u64; 2],
    /// Accepted from an address not validated yet, handshake not complete:
    /// counted in the engine's unvalidated handshakes ([`crate::quic::retry`]).
    pub(crate) unvalidated_handshake: bool,
    /// RTT figures quinn-proto does not expose, and the handshake time.
    pub(crate) rtt: RttTrack,
    /// Arrival stamp of the latest packet handled for this connection, while
    /// the engine stamps completions ([`Engine::enable_timestamps`](super::Engine::enable_timestamps)).
    pub(crate) last_rx_stamp: Option<crate::fabric::Timestamp>,
    /// Per-stream figures ([`Engine::stream_stats`](super::Engine::stream_stats)).
    pub(crate) stream_stats: StreamTable,
    /// Something happened that may give quinn-proto a packet to send (a
    /// packet in, a timer, an endpoint event, an application call) since
    /// `poll_transmit` last returned `None`. While false, the flush skips the
    /// connection: quinn-proto builds packets only in answer to those inputs
    /// (a pacing or congestion wait arms a timer or waits for an ACK), so
    /// asking again would return `None` at the cost of a full pass over its
    /// packet spaces, on every poll of a busy-polling caller.
    pub(crate) may_send: bool,
}

fn dir_index(d: Dir) -> usize {
    match d {
        Dir::Bi => 0,
        Dir::Uni => 1,
    }
}

impl Conn {
    /// A connection started at `now` whose received datagrams are held up
    /// to `datagram_limit` bytes.
    pub(crate) fn new(inner: Connection, datagram_limit: usize, now: Instant) -> Self {
        let rtt = RttTrack::new(now, inner.rtt());
        Conn {
            rtt,
            inner,
            error: None,
            rx_datagrams: RecvDatagrams::new(datagram_limit),
            last_rx_stamp: None,
            stream_stats: StreamTable::new(),
            may_send: true,
            opened: [0; 2],
            accepted: [0; 2],
            unvalidated_handshake: false,
        }
    }

    /// Record a stream we opened.
    pub(crate) fn note_opened(&mut self, s: StreamId) {
        let n = &mut self.opened[dir_index(s.dir())];
        *n = (*n).max(s.index() + 1);
        self.stream_stats.opened(s, self.inner.side());
    }

    /// Record a stream the peer opened.
    pub(crate) fn note_accepted(&mut self, s: StreamId) {
        let n = &mut self.accepted[dir_index(s.dir())];
        *n = (*n).max(s.index() + 1);
        self.stream_stats.opened(s, self.inner.side());
    }

    /// Whether `s` was ever opened, by us or by the peer: an id nobody opened
    /// must never make us send a frame for it (the peer would close the whole
    /// connection with STREAM_STATE_ERROR, RFC 9000 §19.4–19.5, §19.8).
    pub(crate) fn stream_exists(&self, s: StreamId) -> bool {
        let seen = if s.initiator() == self.inner.side() {
            self.opened
        } else {
            self.accepted
        };
        s.index() < seen[dir_index(s.dir())]
    }

    /// Err if the connection has ended (with its reason).
    pub(crate) fn check_open(&self) -> Result<(), EngineError> {
        match &self.error {
            Some(e) => Err(EngineError::ConnectionLost(e.clone())),
            None if self.inner.is_closed() => {
                Err(EngineError::ConnectionLost(ConnectionError::LocallyClosed))
            }
            None => Ok(()),
        }
    }
}

struct Slot {
    gen: u32,
    conn: Option<Conn>,
}

/// Tags told apart between engines of one process (see [`ConnTable::new`]).
static NEXT_ENGINE_TAG: AtomicU32 = AtomicU32::new(1);

/// Connections by quinn-proto's `ConnectionHandle` (itself a slab index, so the
/// table stays dense), each slot with a generation for stale-handle detection.
/// A generation's high 16 bits are the engine's tag, so a handle from another
/// engine names no connection here (rather than whichever has its index).
pub(crate) struct ConnTable {
    slots: Vec<Slot>,
    /// This engine's tag, in the high 16 bits of every generation.
    tag: u32,
    /// The low 16 bits of the next generation.
    next_gen: u32,
    live: usize,
}

impl ConnTable {
    /// An empty table with a tag of its own (a process-wide counter, so two
    /// engines alive at once differ unless 65 535 were made in between).
    pub(crate) fn new() -> Self {
        let tag = loop {
            let t = NEXT_ENGINE_TAG.fetch_add(1, Ordering::Relaxed) & 0xFFFF;
            if t != 0 {
                break t;
            }
        };
        ConnTable {
            slots: Vec::new(),
            tag: tag << 16,
            next_gen: 0,
            live: 0,
        }
    }

    pub(crate) fn insert(&mut self, ch: ConnectionHandle, conn: Conn) -> ConnHandle {
        let i = ch.0;
        if self.slots.len() <= i {
            self.slots
                .resize_with(i + 1, || Slot { gen: 0, conn: None });
        }
        // The low half wraps after 65 535 connections; never 0, and the tag is
        // never 0, so the all-zero bit pattern is never a valid handle.
        self.next_gen = (self.next_gen % 0xFFFF) + 1;
        let slot = &mut self.slots[i];
        debug_assert!(slot.conn.is_none(), "quinn-proto reused a live handle");
        slot.gen = self.tag | self.next_gen;
        slot.conn = Some(conn);
        self.live += 1;
        ConnHandle {
            index: i as u32,
            gen: slot.gen,
        }
    }

    /// The connection `h` names, for an application call: marked as maybe
    /// having something to send (a write, a read that frees flow-control
    /// credit, a close...), so the next flush asks quinn-proto.
    pub(crate) fn get(&mut self, h: ConnHandle) -> Result<&mut Conn, EngineError> {
        match self.slots.get_mut(h.index as usize) {
            Some(Slot { gen, conn: Some(c) }) if *gen == h.gen => {
                c.may_send = true;
                Ok(c)
            }
            _ => Err(EngineError::UnknownConnection),
        }
    }

    pub(crate) fn get_ref(&self, h: ConnHandle) -> Result<&Conn, EngineError> {
        match self.slots.get(h.index as usize) {
            Some(Slot { gen, conn: Some(c) }) if *gen == h.gen => Ok(c),
            _ => Err(EngineError::UnknownConnection),
        }
    }

    /// The connection quinn-proto routed a datagram to.
    pub(crate) fn by_proto(&mut self, ch: ConnectionHandle) -> Option<&mut Conn> {
        self.slots.get_mut(ch.0).and_then(|s| s.conn.as_mut())
    }

    /// The handle of slot `i`, if live.
    pub(crate) fn handle_at(&self, i: usize) -> Option<ConnHandle> {
        let s = self.slots.get(i)?;
        s.conn.as_ref().map(|_| ConnHandle {
            index: i as u32,
            gen: s.gen,
        })
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> Option<&mut Conn> {
        self.slots.get_mut(i).and_then(|s| s.conn.as_mut())
    }

    pub(crate) fn remove(&mut self, i: usize) -> Option<Conn> {
        let c = self.slots.get_mut(i)?.conn.take();
        self.live -= usize::from(c.is_some());
        c
    }

    /// Number of slots (live or not): iterate `0..capacity()`.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Live connections.
    pub(crate) fn live(&self) -> usize {
        self.live
    }
}
