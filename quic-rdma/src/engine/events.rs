//! What [`Engine::poll`](super::Engine::poll) reports.
//!
//! Events are `Copy` and small so a caller's buffer is reused without drops;
//! details that own memory (a close reason's text) stay in the engine and are
//! fetched on demand ([`Engine::close_reason`](super::Engine::close_reason)).

use quinn_proto::{ConnectionError, StreamId};

use super::{ConnHandle, IncomingId};
use crate::fabric::UdAddr;

/// One thing that happened during a [`poll`](super::Engine::poll).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A peer wants to connect and the accept policy is
    /// [`Manual`](super::AcceptPolicy::Manual): decide with
    /// [`accept`](super::Engine::accept), [`refuse`](super::Engine::refuse),
    /// [`retry`](super::Engine::retry) or [`ignore`](super::Engine::ignore).
    IncomingConnection {
        /// The pending attempt.
        incoming: IncomingId,
        /// Where it comes from.
        remote: UdAddr,
    },
    /// A server-side connection was accepted (by policy or by
    /// [`accept`](super::Engine::accept)); its handshake is under way.
    Accepted {
        /// The new connection.
        conn: ConnHandle,
        /// The client's address.
        remote: UdAddr,
    },
    /// The handshake completed: streams and datagrams may flow.
    Connected {
        /// The connection.
        conn: ConnHandle,
    },
    /// The peer opened a stream; it may already be readable.
    StreamOpened {
        /// The connection.
        conn: ConnHandle,
        /// The new stream.
        stream: StreamId,
    },
    /// A stream has data (or its end, or a reset) to read.
    StreamReadable {
        /// The connection.
        conn: ConnHandle,
        /// The stream.
        stream: StreamId,
    },
    /// A stream that was write-blocked can take more data.
    StreamWritable {
        /// The connection.
        conn: ConnHandle,
        /// The stream.
        stream: StreamId,
    },
    /// Everything written on a finished stream was acknowledged by the peer.
    StreamFinished {
        /// The connection.
        conn: ConnHandle,
        /// The stream.
        stream: StreamId,
    },
    /// The peer reset a stream we receive on; unread data is gone.
    StreamReset {
        /// The connection.
        conn: ConnHandle,
        /// The stream.
        stream: StreamId,
        /// The peer's application error code.
        code: u64,
    },
    /// The peer asked us to stop sending on a stream.
    StreamStopped {
        /// The connection.
        conn: ConnHandle,
        /// The stream.
        stream: StreamId,
        /// The peer's application error code.
        code: u64,
    },
    /// More streams of this direction may be opened (the peer raised the limit).
    StreamsAvailable {
        /// The connection.
        conn: ConnHandle,
        /// Bidirectional or unidirectional.
        bidi: bool,
    },
    /// One or more datagrams wait in [`recv_datagram`](super::Engine::recv_datagram).
    Datagram {
        /// The connection.
        conn: ConnHandle,
    },
    /// Received datagrams were dropped unread: the connection's receive
    /// buffer ([`EngineConfig::datagram_recv_buffer`](super::EngineConfig::datagram_recv_buffer))
    /// was full and the oldest made room. Follows the [`Event::Datagram`] of
    /// the same poll; [`Engine::datagram_stats`](super::Engine::datagram_stats) has the totals.
    DatagramsDropped {
        /// The connection.
        conn: ConnHandle,
        /// How many since the previous `DatagramsDropped` of this connection.
        count: u64,
    },
    /// [`send_datagram`](super::Engine::send_datagram) has room again after
    /// it returned `WouldBlock`.
    DatagramsWritable {
        /// The connection.
        conn: ConnHandle,
    },
    /// The connection ended for a reason other than our own close: the peer
    /// closed it, it timed out, or a protocol error. The handle stays valid
    /// until [`Event::ConnectionClosed`].
    ConnectionLost {
        /// The connection.
        conn: ConnHandle,
        /// Why, in brief; the full reason is in [`Engine::close_reason`](super::Engine::close_reason).
        reason: CloseReason,
    },
    /// The connection is drained and freed; its handle is now stale.
    ConnectionClosed {
        /// The connection.
        conn: ConnHandle,
    },
}

/// Why a connection ended, without the owned reason text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer closed it with an application error code (CONNECTION_CLOSE 0x1d).
    ApplicationClosed {
        /// The application error code.
        code: u64,
    },
    /// The peer closed it with a transport error code (CONNECTION_CLOSE 0x1c).
    PeerTransportError {
        /// The QUIC transport error code.
        code: u64,
    },
    /// We detected a protocol violation.
    LocalTransportError {
        /// The QUIC transport error code.
        code: u64,
    },
    /// Nothing came from the peer for the idle timeout (RFC 9000 §10.1): it
    /// died, was killed, or is unreachable. By default that is noticed within
    /// 1.5–1.8 s (see [`Liveness`](crate::quic::Liveness)); a live but
    /// idle peer is kept by keep-alives. Distinct from every close the peer
    /// sent: those are [`ApplicationClosed`](Self::ApplicationClosed) and
    /// [`PeerTransportError`](Self::PeerTransportError).
    TimedOut,
    /// The peer sent a stateless reset.
    Reset,
    /// No common QUIC version.
    VersionMismatch,
    /// We closed it.
    LocallyClosed,
    /// We ran out of connection IDs.
    CidsExhausted,
}

impl CloseReason {
    /// Summarise quinn-proto's reason.
    pub fn of(e: &ConnectionError) -> Self {
        match e {
            ConnectionError::ApplicationClosed(c) => CloseReason::ApplicationClosed {
                code: c.error_code.into_inner(),
            },
            ConnectionError::ConnectionClosed(c) => CloseReason::PeerTransportError {
                code: u64::from(c.error_code),
            },
            ConnectionError::TransportError(t) => CloseReason::LocalTransportError {
                code: u64::from(t.code),
            },
            ConnectionError::TimedOut => CloseReason::TimedOut,
            ConnectionError::Reset => CloseReason::Reset,
            ConnectionError::VersionMismatch => CloseReason::VersionMismatch,
            ConnectionError::LocallyClosed => CloseReason::LocallyClosed,
            ConnectionError::CidsExhausted => CloseReason::CidsExhausted,
        }
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::ApplicationClosed { code } => {
                write!(f, "closed by the peer's application (code {code})")
            }
            CloseReason::PeerTransportError { code } => {
                write!(f, "closed by the peer with transport error {code:#x}")
            }
            CloseReason::LocalTransportError { code } => {
                write!(f, "closed for a protocol violation by the peer (transport error {code:#x})")
            }
            CloseReason::TimedOut => write!(
                f,
                "timed out: nothing from the peer within the idle timeout (peer dead or unreachable)"
            ),
            CloseReason::Reset => write!(f, "reset by the peer (stateless reset)"),
            CloseReason::VersionMismatch => write!(f, "no QUIC version in common with the peer"),
            CloseReason::LocallyClosed => write!(f, "closed by this endpoint"),
            CloseReason::CidsExhausted => write!(f, "ran out of connection IDs"),
        }
    }
}

/// 0-RTT state of a connection ([`Engine::zero_rtt`](super::Engine::zero_rtt)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroRtt {
    /// Early data can be (or could be) sent: the client resumed a session
    /// whose server allows 0-RTT.
    pub possible: bool,
    /// The handshake is done and the server accepted the early data.
    pub accepted: bool,
}
