//! Completion time stamps: when a packet arrived, or a send left, on a named
//! clock — what `ibv_wc_read_completion_ts` gives on a NIC with a completion
//! clock, done in software by `sim` and `soft`. Off by default
//! ([`UdQueuePair::enable_timestamps`](super::UdQueuePair::enable_timestamps));
//! while off no clock is read on any path.

use std::time::Instant;

/// Which clock a [`Timestamp`] was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StampClock {
    /// The `sim` fabric's clock: the caller's virtual time under
    /// [`SimClock::Manual`](super::sim::SimClock::Manual), else the wall
    /// clock. Receives are stamped when the fabric delivers the packet to the
    /// receive queue, sends when the fabric puts them on its wire.
    SimFabric,
    /// The host's monotonic clock (`Instant`, CLOCK_MONOTONIC on Linux) read
    /// in user space by `soft`: a receive when the provider takes the packet
    /// from the UDP socket (after the receive syscall returned, before it is
    /// matched to a posted receive), a send when the send syscall carrying it
    /// returned. Not a kernel or NIC stamp: it includes the time the packet
    /// waited in the socket buffer only up to the provider's read.
    HostMonotonic,
}

impl StampClock {
    /// A short, stable name (logs, the C API's clock id is its own number).
    pub fn name(self) -> &'static str {
        match self {
            StampClock::SimFabric => "sim-fabric",
            StampClock::HostMonotonic => "host-monotonic",
        }
    }
}

/// When a work request completed, and on which clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timestamp {
    /// The instant (on `clock`'s timeline: virtual time for
    /// [`StampClock::SimFabric`] on a manual clock).
    pub at: Instant,
    /// The clock it was read from.
    pub clock: StampClock,
}
