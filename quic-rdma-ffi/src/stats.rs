//! Versioned statistics structs.
#![allow(non_camel_case_types)]

use quic_rdma::engine::ConnHandle;

use crate::engine::qr_engine;
use crate::error::{code_of, guard, QR_OK};
use crate::ptr::{obj, write_versioned, Versioned};
use crate::streams::sid;

/// One connection's statistics. Version 3 (version 1 ended at `rx_bytes`,
/// version 2 at `datagrams_queued`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qr_conn_stats {
    /// Set by the caller to `sizeof(qr_conn_stats)`; set on return to the bytes written.
    pub struct_size: u32,
    /// Current path MTU.
    pub mtu: u32,
    /// Smoothed round-trip time, nanoseconds.
    pub rtt_ns: u64,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// QUIC packets sent.
    pub sent_packets: u64,
    /// QUIC packets declared lost.
    pub lost_packets: u64,
    /// UD datagrams sent.
    pub tx_datagrams: u64,
    /// Bytes sent in UD datagrams.
    pub tx_bytes: u64,
    /// UD datagrams received.
    pub rx_datagrams: u64,
    /// Bytes received in UD datagrams.
    pub rx_bytes: u64,
    /// v2. QUIC DATAGRAM frames received (RFC 9221), read or not.
    pub datagrams_received: u64,
    /// v2. Received datagrams dropped unread because the receive buffer
    /// (`qr_engine_config.datagram_recv_buffer`) was full
    /// (`QR_EVENT_DATAGRAMS_DROPPED` reports each batch). Frames arriving after
    /// the connection was closed count here too.
    pub datagrams_dropped: u64,
    /// v2. Received datagrams waiting for `qr_datagram_recv`.
    pub datagrams_queued: u64,
    /// v3. Smallest RTT sample, nanoseconds (0 before the first). quinn-proto
    /// seeds its minimum with the initial estimate (2 ms), so on a slower
    /// path this is the smallest sample the library recovered, which has the
    /// peer's ACK delay subtracted (RFC 9002 §5.3) — see `rtt_var_ns`.
    pub min_rtt_ns: u64,
    /// v3. RTT variation (RFC 9002 §5.3 rttvar), nanoseconds (0 before the
    /// first sample). quinn-proto 0.11 keeps its own private, so the library
    /// recovers each sample from successive smoothed RTTs (sample = 8 *
    /// smoothed_new - 7 * smoothed_old, read after every received
    /// datagram, which carries at most one ACK) and applies §5.3's update.
    pub rtt_var_ns: u64,
    /// v3. RTT samples taken (ACKs that moved the smoothed RTT).
    pub rtt_samples: u64,
    /// v3. From `qr_connect` (or the accept) to the handshake's completion,
    /// nanoseconds on the engine's clock (the caller's with
    /// `qr_engine_poll_at`); 0 until it completes.
    pub handshake_ns: u64,
    /// v3. Congestion events: a loss or an ECN-CE mark that shrank the
    /// window (RFC 9002 §7).
    pub congestion_events: u64,
    /// v3. Bytes of QUIC packets declared lost (`lost_packets` counts them).
    pub lost_bytes: u64,
}

// SAFETY: repr(C), first field u32 struct_size, integers only.
unsafe impl Versioned for qr_conn_stats {
    // Written, not read: a caller may know any prefix of it.
    const V1_SIZE: usize = 4;
}

/// The engine's UD socket counters. Version 3 (version 1 ended at
/// `drop_malformed`, version 2 at `qp_recoveries`). A fixed subset, kept for
/// programs built against older headers: `qr_engine_stats_read` reads every
/// counter (`qr_stat_info` describes them), and its shared fields agree with
/// these.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qr_socket_stats {
    /// Set by the caller to `sizeof(qr_socket_stats)`; set on return to the bytes written.
    pub struct_size: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Send work requests posted.
    pub sent_wrs: u64,
    /// Payload bytes posted.
    pub sent_bytes: u64,
    /// `post_send` doorbells.
    pub send_posts: u64,
    /// Sends posted inline.
    pub inline_sends: u64,
    /// Packets received and handed up.
    pub recv_packets: u64,
    /// Payload bytes received.
    pub recv_bytes: u64,
    /// Sends refused for lack of queue room (retried later).
    pub would_block: u64,
    /// Packets dropped by the provider because no receive was posted.
    pub drop_no_recv: u64,
    /// Packets dropped for a bad GRH or a routing-key mismatch.
    pub drop_malformed: u64,
    /// Times the queue pair was recovered from the error state (same QPN).
    /// Added in version 2 of the struct: older callers' smaller size omits it.
    pub qp_recoveries: u64,
    /// v3. Received QUIC datagrams dropped unread, on every connection of the
    /// engine (closed ones included): the sum of
    /// `qr_conn_stats.datagrams_dropped`.
    pub datagrams_dropped: u64,
}

// SAFETY: repr(C), first field u32 struct_size, integers only.
unsafe impl Versioned for qr_socket_stats {
    // Written, not read: a caller may know any prefix of it.
    const V1_SIZE: usize = 4;
}

/// Statistics of `conn` into `*out` (set `out->struct_size` first).
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EINVAL` (`out->struct_size` below 4),
/// `QR_ENOCONN`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_stats_get(
    e: *mut qr_engine,
    conn: u64,
    out: *mut qr_conn_stats,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let h = ConnHandle::from_bits(conn);
        let s = e.engine.conn_stats(h).map_err(|err| code_of(&err))?;
        let d = e.engine.datagram_stats(h).map_err(|err| code_of(&err))?;
        let r = e.engine.rtt_stats(h).map_err(|err| code_of(&err))?;
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let v = qr_conn_stats {
            struct_size: 0,
            mtu: u32::from(s.path.current_mtu),
            rtt_ns: s.path.rtt.as_nanos() as u64,
            cwnd: s.path.cwnd,
            sent_packets: s.path.sent_packets,
            lost_packets: s.path.lost_packets,
            tx_datagrams: s.udp_tx.datagrams,
            tx_bytes: s.udp_tx.bytes,
            rx_datagrams: s.udp_rx.datagrams,
            rx_bytes: s.udp_rx.bytes,
            datagrams_received: d.received,
            datagrams_dropped: d.dropped,
            datagrams_queued: d.queued,
            min_rtt_ns: ns(r.min_rtt),
            rtt_var_ns: ns(r.rtt_var),
            rtt_samples: r.samples,
            handshake_ns: r.handshake.map_or(0, ns),
            congestion_events: s.path.congestion_events,
            lost_bytes: s.path.lost_bytes,
        };
        // SAFETY: the caller's contract above.
        unsafe { write_versioned(out, &v) }?;
        Ok(QR_OK)
    })
}

/// The socket's counters into `*out` (set `out->struct_size` first).
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EINVAL` (`out->struct_size` below 4),
/// `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_socket_stats_get(e: *mut qr_engine, out: *mut qr_socket_stats) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let s = e.engine.socket_stats();
        let v = qr_socket_stats {
            struct_size: 0,
            reserved: 0,
            sent_wrs: s.sent_wrs,
            sent_bytes: s.sent_bytes,
            send_posts: s.send_posts,
            inline_sends: s.inline_sends,
            recv_packets: s.recv_packets,
            recv_bytes: s.recv_bytes,
            would_block: s.would_block,
            drop_no_recv: s.provider.no_recv_posted,
            drop_malformed: s.drop_bad_grh + e.engine.routing_stats().imm_mismatch,
            qp_recoveries: s.qp_recoveries,
            datagrams_dropped: e.engine.datagrams_dropped(),
        };
        // SAFETY: the caller's contract above.
        unsafe { write_versioned(out, &v) }?;
        Ok(QR_OK)
    })
}

/// `qr_stream_stats.flags`: our sending half is open.
pub const QR_STREAM_SEND_OPEN: u32 = 1;
/// `qr_stream_stats.flags`: our receiving half is open.
pub const QR_STREAM_RECV_OPEN: u32 = 2;
/// `qr_stream_stats.flags`: we finished it (`qr_stream_finish`).
pub const QR_STREAM_FINISH_SENT: u32 = 4;
/// `qr_stream_stats.flags`: the peer acknowledged all we sent, the end included.
pub const QR_STREAM_FINISH_ACKED: u32 = 8;
/// `qr_stream_stats.flags`: the peer's end of data was read.
pub const QR_STREAM_FIN_READ: u32 = 16;
/// `qr_stream_stats.flags`: the peer reset it (`reset_code` says with what).
pub const QR_STREAM_RESET_RECEIVED: u32 = 32;
/// `qr_stream_stats.flags`: the peer asked us to stop sending (`stop_code`).
pub const QR_STREAM_STOP_RECEIVED: u32 = 64;

/// What the library counted on one stream (quinn-proto keeps no per-stream
/// counters). Readable while either half is open and, after both ended, for
/// the connection's last 16 ended streams. Version 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qr_stream_stats {
    /// Set by the caller to `sizeof(qr_stream_stats)`; set on return to the bytes written.
    pub struct_size: u32,
    /// `QR_STREAM_*` bits.
    pub flags: u32,
    /// Bytes `qr_stream_write` / `qr_stream_write_zc` took.
    pub bytes_written: u64,
    /// Bytes `qr_stream_read` delivered.
    pub bytes_read: u64,
    /// Writes that took nothing (`QR_EAGAIN`): flow control, or the send
    /// buffer full because the peer reads slower than we write.
    pub writes_blocked: u64,
    /// Reads that found nothing (`QR_EAGAIN`).
    pub reads_empty: u64,
    /// The peer's RESET_STREAM code (with `QR_STREAM_RESET_RECEIVED`), else 0.
    pub reset_code: u64,
    /// The peer's STOP_SENDING code (with `QR_STREAM_STOP_RECEIVED`), else 0.
    pub stop_code: u64,
}

// SAFETY: repr(C), first field u32 struct_size, integers only.
unsafe impl Versioned for qr_stream_stats {
    // Written, not read: a caller may know any prefix of it.
    const V1_SIZE: usize = 4;
}

/// Figures of `stream` on `conn` into `*out` (set `out->struct_size` first):
/// bytes written and read, calls that found no room or no data, and where
/// each half stands. No allocation: a table lookup.
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EINVAL` (`out->struct_size` below 4,
/// or `stream` at or above 2^62), `QR_ENOCONN`, `QR_ESTREAM` (never opened,
/// or ended before the connection's last 16 ended streams), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_stats_get(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    out: *mut qr_stream_stats,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let s = e
            .engine
            .stream_stats(ConnHandle::from_bits(conn), sid(stream)?)
            .map_err(|err| code_of(&err))?;
        let flag = |on: bool, bit: u32| if on { bit } else { 0 };
        let v = qr_stream_stats {
            struct_size: 0,
            flags: flag(s.send_open, QR_STREAM_SEND_OPEN)
                | flag(s.recv_open, QR_STREAM_RECV_OPEN)
                | flag(s.finish_sent, QR_STREAM_FINISH_SENT)
                | flag(s.finish_acked, QR_STREAM_FINISH_ACKED)
                | flag(s.fin_read, QR_STREAM_FIN_READ)
                | flag(s.reset_received.is_some(), QR_STREAM_RESET_RECEIVED)
                | flag(s.stop_received.is_some(), QR_STREAM_STOP_RECEIVED),
            bytes_written: s.bytes_written,
            bytes_read: s.bytes_read,
            writes_blocked: s.writes_blocked,
            reads_empty: s.reads_empty,
            reset_code: s.reset_received.unwrap_or(0),
            stop_code: s.stop_received.unwrap_or(0),
        };
        // SAFETY: the caller's contract above.
        unsafe { write_versioned(out, &v) }?;
        Ok(QR_OK)
    })
}

// The docs of `qr_stream_stats` and `qr_stream_stats_get` name the number.
const _: () = assert!(quic_rdma::engine::ENDED_KEPT == 16);
