//! Per-connection calls: the application's context pointer, the peer's
//! address, why it closed, and 0-RTT.

use std::ffi::c_void;

use quic_rdma::engine::ConnHandle;
use quinn_proto::ConnectionError;

use crate::config::qr_addr;
use crate::engine::qr_engine;
use crate::error::{code_of, guard, QR_ENULL, QR_OK};
use crate::ptr::{copy_out, obj, obj_ref, put};

/// Attach the application's pointer `user` to `conn` (NULL detaches). Events
/// of the connection then carry it in `qr_event.user` (version 2 events,
/// `qr_engine_poll_at`), up to and including `QR_EVENT_CLOSED`. The library
/// never dereferences it.
///
/// Returns: `QR_OK`, `QR_ENULL` (`e` NULL), `QR_ENOCONN`, `QR_EINVAL` (the
/// connection has no known peer address yet), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_set_user(e: *mut qr_engine, conn: u64, user: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        // A stale or foreign id is refused rather than stored forever.
        e.engine
            .remote_addr(ConnHandle::from_bits(conn))
            .map_err(|err| code_of(&err))?;
        if user.is_null() {
            e.users.remove(&conn);
        } else {
            e.users.insert(conn, user as usize);
        }
        Ok(QR_OK)
    })
}

/// The pointer `qr_conn_set_user` attached to `conn` into `*user` (NULL if none).
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EPANIC` (an unknown id gives NULL, not an
/// error).
///
/// # Safety
/// `e` is a live engine; `user` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_user(
    e: *const qr_engine,
    conn: u64,
    user: *mut *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        let u = e
            .users
            .get(&conn)
            .map_or(std::ptr::null_mut(), |&u| u as *mut c_void);
        // SAFETY: writable by contract (null-checked by `put`).
        unsafe { put(user, u) }?;
        Ok(QR_OK)
    })
}

/// The peer's current address (it changes when the peer migrates).
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ENOCONN`, `QR_EINVAL` (no known peer
/// address), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_remote(e: *const qr_engine, conn: u64, out: *mut qr_addr) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        let a = e
            .engine
            .remote_addr(ConnHandle::from_bits(conn))
            .map_err(|err| code_of(&err))?;
        // SAFETY: writable by contract (null-checked by `put`).
        unsafe { put(out, a.into()) }?;
        Ok(QR_OK)
    })
}

/// Why `conn` ended, as text: the reason phrase the peer sent in its
/// CONNECTION_CLOSE (RFC 9000 §19.19), or our description of a timeout,
/// reset or local error. Copies up to `cap` bytes (no NUL) into `buf` and
/// returns the full length; `QR_ETOOSMALL` with the length in `*needed` (if
/// not NULL) when `cap` is short; 0 while the connection is open. Answers
/// until the poll after `QR_EVENT_CLOSED`.
///
/// Returns: the reason's length (>= 0; 0 while open), `QR_ETOOSMALL`,
/// `QR_ENULL`, `QR_ENOCONN`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `buf` points to `cap` writable bytes (NULL only with
/// 0); `needed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_close_reason(
    e: *const qr_engine,
    conn: u64,
    buf: *mut u8,
    cap: usize,
    needed: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        if buf.is_null() && cap > 0 {
            return Err(QR_ENULL);
        }
        let reason = e
            .engine
            .close_reason(ConnHandle::from_bits(conn))
            .map_err(|err| code_of(&err))?;
        let text: Vec<u8> = match reason {
            None => Vec::new(),
            Some(ConnectionError::ApplicationClosed(c)) => c.reason.to_vec(),
            Some(ConnectionError::ConnectionClosed(c)) if !c.reason.is_empty() => c.reason.to_vec(),
            Some(other) => other.to_string().into_bytes(),
        };
        // SAFETY: `buf`/`cap` and `needed` as the caller's contract says.
        unsafe { copy_out(&text, buf, cap, needed) }?;
        Ok(text.len().min(i32::MAX as usize) as i32)
    })
}

/// 0-RTT may be (or was) used on `conn`: the client resumed a session with a
/// server that accepts early data, so streams opened and written before
/// `QR_EVENT_CONNECTED` travel in the first flight.
pub const QR_0RTT_POSSIBLE: i32 = 1;
/// The handshake is done and the server accepted the early data.
pub const QR_0RTT_ACCEPTED: i32 = 2;

/// 0-RTT state of `conn` (RFC 9001 §4.6): a bit set of `QR_0RTT_*` (0: a
/// full handshake). A client only attempts 0-RTT with a ticket from a server
/// that allowed it; should that server refuse the early data after all (its
/// policy changed), the streams opened early are discarded (writes to them
/// fail with `QR_ESTREAM`) and `QR_EVENT_CONNECTED` has `code` 0: send again.
/// Early data can be replayed by an attacker, so a server accepts it only with
/// `accept_0rtt` set, for requests that are safe to run twice.
///
/// Returns: a bit set of `QR_0RTT_*` (>= 0), `QR_ENULL`, `QR_ENOCONN`,
/// `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_0rtt(e: *const qr_engine, conn: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        let z = e
            .engine
            .zero_rtt(ConnHandle::from_bits(conn))
            .map_err(|err| code_of(&err))?;
        Ok(if z.possible { QR_0RTT_POSSIBLE } else { 0 }
            | if z.accepted { QR_0RTT_ACCEPTED } else { 0 })
    })
}

/// Start a key update on `conn` now (RFC 9001 §6) rather than at the AEAD's
/// confidentiality limit, e.g. at a quiet moment of the trading day.
/// `QR_EINVAL` before the handshake is confirmed. An update while the
/// previous one is still in flight is ignored (RFC 9001 §6.5).
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ENOCONN`, `QR_EINVAL` (handshake not
/// confirmed), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_conn_key_update(e: *mut qr_engine, conn: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .force_key_update(ConnHandle::from_bits(conn))
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}
