//! `qr_engine_options`: the settings beyond `qr_engine_config` that msquic
//! and quiche offer (issue 29, gap 6), in their own versioned struct that
//! `qr_engine_config.options` (v4) points to. TLS: a key-log callback and
//! server key pins. Everything here is applied through
//! `quic_rdma::quic::TlsSettings`, the one TLS builder.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use quic_rdma::quic::{spki_sha256, SpkiPin, TlsSettings};

use crate::error::{fail, guard, QR_EINVAL, QR_ENULL, QR_ETLS, QR_OK};
use crate::ptr::{bytes, read_versioned, Versioned};

/// A TLS key-log callback: `line` is one line of the NSS key-log format
/// (`SSLKEYLOGFILE`: `LABEL <client random, hex> <secret, hex>`), without a
/// newline, NUL-terminated, `len` bytes before the NUL; it lives only for the
/// call. Called on the thread that drives the engine (inside `qr_connect`
/// or a poll), never on another, during handshakes only.
pub type qr_keylog_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, line: *const c_char, len: usize)>;

/// Bytes of a SHA-256 pin (`qr_engine_options.pin_sha256` holds a multiple).
pub const QR_PIN_SHA256_LEN: usize = 32;
/// The most pins `qr_engine_options.pin_count` accepts.
pub const QR_PIN_MAX: usize = 64;
/// The `code` of the `QR_EVENT_CONNECTION_LOST` (reason
/// `QR_CLOSE_LOCAL_TRANSPORT`) a client reports when the server's key
/// matches no pin: QUIC's CRYPTO_ERROR for the TLS alert access_denied
/// (0x100 + 49, RFC 9001 §4.8). An untrusted chain is another alert
/// (bad_certificate 0x12a or unknown_ca 0x130).
pub const QR_CLOSE_CODE_PIN_MISMATCH: u64 = 0x131;

/// Optional engine settings (`qr_engine_config.options`). Version 1. All
/// zero (or a NULL `options`) changes nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_engine_options {
    /// `sizeof(qr_engine_options)` as the caller knows it.
    pub struct_size: u32,
    /// Reserved: must be zero.
    pub reserved: u32,
    /// TLS key logging, client and server side: called with each secret the
    /// handshake derives (NULL: none). Whoever has these lines can decrypt
    /// the connection's traffic (e.g. in Wireshark): for debugging only.
    pub keylog: qr_keylog_fn,
    /// Passed to `keylog` as is.
    pub keylog_user: *mut c_void,
    /// Client side: `pin_count` SHA-256 digests (32 bytes each, back to back)
    /// of server SubjectPublicKeyInfos (`qr_tls_spki_sha256`). With any pin,
    /// a server is accepted only if its certificate chain verifies against
    /// `ca_der` as always and its key matches one pin; otherwise the
    /// connection fails with `QR_CLOSE_CODE_PIN_MISMATCH`. NULL with 0: no
    /// pinning. Copied by `qr_engine_new`.
    pub pin_sha256: *const u8,
    /// Number of pins at `pin_sha256` (0..=`QR_PIN_MAX`).
    pub pin_count: usize,
}

// SAFETY: repr(C), first field u32 struct_size, fields valid when zeroed
// (`keylog` is an Option of a function pointer: zero is None).
unsafe impl Versioned for qr_engine_options {
    const V1_SIZE: usize = size_of::<qr_engine_options>();
}

/// The C key-log callback as rustls's `KeyLog`.
struct CKeyLog {
    cb: unsafe extern "C" fn(*mut c_void, *const c_char, usize),
    user: *mut c_void,
}

impl std::fmt::Debug for CKeyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CKeyLog")
    }
}

// SAFETY: the engine has no threads of its own: rustls calls `log` only
// inside the caller's own calls on the engine, on the caller's thread, and
// the header says so; `user` is the caller's to share as it chooses.
unsafe impl Send for CKeyLog {}
// SAFETY: as for Send: never called from two threads at once by this library.
unsafe impl Sync for CKeyLog {}

impl rustls::KeyLog for CKeyLog {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        use std::fmt::Write as _;
        let mut line = String::with_capacity(label.len() + 2 + 2 * (32 + secret.len()));
        line.push_str(label);
        for part in [client_random, secret] {
            line.push(' ');
            for b in part {
                let _ = write!(line, "{b:02x}");
            }
        }
        let len = line.len();
        // Labels and hex hold no NUL.
        let Ok(line) = CString::new(line) else { return };
        // SAFETY: the caller's callback with its own user pointer; the line is
        // NUL-terminated and lives for the call.
        unsafe { (self.cb)(self.user, line.as_ptr(), len) };
    }
}

impl qr_engine_options {
    /// Read the caller's options (NULL: none) into `tls`.
    ///
    /// # Safety
    /// `p` is NULL or a `qr_engine_options` of its `struct_size` whose
    /// `pin_sha256` holds `pin_count * 32` readable bytes.
    pub(crate) unsafe fn apply(
        p: *const qr_engine_options,
        tls: &mut TlsSettings,
    ) -> Result<(), i32> {
        if p.is_null() {
            return Ok(());
        }
        // SAFETY: non-null, and the caller's contract.
        let o = unsafe { read_versioned(p, "qr_engine_options") }?;
        if o.reserved != 0 {
            return Err(fail(QR_EINVAL, "qr_engine_options.reserved must be zero"));
        }
        if let Some(cb) = o.keylog {
            tls.key_log = Some(Arc::new(CKeyLog {
                cb,
                user: o.keylog_user,
            }));
        }
        if o.pin_count > QR_PIN_MAX {
            return Err(fail(
                QR_EINVAL,
                format!(
                    "pin_count {} is over QR_PIN_MAX ({QR_PIN_MAX})",
                    o.pin_count
                ),
            ));
        }
        // SAFETY: `pin_count` (bounded above) pins of 32 bytes, by contract.
        let pins = unsafe { bytes(o.pin_sha256, o.pin_count * QR_PIN_SHA256_LEN) }?;
        tls.pinned_spki_sha256 = pins
            .chunks_exact(QR_PIN_SHA256_LEN)
            .map(|c| SpkiPin::try_from(c).expect("chunks of 32"))
            .collect();
        Ok(())
    }
}

/// The SHA-256 of the SubjectPublicKeyInfo of the DER certificate `cert`
/// (the leaf of a chain), into `out[32]`: the pin a client puts in
/// `qr_engine_options.pin_sha256` to accept only a server with this key
/// (the same value as `openssl x509 -pubkey -noout | openssl pkey -pubin
/// -outform der | sha256sum`, RFC 7469 §2.4). It stays valid when the
/// certificate is re-issued for the same key.
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ETLS` (not a DER certificate; PEM must
/// be decoded first), `QR_EPANIC`.
///
/// # Safety
/// `cert` points to `len` readable bytes; `out` to 32 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_tls_spki_sha256(cert: *const u8, len: usize, out: *mut u8) -> i32 {
    guard(|| {
        if cert.is_null() || out.is_null() {
            return Err(QR_ENULL);
        }
        // SAFETY: `len` readable bytes at `cert`, by contract (non-null).
        let der = unsafe { bytes(cert, len) }?;
        let pin = spki_sha256(der)
            .ok_or_else(|| fail(QR_ETLS, "not a DER X.509 certificate (decode PEM first)"))?;
        // SAFETY: `out` holds 32 writable bytes by contract (non-null).
        unsafe { std::ptr::copy_nonoverlapping(pin.as_ptr(), out, pin.len()) };
        crate::valgrind::mark_defined(out, pin.len());
        Ok(QR_OK)
    })
}
