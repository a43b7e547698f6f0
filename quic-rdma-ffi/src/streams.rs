//! Streams over the C API.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

use bytes::Bytes;
use quic_rdma::engine::{ConnHandle, StreamId};
use quinn_proto::VarInt;

use crate::engine::qr_engine;
use crate::error::{code_of, guard, guard64, QR_EINVAL, QR_ENULL, QR_OK};
use crate::ptr::{bytes, bytes_mut, obj, put};

pub(crate) fn sid(s: u64) -> Result<StreamId, i32> {
    VarInt::from_u64(s)
        .map(StreamId::from)
        .map_err(|_| QR_EINVAL)
}

/// Open a stream on `conn` (`bidi` nonzero: bidirectional); its id goes to `*stream`.
/// `QR_EAGAIN` when the peer's stream limit is reached (`QR_EVENT_STREAMS_AVAILABLE` follows).
///
/// Returns: `QR_OK` with the id in `*stream`; `QR_ENULL`, `QR_ENOCONN`,
/// `QR_ECLOSED`, `QR_EAGAIN` (stream limit), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `stream` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_open(
    e: *mut qr_engine,
    conn: u64,
    bidi: i32,
    stream: *mut u64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        if stream.is_null() {
            return Err(QR_ENULL);
        }
        let h = ConnHandle::from_bits(conn);
        let s = if bidi != 0 {
            e.engine.open_bi(h)
        } else {
            e.engine.open_uni(h)
        }
        .map_err(|err| code_of(&err))?;
        // SAFETY: writable by contract, checked non-null above.
        unsafe { put(stream, u64::from(s)) }?;
        Ok(QR_OK)
    })
}

/// Write up to `len` bytes; returns how many were taken (> 0; 0 only for
/// `len == 0`, which sends nothing) or a negative code (`QR_EAGAIN` when flow
/// control admits nothing now; `QR_ESTREAM` for a stream id that was never
/// opened, by us or by the peer, or not writable by us).
///
/// Allocations: none for the copy quinn-proto keeps until the peer
/// acknowledges it when `len` is at most 1 KiB (it goes into the engine's
/// shared 16 KiB chunk, reused once all it holds is acknowledged; a new chunk
/// only while the old one is still held), one for a larger write. And one
/// when the stream's send buffer had drained (every byte acknowledged):
/// quinn-proto 0.11 frees its queue of unacked segments then and allocates
/// it again on the next write. A request/response loop of small messages
/// therefore makes one per call (`tests/c_api_alloc.rs` measures it); a
/// stream that keeps data in flight, none.
///
/// Returns: the bytes taken (>= 0), `QR_EAGAIN`, `QR_ESTREAM`, `QR_ESTOPPED`
/// (the peer sent STOP_SENDING), `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED`,
/// `QR_EINVAL` (`stream` at or above 2^62), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `data` points to `len` readable bytes (NULL only with 0).
#[no_mangle]
pub unsafe extern "C" fn qr_stream_write(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    data: *const u8,
    len: usize,
) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let (e, data) = unsafe { (obj(e)?, bytes(data, len)?) };
        let n = e
            .engine
            .write(ConnHandle::from_bits(conn), sid(stream)?, data)
            .map_err(|err| code_of(&err))?;
        Ok(n as i64)
    })
}

/// Called when the library holds no more references to a buffer given to
/// `qr_stream_write_zc`; `user`, `data` and `len` are what that call got.
pub type qr_release_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, data: *const u8, len: usize)>;

/// A caller's buffer lent to quinn-proto; its release callback runs when the
/// last reference (the unacknowledged bytes quinn-proto keeps) is dropped.
struct Lent {
    data: *const u8,
    len: usize,
    release: unsafe extern "C" fn(*mut c_void, *const u8, usize),
    user: *mut c_void,
}

// SAFETY: the caller of `qr_stream_write_zc` keeps `data` valid and unchanged
// until `release` runs and makes `release` callable from the thread dropping
// the last reference (the thread that polls the engine).
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `data` points to `len` readable bytes until release, by the
        // contract of `qr_stream_write_zc`.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: the callback the caller gave, with its own arguments, once.
        unsafe { (self.release)(self.user, self.data, self.len) }
    }
}

/// `qr_stream_write` without the copy: quinn-proto keeps references into
/// `data` until the peer acknowledges the bytes (or the stream ends), then
/// `release(user, data, len)` runs — exactly once per call, on the thread
/// polling the engine, or before this call returns when nothing was taken
/// (`QR_EAGAIN` and other errors). Returns the bytes taken (a prefix of
/// `data`); write the rest with another call. Keep `data` valid and
/// unchanged until `release`. No copy of the payload; allocations: one for
/// the lent buffer's reference count and release hook (`Bytes::from_owner`),
/// and one more when the stream's send buffer had drained, as for
/// `qr_stream_write` (two per call in a request/response loop, one while
/// data stays in flight). For messages of 1 KiB or less the copying
/// `qr_stream_write` allocates less.
///
/// Returns: the bytes taken (>= 0), `QR_EAGAIN`, `QR_ESTREAM`, `QR_ESTOPPED`,
/// `QR_ENULL` (also a NULL `release`), `QR_ENOCONN`, `QR_ECLOSED`, `QR_EINVAL`
/// (`stream` at or above 2^62), `QR_EPANIC`; `release` has run before an error
/// returns.
///
/// # Safety
/// `e` is a live engine; `data` points to `len` readable bytes that stay valid
/// and unchanged until `release` runs; `release` is non-NULL and callable with
/// `user` from the polling thread.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_write_zc(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    data: *const u8,
    len: usize,
    release: qr_release_fn,
    user: *mut c_void,
) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let release = release.ok_or(QR_ENULL)?;
        if data.is_null() {
            return Err(QR_ENULL);
        }
        let stream = sid(stream)?;
        let mut chunk = Bytes::from_owner(Lent {
            data,
            len,
            release,
            user,
        });
        let n = e
            .engine
            .write_chunk(ConnHandle::from_bits(conn), stream, &mut chunk)
            .map_err(|err| code_of(&err))?;
        Ok(n as i64)
    })
}

/// Read up to `cap` bytes into `buf`; returns the count (≥ 0). `*fin` (if not
/// NULL) is set to 1 once the stream's end has been read, else 0.
/// `QR_EAGAIN`: nothing yet; `QR_ERESET`: reset by the peer; `QR_ESTREAM`: closed.
///
/// Returns: the bytes read (>= 0; 0 with `*fin` 1 at the end), `QR_EAGAIN`,
/// `QR_ERESET`, `QR_ESTREAM`, `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED`,
/// `QR_EINVAL` (`stream` at or above 2^62), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `buf` points to `cap` writable bytes; `fin` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_read(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    buf: *mut u8,
    cap: usize,
    fin: *mut i32,
) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let (e, buf) = unsafe { (obj(e)?, bytes_mut(buf, cap)?) };
        let r = e
            .engine
            .read(ConnHandle::from_bits(conn), sid(stream)?, buf)
            .map_err(|err| code_of(&err))?;
        // Decrypted bytes (see valgrind.rs).
        crate::valgrind::mark_defined(buf.as_ptr(), r.len);
        if !fin.is_null() {
            // SAFETY: non-null and writable by contract.
            unsafe { put(fin, i32::from(r.fin)) }?;
        }
        Ok(r.len as i64)
    })
}

/// Reset `stream` (stop sending, RESET_STREAM with `code`). `QR_ESTREAM` for a
/// stream id never opened (no frame is sent for it).
///
/// Returns: `QR_OK`, `QR_ESTREAM`, `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED`,
/// `QR_EINVAL` (`stream` or `code` at or above 2^62), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_reset(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    code: u64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .reset(ConnHandle::from_bits(conn), sid(stream)?, code)
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Ask the peer to stop sending on `stream` (STOP_SENDING with `code`).
/// `QR_ESTREAM` for a stream id never opened (no frame is sent for it).
///
/// Returns: `QR_OK`, `QR_ESTREAM`, `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED`,
/// `QR_EINVAL` (`stream` or `code` at or above 2^62), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_stop(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    code: u64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .stop(ConnHandle::from_bits(conn), sid(stream)?, code)
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Set `stream`'s send priority (higher first).
///
/// Returns: `QR_OK`, `QR_ESTREAM`, `QR_ENULL`, `QR_ENOCONN`, `QR_ECLOSED`,
/// `QR_EINVAL` (`stream` at or above 2^62), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_set_priority(
    e: *mut qr_engine,
    conn: u64,
    stream: u64,
    priority: i32,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .set_priority(ConnHandle::from_bits(conn), sid(stream)?, priority)
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Finish `stream`: no more data; `QR_EVENT_STREAM_FINISHED` follows once all is acknowledged.
/// `QR_ESTREAM` for a stream id never opened (no frame is sent for it).
///
/// Returns: `QR_OK`, `QR_ESTREAM`, `QR_ESTOPPED`, `QR_ENULL`, `QR_ENOCONN`,
/// `QR_ECLOSED`, `QR_EINVAL` (`stream` at or above 2^62), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_stream_finish(e: *mut qr_engine, conn: u64, stream: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .finish(ConnHandle::from_bits(conn), sid(stream)?)
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}
