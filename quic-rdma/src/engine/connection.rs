//! Per-connection state and the table of connections, indexed like quinn-proto's.

use bytes::Bytes;
use quinn_proto::{Connection, ConnectionError, ConnectionHandle};

use super::{ConnHandle, EngineError};

/// One connection as the engine keeps it.
pub(crate) struct Conn {
    pub(crate) inner: Connection,
    /// Why it ended, once it has (kept for [`Engine::close_reason`](super::Engine::close_reason)).
    pub(crate) error: Option<ConnectionError>,
    /// A datagram taken from quinn-proto that did not fit the caller's buffer:
    /// kept so a too-small buffer loses nothing.
    pub(crate) stashed_datagram: Option<Bytes>,
}

impl Conn {
    pub(crate) fn new(inner: Connection) -> Self {
        Conn {
            inner,
            error: None,
            stashed_datagram: None,
        }
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

/// Connections by quinn-proto's `ConnectionHandle` (itself a slab index, so the
/// table stays dense), each slot with a generation for stale-handle detection.
#[derive(Default)]
pub(crate) struct ConnTable {
    slots: Vec<Slot>,
    next_gen: u32,
    live: usize,
}

impl ConnTable {
    pub(crate) fn insert(&mut self, ch: ConnectionHandle, conn: Conn) -> ConnHandle {
        let i = ch.0;
        if self.slots.len() <= i {
            self.slots
                .resize_with(i + 1, || Slot { gen: 0, conn: None });
        }
        // Generations start at 1 so the all-zero bit pattern is never a valid handle.
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        let slot = &mut self.slots[i];
        debug_assert!(slot.conn.is_none(), "quinn-proto reused a live handle");
        slot.gen = self.next_gen;
        slot.conn = Some(conn);
        self.live += 1;
        ConnHandle {
            index: i as u32,
            gen: slot.gen,
        }
    }

    pub(crate) fn get(&mut self, h: ConnHandle) -> Result<&mut Conn, EngineError> {
        match self.slots.get_mut(h.index as usize) {
            Some(Slot { gen, conn: Some(c) }) if *gen == h.gen => Ok(c),
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
