//! Error codes, `qr_strerror`, and the panic guard every entry point uses.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};

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
/// No RDMA device (or not the one named): `qr_last_error` says which and how to fix it.
pub const QR_ENODEVICE: i32 = -18;
/// The process already has a logger of another kind (another `tracing` subscriber).
pub const QR_EBUSY: i32 = -19;
/// The engine has no descriptor to sleep on (`sim`): keep polling, or let
/// `qr_engine_wait` sleep, which works for every provider.
pub const QR_ENOFD: i32 = -20;

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
        QR_ENODEVICE => b"no RDMA device (see qr_last_error)\0",
        QR_EBUSY => b"another logger is already installed in this process\0",
        QR_ENOFD => b"no readiness descriptor for this provider (sim): keep polling\0",
        c if c > 0 => b"success (count)\0",
        _ => b"unknown error code\0",
    };
    s.as_ptr().cast()
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Whether `LAST_ERROR` belongs to the most recent call on this thread:
    /// every entry point clears it on entry (a flag, not the string, so the
    /// data path never allocates or frees to clear it).
    static LAST_ERROR_SET: Cell<bool> = const { Cell::new(false) };
}

/// Record why a call fails (for `qr_last_error`) and return its code.
pub(crate) fn fail(code: i32, why: impl std::fmt::Display) -> i32 {
    let msg = CString::new(why.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with_borrow_mut(|m| *m = msg);
    LAST_ERROR_SET.set(true);
    code
}

/// Forget the previous call's message: what every entry point does first.
fn clear_last_error() {
    LAST_ERROR_SET.set(false);
}

/// Why the most recent call on this thread failed, in words that name the
/// fix; never NULL. Like `errno`, but cleared: every `qr_*` call except
/// `qr_last_error`, `qr_strerror`, `qr_version` and `qr_version_number`
/// empties it on entry, and a failing call may set it, so it always
/// describes the last call made — an empty string after a success, and after
/// a failure whose code says all (the data path's `QR_EAGAIN`, `QR_ENULL`,
/// ...: they record nothing, so a busy-polled loop never allocates). Read it
/// right after the failing call; the pointer stays valid until the next
/// `qr_*` call on this thread.
#[no_mangle]
pub extern "C" fn qr_last_error() -> *const c_char {
    if !LAST_ERROR_SET.get() {
        return c"".as_ptr();
    }
    // The CString lives in the thread-local until the next `fail` replaces it.
    LAST_ERROR.with_borrow(|m| m.as_ptr())
}

/// The code of an engine error. Setup errors also record their message for
/// `qr_last_error`; the data path's codes (`QR_EAGAIN`, ...) record nothing,
/// so a busy-polled send loop does not allocate.
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
        EngineError::NoClientConfig => fail(
            QR_ETLS,
            "no client TLS config: set ca_der in qr_engine_config",
        ),
        EngineError::Tls(m) => fail(QR_ETLS, m),
        EngineError::Connect(_) => fail(QR_ECONNECT, e),
        EngineError::InvalidArgument(_) => fail(QR_EINVAL, e),
        EngineError::Socket(_) | EngineError::Wait(_) => fail(QR_EFABRIC, e),
        _ => fail(QR_EINVAL, e),
    }
}

/// Panic policy: a bug caught at the API boundary returns `QR_EPANIC` (the default).
pub const QR_PANIC_RETURN: u32 = 0;
/// Panic policy: a bug caught at the API boundary aborts the process (no
/// half-updated engine is ever used again; a core dump shows where).
pub const QR_PANIC_ABORT: u32 = 1;

static PANIC_POLICY: AtomicU32 = AtomicU32::new(QR_PANIC_RETURN);

/// Choose what a panic inside the library does (process-wide): one of
/// `QR_PANIC_*`. Returns the previous policy, or `QR_EINVAL`.
///
/// Returns: the previous policy (>= 0), `QR_EINVAL`.
#[no_mangle]
pub extern "C" fn qr_set_panic_policy(policy: u32) -> i32 {
    clear_last_error();
    if policy > QR_PANIC_ABORT {
        return fail(QR_EINVAL, "policy is not one of QR_PANIC_*");
    }
    PANIC_POLICY.swap(policy, Ordering::Relaxed) as i32
}

/// A panic reached the boundary: abort, or report it as `QR_EPANIC`.
fn panicked(payload: &(dyn std::any::Any + Send)) -> i32 {
    if PANIC_POLICY.load(Ordering::Relaxed) == QR_PANIC_ABORT {
        std::process::abort();
    }
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    fail(QR_EPANIC, format!("internal error: {what}"))
}

/// Run an entry point's body; a panic becomes `QR_EPANIC` (or aborts, by
/// [`qr_set_panic_policy`]), an `Err(code)` its code.
pub(crate) fn guard(f: impl FnOnce() -> Result<i32, i32>) -> i32 {
    clear_last_error();
    // Marked defined for memcheck: counts come from decrypted data.
    crate::valgrind::defined(match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) | Ok(Err(v)) => v,
        Err(p) => panicked(&*p),
    })
}

/// [`guard`] for entry points returning a byte count.
pub(crate) fn guard64(f: impl FnOnce() -> Result<i64, i32>) -> i64 {
    clear_last_error();
    crate::valgrind::defined(match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(c)) => i64::from(c),
        Err(p) => i64::from(panicked(&*p)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_code_with_its_message() {
        assert_eq!(qr_set_panic_policy(7), QR_EINVAL);
        assert_eq!(qr_set_panic_policy(QR_PANIC_RETURN), QR_PANIC_RETURN as i32);
        assert_eq!(guard(|| panic!("boom {}", 1)), QR_EPANIC);
        // SAFETY: qr_last_error returns a live NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(qr_last_error()) };
        assert_eq!(msg.to_str().unwrap(), "internal error: boom 1");
        assert_eq!(guard64(|| Ok(5)), 5);
        // SAFETY: as above.
        let msg = unsafe { std::ffi::CStr::from_ptr(qr_last_error()) };
        assert_eq!(msg.to_bytes(), b"", "a success clears the previous message");
        assert_eq!(guard64(|| Err(QR_EAGAIN)), i64::from(QR_EAGAIN));
    }
}
