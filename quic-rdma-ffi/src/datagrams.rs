//! Datagrams over the C API.

use quic_rdma::engine::{ConnHandle, EngineError};

use crate::engine::qr_engine;
use crate::error::{code_of, guard, guard64, QR_ETOOSMALL, QR_OK};
use crate::ptr::{bytes, bytes_mut, obj, put};

/// Send `len` bytes as one datagram on `conn`.
///
/// The payload is copied; at most 1 KiB goes into the engine's shared chunk
/// (no allocation of its own, as for `qr_stream_write`), a larger one into an
/// allocation of its own.
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED`, `QR_ETOOLARGE`
/// (above `qr_datagram_max_size`), `QR_EUNSUPPORTED` (the peer takes no
/// datagrams), `QR_EAGAIN` (send buffer full: retry after
/// `QR_EVENT_DATAGRAMS_WRITABLE`), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `data` points to `len` readable bytes (NULL only with 0).
#[no_mangle]
pub unsafe extern "C" fn qr_datagram_send(
    e: *mut qr_engine,
    conn: u64,
    data: *const u8,
    len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let (e, data) = unsafe { (obj(e)?, bytes(data, len)?) };
        e.engine
            .send_datagram(ConnHandle::from_bits(conn), data)
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Receive one datagram into `buf`; returns its length. `QR_EAGAIN`: none
/// waiting. `QR_ETOOSMALL`: `cap` too small — the datagram is kept and, if
/// `needed` is not NULL, its length written there.
///
/// Returns: the datagram's length (>= 0), `QR_EAGAIN` (none waiting),
/// `QR_ETOOSMALL`, `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED` (closed and nothing
/// left to read), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `buf` points to `cap` writable bytes; `needed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn qr_datagram_recv(
    e: *mut qr_engine,
    conn: u64,
    buf: *mut u8,
    cap: usize,
    needed: *mut usize,
) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let (e, buf) = unsafe { (obj(e)?, bytes_mut(buf, cap)?) };
        match e.engine.recv_datagram(ConnHandle::from_bits(conn), buf) {
            Ok(n) => {
                // Decrypted bytes (see valgrind.rs).
                crate::valgrind::mark_defined(buf.as_ptr(), n);
                Ok(n as i64)
            }
            Err(EngineError::BufferTooSmall { needed: n }) => {
                if !needed.is_null() {
                    // SAFETY: non-null and writable by contract.
                    unsafe { put(needed, n) }?;
                }
                Err(QR_ETOOSMALL)
            }
            Err(err) => Err(code_of(&err)),
        }
    })
}

/// The largest datagram `conn` accepts now (0 if the peer takes none).
///
/// Returns: the size in bytes (>= 0), `QR_ENULL`, `QR_ENOCONN`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_datagram_max_size(e: *mut qr_engine, conn: u64) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let m = e
            .engine
            .max_datagram_size(ConnHandle::from_bits(conn))
            .map_err(|err| code_of(&err))?;
        Ok(m.unwrap_or(0) as i64)
    })
}
