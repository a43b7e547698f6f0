//! `qr_event`: what `qr_engine_poll` writes into the caller's array.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

use quic_rdma::engine::{CloseReason, Event};

use crate::config::qr_addr;

/// `conn` is an incoming attempt id: decide with `qr_accept`/`qr_refuse`/`qr_retry`/`qr_ignore`.
pub const QR_EVENT_INCOMING: u32 = 1;
/// A server-side connection was accepted (`remote` is the client).
pub const QR_EVENT_ACCEPTED: u32 = 2;
/// The handshake completed.
pub const QR_EVENT_CONNECTED: u32 = 3;
/// The peer opened `stream`; it may be readable.
pub const QR_EVENT_STREAM_OPENED: u32 = 4;
/// `stream` has data, its end, or a reset to read.
pub const QR_EVENT_STREAM_READABLE: u32 = 5;
/// `stream` can take more data.
pub const QR_EVENT_STREAM_WRITABLE: u32 = 6;
/// Everything written on finished `stream` was acknowledged.
pub const QR_EVENT_STREAM_FINISHED: u32 = 7;
/// The peer reset `stream` with `code`.
pub const QR_EVENT_STREAM_RESET: u32 = 8;
/// The peer asked us to stop sending on `stream` with `code`.
pub const QR_EVENT_STREAM_STOPPED: u32 = 9;
/// More streams may be opened (`bidi` says which kind).
pub const QR_EVENT_STREAMS_AVAILABLE: u32 = 10;
/// Datagrams arrived and wait in `qr_datagram_recv` (one event per poll that
/// received some, while any are unread).
pub const QR_EVENT_DATAGRAM: u32 = 11;
/// Received datagrams of `conn` were dropped unread: its receive buffer
/// (`qr_engine_config.datagram_recv_buffer`) was full and the oldest made
/// room. `code` is how many since the previous such event of the connection;
/// `qr_conn_stats.datagrams_dropped` has the total. Follows the
/// `QR_EVENT_DATAGRAM` of the same poll. Read faster or enlarge the buffer.
pub const QR_EVENT_DATAGRAMS_DROPPED: u32 = 15;
/// `qr_datagram_send` has room again after it returned `QR_EAGAIN`.
pub const QR_EVENT_DATAGRAMS_WRITABLE: u32 = 14;
/// The connection ended (`reason`, `code`); the id stays valid until `QR_EVENT_CLOSED`.
pub const QR_EVENT_CONNECTION_LOST: u32 = 12;
/// The connection is drained and freed; its id is stale now.
pub const QR_EVENT_CLOSED: u32 = 13;

/// Peer closed with an application code (`code`).
pub const QR_CLOSE_APPLICATION: u32 = 1;
/// Peer closed with a transport error (`code`).
pub const QR_CLOSE_PEER_TRANSPORT: u32 = 2;
/// We detected a protocol violation (`code`).
pub const QR_CLOSE_LOCAL_TRANSPORT: u32 = 3;
/// Idle timeout.
pub const QR_CLOSE_TIMED_OUT: u32 = 4;
/// Stateless reset by peer.
pub const QR_CLOSE_RESET: u32 = 5;
/// No common version.
pub const QR_CLOSE_VERSION_MISMATCH: u32 = 6;
/// We closed it.
pub const QR_CLOSE_LOCAL: u32 = 7;
/// Connection IDs exhausted.
pub const QR_CLOSE_CIDS_EXHAUSTED: u32 = 8;

/// Bytes of a `qr_event` as first published: what `qr_engine_poll` writes per
/// array element, whatever later versions add. `qr_engine_poll_at` takes the
/// caller's `sizeof(qr_event)` instead, so the struct can grow.
pub const QR_EVENT_V1_SIZE: usize = 64;

/// One event. Fields not named by the kind's description are zero. New
/// fields are only ever appended (see `QR_EVENT_V1_SIZE`): `user` and
/// `time_ns` came in version 2 and are written only by `qr_engine_poll_at`
/// with an `event_size` that covers them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_event {
    /// One of `QR_EVENT_*`.
    pub kind: u32,
    /// `QR_EVENT_STREAMS_AVAILABLE`: 1 for bidirectional, 0 for unidirectional.
    pub bidi: u32,
    /// The connection id (or, for `QR_EVENT_INCOMING`, the attempt id).
    pub conn: u64,
    /// The stream id.
    pub stream: u64,
    /// Application or transport error code (reset, stopped, connection
    /// lost); for `QR_EVENT_DATAGRAMS_DROPPED` the number dropped.
    pub code: u64,
    /// `QR_EVENT_CONNECTION_LOST`: one of `QR_CLOSE_*`.
    pub reason: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// `QR_EVENT_INCOMING` / `QR_EVENT_ACCEPTED`: the peer.
    pub remote: qr_addr,
    /// v2. The connection's pointer from `qr_conn_set_user` (NULL if none);
    /// still set on `QR_EVENT_CLOSED`, the last event of the connection, so
    /// the application can free what it points to there.
    pub user: *mut c_void,
    /// v2. When the poll that produced the event ran, in nanoseconds on the
    /// caller's clock (`now_ns` of `qr_engine_poll_at`) or, with the
    /// library's clock, CLOCK_MONOTONIC: a software receive timestamp.
    pub time_ns: u64,
}

impl Default for qr_event {
    fn default() -> Self {
        qr_event {
            kind: 0,
            bidi: 0,
            conn: 0,
            stream: 0,
            code: 0,
            reason: 0,
            reserved: 0,
            remote: qr_addr::default(),
            user: std::ptr::null_mut(),
            time_ns: 0,
        }
    }
}

impl From<Event> for qr_event {
    fn from(e: Event) -> Self {
        let mut q = qr_event::default();
        let sid = |s: quic_rdma::engine::StreamId| u64::from(s);
        match e {
            Event::IncomingConnection { incoming, remote } => {
                q.kind = QR_EVENT_INCOMING;
                q.conn = incoming.to_bits();
                q.remote = remote.into();
            }
            Event::Accepted { conn, remote } => {
                q.kind = QR_EVENT_ACCEPTED;
                q.conn = conn.to_bits();
                q.remote = remote.into();
            }
            Event::Connected { conn } => {
                q.kind = QR_EVENT_CONNECTED;
                q.conn = conn.to_bits();
            }
            Event::StreamOpened { conn, stream } => {
                (q.kind, q.conn, q.stream) = (QR_EVENT_STREAM_OPENED, conn.to_bits(), sid(stream))
            }
            Event::StreamReadable { conn, stream } => {
                (q.kind, q.conn, q.stream) = (QR_EVENT_STREAM_READABLE, conn.to_bits(), sid(stream))
            }
            Event::StreamWritable { conn, stream } => {
                (q.kind, q.conn, q.stream) = (QR_EVENT_STREAM_WRITABLE, conn.to_bits(), sid(stream))
            }
            Event::StreamFinished { conn, stream } => {
                (q.kind, q.conn, q.stream) = (QR_EVENT_STREAM_FINISHED, conn.to_bits(), sid(stream))
            }
            Event::StreamReset { conn, stream, code } => {
                (q.kind, q.conn, q.stream, q.code) =
                    (QR_EVENT_STREAM_RESET, conn.to_bits(), sid(stream), code)
            }
            Event::StreamStopped { conn, stream, code } => {
                (q.kind, q.conn, q.stream, q.code) =
                    (QR_EVENT_STREAM_STOPPED, conn.to_bits(), sid(stream), code)
            }
            Event::StreamsAvailable { conn, bidi } => {
                (q.kind, q.conn, q.bidi) = (QR_EVENT_STREAMS_AVAILABLE, conn.to_bits(), bidi.into())
            }
            Event::Datagram { conn } => (q.kind, q.conn) = (QR_EVENT_DATAGRAM, conn.to_bits()),
            Event::DatagramsDropped { conn, count } => {
                (q.kind, q.conn, q.code) = (QR_EVENT_DATAGRAMS_DROPPED, conn.to_bits(), count)
            }
            Event::DatagramsWritable { conn } => {
                (q.kind, q.conn) = (QR_EVENT_DATAGRAMS_WRITABLE, conn.to_bits())
            }
            Event::ConnectionLost { conn, reason } => {
                q.kind = QR_EVENT_CONNECTION_LOST;
                q.conn = conn.to_bits();
                (q.reason, q.code) = match reason {
                    CloseReason::ApplicationClosed { code } => (QR_CLOSE_APPLICATION, code),
                    CloseReason::PeerTransportError { code } => (QR_CLOSE_PEER_TRANSPORT, code),
                    CloseReason::LocalTransportError { code } => (QR_CLOSE_LOCAL_TRANSPORT, code),
                    CloseReason::TimedOut => (QR_CLOSE_TIMED_OUT, 0),
                    CloseReason::Reset => (QR_CLOSE_RESET, 0),
                    CloseReason::VersionMismatch => (QR_CLOSE_VERSION_MISMATCH, 0),
                    CloseReason::LocallyClosed => (QR_CLOSE_LOCAL, 0),
                    CloseReason::CidsExhausted => (QR_CLOSE_CIDS_EXHAUSTED, 0),
                    _ => (0, 0),
                };
            }
            Event::ConnectionClosed { conn } => {
                (q.kind, q.conn) = (QR_EVENT_CLOSED, conn.to_bits())
            }
            _ => {}
        }
        q
    }
}

// Version 1 ended with `remote`; later fields only ever follow it.
const _: () = assert!(std::mem::offset_of!(qr_event, user) == QR_EVENT_V1_SIZE);
