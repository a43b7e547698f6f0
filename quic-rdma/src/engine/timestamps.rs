//! Completion time stamps on the engine (docs/architecture.md §2,
//! *Completion time stamps*): when a datagram's packet arrived, when a
//! connection's latest packet arrived (for stream data), when the latest
//! signaled send left. Off by default; nothing reads a clock while off.

use super::{ConnHandle, Engine, EngineError};
use crate::fabric::{StampClock, Timestamp, UdQueuePair};

impl<Q: UdQueuePair> Engine<Q> {
    /// Stamp every later send and receive completion of the engine's queue
    /// pair; returns the clock the stamps are on (`sim`: the fabric's,
    /// virtual on a manual clock; `soft`: the host's monotonic clock, read
    /// in user space). A provider without a completion clock refuses
    /// ([`FabricError::NoCompletionClock`](crate::fabric::FabricError::NoCompletionClock)),
    /// and the engine runs on unstamped.
    pub fn enable_timestamps(&mut self) -> Result<StampClock, EngineError> {
        Ok(self.socket.enable_timestamps()?)
    }

    /// The arrival stamp of the next datagram [`recv_datagram`](Self::recv_datagram)
    /// would return: the stamp of the packet that carried it (`None` while
    /// not stamping). `WouldBlock` when no datagram is waiting.
    pub fn datagram_timestamp(&self, conn: ConnHandle) -> Result<Option<Timestamp>, EngineError> {
        let c = self.conns.get_ref(conn)?;
        match c.rx_datagrams.queue.front() {
            Some((_, stamp)) => Ok(*stamp),
            None => Err(EngineError::WouldBlock),
        }
    }

    /// The arrival stamp of the latest packet handled for `conn` — for
    /// stream data, read after the poll that delivered it, when the newest
    /// bytes arrived (`None` while not stamping or before any packet).
    pub fn rx_timestamp(&self, conn: ConnHandle) -> Result<Option<Timestamp>, EngineError> {
        Ok(self.conns.get_ref(conn)?.last_rx_stamp)
    }

    /// When the latest signaled send whose completion the engine reaped left
    /// (the queue pair is the engine's, shared by its connections; a signaled
    /// completion covers the unsignaled sends before it, IBA 10.8.3).
    pub fn send_timestamp(&self) -> Option<Timestamp> {
        self.socket.last_send_timestamp()
    }
}
