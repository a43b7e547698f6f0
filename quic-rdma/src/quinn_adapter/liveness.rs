//! Noticing a dead peer by the receive path's clock (docs/architecture.md §5).
//!
//! quinn judges a connection's idle timer in the connection's task, against
//! the receive time of the last packet *that task has processed*. The endpoint
//! task reads the fabric and queues each packet for its connection without
//! bound, so when the host is busy the connection task can run seconds behind
//! what was read: with a short idle timeout it then times out a connection
//! whose peer never went quiet (seen in the rxe guest under emulation: the
//! server's connection 1.5 s behind its endpoint, killed, and the live client
//! answered with a stateless reset). The adapter therefore keeps quinn's idle
//! timeout long ([`Liveness::quinn_adapter`](crate::quic::Liveness::quinn_adapter),
//! 30 s: the stall a host may have) and judges liveness where local lag cannot
//! fake silence:
//!
//! - the peer table stamps each peer when one of its packets is *read off the
//!   fabric*;
//! - the receive path stamps when it last read the receive queue dry — its
//!   clock: a packet waiting unread does not make its sender look silent,
//!   however late the tasks run, because the clock stops until it is read;
//! - [`watch`] compares the two every eighth of `dead_after` and closes the
//!   connection (application code [`PEER_SILENT`]) when the peer has been
//!   silent that long. With the default 300 ms keep-alive a live peer is
//!   never silent for more than ~300 ms plus its own scheduling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::VarInt;

use super::RdmaUdpSocket;
use crate::fabric::UdQueuePair;
use crate::quic::config::Liveness;

/// How long a peer may be silent (as the receive path sees it) before
/// [`watch`] closes its connection: [`Liveness::DEFAULT_DEAD_AFTER`], 1.5 s,
/// five keep-alive intervals of the default 300 ms, so a dead peer is noticed
/// within ~1.7 s and a live one survives four lost keep-alives in a row.
pub const DEFAULT_DEAD_AFTER: Duration = Liveness::DEFAULT_DEAD_AFTER;

/// The application error code [`watch`] closes a connection with (the peer
/// sees it in `ApplicationClosed`; the local side gets `LocallyClosed`).
pub const PEER_SILENT: VarInt = VarInt::from_u32(0x51_1e47);

/// How a [`watch`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Watched {
    /// The connection closed for another reason (its error says which).
    Closed,
    /// The peer was silent this long, as the receive path saw it: the
    /// connection was closed with [`PEER_SILENT`].
    PeerSilent(Duration),
}

/// Watch `conn` over `socket`: close it with [`PEER_SILENT`] once its peer has
/// been silent for `dead_after` as the receive path sees it (see the
/// [module docs](self)); return when the connection is closed either way.
/// The peer must send at least every `dead_after` while alive: keep-alives
/// shorter than `dead_after` on one side at least.
pub async fn watch<Q: UdQueuePair>(
    socket: Arc<RdmaUdpSocket<Q>>,
    conn: quinn::Connection,
    dead_after: Duration,
) -> Watched {
    let start = Instant::now();
    let period = (dead_after / 8).max(Duration::from_millis(5));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = conn.closed() => return Watched::Closed,
            _ = tick.tick() => {}
        }
        // Never heard (a handshake still under way): silent since the watch began.
        let silent = socket
            .peer_silence(conn.remote_address())
            .unwrap_or_else(|| start.elapsed());
        if silent >= dead_after && start.elapsed() >= dead_after {
            tracing::info!(peer = %conn.remote_address(), ?silent, "peer silent: closing its connection");
            conn.close(PEER_SILENT, b"peer silent");
            return Watched::PeerSilent(silent);
        }
    }
}

/// [`watch`] on a task of the current tokio runtime.
pub fn spawn_watch<Q: UdQueuePair>(
    socket: Arc<RdmaUdpSocket<Q>>,
    conn: quinn::Connection,
    dead_after: Duration,
) -> tokio::task::JoinHandle<Watched> {
    tokio::spawn(watch(socket, conn, dead_after))
}

/// [`spawn_watch`] with `liveness`'s [`dead_after`](Liveness::dead_after), if
/// it has one (the timers an endpoint was configured with decide whether its
/// connections are watched).
pub fn spawn_watch_for<Q: UdQueuePair>(
    socket: &Arc<RdmaUdpSocket<Q>>,
    conn: &quinn::Connection,
    liveness: &Liveness,
) -> Option<tokio::task::JoinHandle<Watched>> {
    let d = liveness.dead_after()?;
    Some(spawn_watch(socket.clone(), conn.clone(), d))
}

/// An instant shared between tasks without a lock (nanoseconds after a base).
#[derive(Debug)]
pub(super) struct Stamp {
    base: Instant,
    /// Nanoseconds after `base`, plus one (0: never set).
    at: AtomicU64,
}

impl Stamp {
    pub(super) fn new() -> Self {
        Stamp {
            base: Instant::now(),
            at: AtomicU64::new(0),
        }
    }

    /// Move the stamp to `t` (never backwards: concurrent setters race).
    pub(super) fn set(&self, t: Instant) {
        let n = (t.saturating_duration_since(self.base).as_nanos() as u64).saturating_add(1);
        self.at.fetch_max(n, Ordering::Relaxed);
    }

    /// The stamp, if ever set.
    pub(super) fn get(&self) -> Option<Instant> {
        match self.at.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n - 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_only_moves_forward() {
        let s = Stamp::new();
        assert_eq!(s.get(), None);
        let t = Instant::now() + Duration::from_millis(5);
        s.set(t);
        assert_eq!(s.get(), Some(t));
        s.set(t - Duration::from_millis(1));
        assert_eq!(s.get(), Some(t));
    }
}
