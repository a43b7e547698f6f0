//! Error codes, `qr_strerror`, and the panic guard every entry point uses.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use quic_rdma::engine::EngineError;

/// Success.
pub const QR_OK: i32 = 0;
/// A required pointer argument was NULL.
pub const QR_ENULL: i32 = -1;
/// An argument is out of range or malformed (bad GID text, code above 2^62, ...).
pub const QR_EINVAL: i32 = -2;
/// Nothing can be done now; retry after the matching event.
pub const QR_EAGAIN: i32 = -3;
/// The connection id names no live connection (never existed, or drained).
pub const QR_ENOCONN: i32 = -4;
/// The stream is closed, unknown, or of the wrong direction for this call.
pub const QR_ESTREAM: i32 = -5;
/// The peer reset the stream.
pub const QR_ERESET: i32 = -6;
/// The peer asked us to stop sending on the stream.
pub const QR_ESTOPPED: i32 = -7;
/// The caller's buffer is too small; nothing was consumed.
pub const QR_ETOOSMALL: i32 = -8;
/// The connection is closed or lost.
pub const QR_ECLOSED: i32 = -9;
/// The item is larger than allowed (a datagram above the path's maximum).
pub const QR_ETOOLARGE: i32 = -10;
/// The peer does not accept datagrams.
pub const QR_EUNSUPPORTED: i32 = -11;
/// TLS configuration failed (bad certificate, key or roots), or no client config.
pub const QR_ETLS: i32 = -12;
/// The fabric or socket failed (provider error, MTU too small, ...).
pub const QR_EFABRIC: i32 = -13;
/// The incoming-connection id is unknown or already decided.
pub const QR_ENOINCOMING: i32 = -14;
/// The connection could not be started (bad address, CIDs exhausted).
pub const QR_ECONNECT: i32 = -15;
/// A bug: a panic was caught at the API boundary. The object may be unusable.
pub const QR_EPANIC: i32 = -16;
/// The requested provider is not available in this build.
pub const QR_ENOPROVIDER: i32 = -17;

/// A static, NUL-terminated description of `code` (never NULL).
#[no_mangle]
pub extern "C" fn qr_strerror(code: i32) -> *const c_char {
    let s: &'static [u8] = match code {
        QR_OK => b"success\0",
        QR_ENULL => b"null pointer argument\0",
        QR_EINVAL => b"invalid argument\0",
        QR_EAGAIN => b"would block; retry after the matching event\0",
        QR_ENOCONN => b"unknown or stale connection\0",
        QR_ESTREAM => b"stream closed, unknown or of the wrong direction\0",
        QR_ERESET => b"stream reset by peer\0",
        QR_ESTOPPED => b"stream stopped by peer\0",
        QR_ETOOSMALL => b"buffer too small\0",
        QR_ECLOSED => b"connection closed\0",
        QR_ETOOLARGE => b"datagram too large\0",
        QR_EUNSUPPORTED => b"datagrams not supported by peer\0",
        QR_ETLS => b"TLS configuration error\0",
        QR_EFABRIC => b"fabric or socket error\0",
        QR_ENOINCOMING => b"unknown or already decided incoming connection\0",
        QR_ECONNECT => b"connection could not be started\0",
        QR_EPANIC => b"internal error (panic caught at the API boundary)\0",
        QR_ENOPROVIDER => b"provider not available in this build\0",
        c if c > 0 => b"success (count)\0",
        _ => b"unknown error code\0",
    };
    s.as_ptr().cast()
}

/// The code of an engine error.
pub(crate) fn code_of(e: &EngineError) -> i32 {
    match e {
        EngineError::UnknownConnection => QR_ENOCONN,
        EngineError::UnknownIncoming => QR_ENOINCOMING,
        EngineError::WouldBlock => QR_EAGAIN,
        EngineError::ClosedStream => QR_ESTREAM,
        EngineError::StreamReset(_) => QR_ERESET,
        EngineError::StreamStopped(_) => QR_ESTOPPED,
        EngineError::BufferTooSmall { .. } => QR_ETOOSMALL,
        EngineError::DatagramTooLarge { .. } => QR_ETOOLARGE,
        EngineError::DatagramsUnsupported => QR_EUNSUPPORTED,
        EngineError::ConnectionLost(_) => QR_ECLOSED,
        EngineError::NoClientConfig | EngineError::Tls(_) => QR_ETLS,
        EngineError::Connect(_) => QR_ECONNECT,
        EngineError::InvalidArgument(_) => QR_EINVAL,
        EngineError::Socket(_) => QR_EFABRIC,
        _ => QR_EINVAL,
    }
}

/// Run an entry point's body; a panic becomes `QR_EPANIC`, an `Err(code)` its code.
pub(crate) fn guard(f: impl FnOnce() -> Result<i32, i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) | Ok(Err(v)) => v,
        Err(_) => QR_EPANIC,
    }
}

/// [`guard`] for entry points returning a byte count.
pub(crate) fn guard64(f: impl FnOnce() -> Result<i64, i32>) -> i64 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(c)) => i64::from(c),
        Err(_) => i64::from(QR_EPANIC),
    }
}
