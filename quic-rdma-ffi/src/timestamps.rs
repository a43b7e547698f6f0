//! Completion time stamps over the C API (docs/architecture.md §2,
//! *Completion time stamps*): enable them on an engine, then read when the
//! next datagram's packet arrived, when a connection's latest packet arrived
//! (stream data) and when the latest signaled send left.
#![allow(non_camel_case_types)]

use std::sync::OnceLock;
use std::time::Instant;

use quic_rdma::engine::{ConnHandle, Engine, EngineError};
use quic_rdma::fabric::{FabricError, StampClock, Timestamp, UdQueuePair};
use quic_rdma::socket::SocketError;

use crate::engine::{monotonic_ns, qr_engine};
use crate::error::{code_of, fail, guard, QR_EAGAIN, QR_ENULL, QR_EUNSUPPORTED, QR_OK};
use crate::ptr::{obj, put, write_versioned, Versioned};

/// `qr_timestamp.clock`: the `sim` fabric's clock (the wall clock of the
/// library's sim fabric; stamps when the fabric delivers a packet or puts a
/// send on its wire).
pub const QR_CLOCK_SIM_FABRIC: u32 = 1;
/// `qr_timestamp.clock`: the host's monotonic clock read in user space by
/// the `soft` provider (a receive when the packet was taken from the UDP
/// socket, a send when its send syscall returned) — not a NIC or kernel stamp.
pub const QR_CLOCK_HOST_MONOTONIC: u32 = 2;

/// A completion time stamp. Version 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qr_timestamp {
    /// Set by the caller to `sizeof(qr_timestamp)`; set on return to the bytes written.
    pub struct_size: u32,
    /// Which clock read the stamp: one of `QR_CLOCK_*`.
    pub clock: u32,
    /// When, in CLOCK_MONOTONIC nanoseconds: both clocks read the host's
    /// monotonic time (the sim fabric `qr_fabric_new` makes runs on it), so
    /// this compares with `qr_event.time_ns` of polls on the library's clock
    /// (`now_ns` 0); a caller polling on a clock of its own converts.
    pub ns: u64,
}

// SAFETY: repr(C), starts with the u32 size, all-zero is valid.
unsafe impl Versioned for qr_timestamp {
    // Written, not read: a caller may know any prefix of it.
    const V1_SIZE: usize = 4;
}

/// `t` in CLOCK_MONOTONIC nanoseconds (which `Instant` reads on Linux),
/// through one fixed pairing of the two reads, so an instant always maps to
/// the same nanoseconds (two reads per call would move it by their jitter).
fn monotonic_ns_of(t: Instant) -> u64 {
    static PAIR: OnceLock<(u64, Instant)> = OnceLock::new();
    let (ns0, t0) = *PAIR.get_or_init(anchor);
    if t >= t0 {
        ns0.saturating_add(t.duration_since(t0).as_nanos() as u64)
    } else {
        ns0.saturating_sub(t0.duration_since(t).as_nanos() as u64)
    }
}

/// One instant on both clocks: `Instant` (CLOCK_MONOTONIC on Linux, but
/// opaque) and its CLOCK_MONOTONIC nanoseconds. The nanoseconds are the
/// midpoint of two reads around the `Instant`, from the closest of a few
/// tries: off by at most half their gap (tens of ns; a first call slowed by
/// lazy setup, or a run under valgrind, would otherwise shift every stamp
/// by microseconds).
fn anchor() -> (u64, Instant) {
    let read = || {
        let a = monotonic_ns();
        let t = Instant::now();
        let gap = monotonic_ns().saturating_sub(a);
        (gap, a + gap / 2, t)
    };
    let (_, ns, t) = (1..16).fold(read(), |best, _| {
        let next = read();
        if next.0 < best.0 {
            next
        } else {
            best
        }
    });
    (ns, t)
}

fn clock_id(c: StampClock) -> u32 {
    match c {
        StampClock::SimFabric => QR_CLOCK_SIM_FABRIC,
        StampClock::HostMonotonic => QR_CLOCK_HOST_MONOTONIC,
        // A clock this library version does not name yet.
        _ => 0,
    }
}

/// Write `stamp` into `out`; `QR_EAGAIN` when there is none (stamps off, or
/// nothing stamped yet).
///
/// # Safety
/// `out` is NULL or points to at least `out->struct_size` writable bytes.
unsafe fn write_stamp(stamp: Option<Timestamp>, out: *mut qr_timestamp) -> Result<i32, i32> {
    if out.is_null() {
        return Err(QR_ENULL);
    }
    let Some(t) = stamp else {
        return Err(fail(
            QR_EAGAIN,
            "no time stamp: call qr_engine_enable_timestamps first, or nothing was stamped yet",
        ));
    };
    let v = qr_timestamp {
        struct_size: 0,
        clock: clock_id(t.clock),
        ns: monotonic_ns_of(t.at),
    };
    // SAFETY: the caller's contract above.
    unsafe { write_versioned(out, &v) }?;
    Ok(QR_OK)
}

/// Stamp every later send and receive completion of the engine's queue
/// pair (off by default; while off no clock is read for it). If `clock` is
/// not NULL the clock the stamps will be on (`QR_CLOCK_*`) is written there.
///
/// Returns: `QR_OK`, `QR_ENULL` (`e` NULL), `QR_EUNSUPPORTED` (the device
/// has no completion clock — e.g. verbs, which does not read one yet; the
/// engine runs on unstamped; `qr_last_error` names the device),
/// `QR_EFABRIC`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `clock` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_enable_timestamps(e: *mut qr_engine, clock: *mut u32) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let c = match e.engine.enable_timestamps() {
            Ok(c) => c,
            Err(
                err @ EngineError::Socket(SocketError::Fabric(FabricError::NoCompletionClock {
                    ..
                })),
            ) => return Err(fail(QR_EUNSUPPORTED, err)),
            Err(err) => return Err(code_of(&err)),
        };
        if !clock.is_null() {
            // SAFETY: non-null and writable by contract.
            unsafe { put(clock, clock_id(c)) }?;
        }
        Ok(QR_OK)
    })
}

/// When the packet carrying the next datagram `qr_datagram_recv` would
/// return arrived (call it before `qr_datagram_recv`).
///
/// Returns: `QR_OK` with `*out` written, `QR_EAGAIN` (no datagram waiting,
/// or stamps off), `QR_ENULL`, `QR_EINVAL` (`out->struct_size` below 4),
/// `QR_ENOCONN`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_datagram_timestamp(
    e: *mut qr_engine,
    conn: u64,
    out: *mut qr_timestamp,
) -> i32 {
    // SAFETY: the caller's contract above.
    unsafe { conn_stamp(e, conn, out, |e, c| e.datagram_timestamp(c)) }
}

/// When the latest packet handled for `conn` arrived: for stream data read
/// after the poll that delivered it, when its newest bytes arrived.
///
/// Returns: `QR_OK` with `*out` written, `QR_EAGAIN` (stamps off, or no
/// packet since they were enabled), `QR_ENULL`, `QR_EINVAL`, `QR_ENOCONN`,
/// `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_rx_timestamp(
    e: *mut qr_engine,
    conn: u64,
    out: *mut qr_timestamp,
) -> i32 {
    // SAFETY: the caller's contract above.
    unsafe { conn_stamp(e, conn, out, |e, c| e.rx_timestamp(c)) }
}

/// The body of the per-connection readers: `read`'s stamp of `conn`, into `out`.
///
/// # Safety
/// As for the readers: `e` is a live engine; `out` points to at least
/// `out->struct_size` writable bytes.
unsafe fn conn_stamp(
    e: *mut qr_engine,
    conn: u64,
    out: *mut qr_timestamp,
    read: impl FnOnce(
        &Engine<Box<dyn UdQueuePair>>,
        ConnHandle,
    ) -> Result<Option<Timestamp>, EngineError>,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let stamp = read(&e.engine, ConnHandle::from_bits(conn)).map_err(|err| code_of(&err))?;
        // SAFETY: the caller's contract above.
        unsafe { write_stamp(stamp, out) }
    })
}

/// When the latest signaled send whose completion the engine reaped left
/// (the engine's queue pair is shared by its connections).
///
/// Returns: `QR_OK` with `*out` written, `QR_EAGAIN` (stamps off, or no
/// send completion since they were enabled), `QR_ENULL`, `QR_EINVAL`,
/// `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_send_timestamp(
    e: *mut qr_engine,
    out: *mut qr_timestamp,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let stamp = e.engine.send_timestamp();
        // SAFETY: the caller's contract above.
        unsafe { write_stamp(stamp, out) }
    })
}
