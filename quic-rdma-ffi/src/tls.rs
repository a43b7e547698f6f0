//! TLS helpers: a self-signed certificate for tests and examples, and
//! loading certificate and key files.

use std::cell::RefCell;
use std::ffi::c_char;

use crate::error::{fail, guard, QR_EINVAL, QR_ENULL, QR_ETLS, QR_ETOOSMALL, QR_OK};
use crate::ptr::{copy_out, put, text};

/// A certificate made for a size query: its name, certificate and key (DER).
struct Kept {
    name: String,
    cert: Vec<u8>,
    key: Vec<u8>,
}

thread_local! {
    /// The last certificate a size query made: the call that follows with the
    /// same name and big enough buffers gets exactly it (a new key pair would
    /// have another signature, often of another length).
    static LAST: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

/// Generate a self-signed certificate for `name` and its PKCS#8 key, both DER,
/// into the caller's buffers. The lengths go to `*cert_len` / `*key_len`.
///
/// Size query: with buffers too small (or NULL with capacity 0) it returns
/// `QR_ETOOSMALL` with the needed lengths set, and keeps that certificate for
/// the next call on the same thread with the same `name`, which copies exactly
/// it — so "ask the size, allocate, call again" always succeeds.
/// For tests and examples: production servers load a real certificate.
///
/// Returns: `QR_OK`, `QR_ETOOSMALL` (lengths set; call again), `QR_ENULL`,
/// `QR_EINVAL` (`name` empty or not UTF-8), `QR_ETLS` (generation failed),
/// `QR_EPANIC`.
///
/// # Safety
/// `name` is NUL-terminated; `cert`/`key` point to `cert_cap`/`key_cap`
/// writable bytes (NULL only with capacity 0); `cert_len`/`key_len` are writable.
#[no_mangle]
pub unsafe extern "C" fn qr_tls_selfsigned(
    name: *const c_char,
    cert: *mut u8,
    cert_cap: usize,
    cert_len: *mut usize,
    key: *mut u8,
    key_cap: usize,
    key_len: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: NUL-terminated by contract (null-checked).
        let name = unsafe { text(name) }?;
        if (cert.is_null() && cert_cap > 0)
            || (key.is_null() && key_cap > 0)
            || cert_len.is_null()
            || key_len.is_null()
        {
            return Err(QR_ENULL);
        }
        if name.is_empty() {
            return Err(QR_EINVAL);
        }
        let kept = LAST.with_borrow_mut(|l| match l.take() {
            Some(k) if k.name == name => Some((k.cert, k.key)),
            _ => None,
        });
        let (c, k) = match kept {
            Some(ck) => ck,
            None => {
                let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()])
                    .map_err(|_| QR_ETLS)?;
                (ck.cert.der().to_vec(), ck.key_pair.serialize_der())
            }
        };
        // SAFETY: writable by contract (checked non-null above).
        unsafe {
            put(cert_len, c.len())?;
            put(key_len, k.len())?;
        }
        if c.len() > cert_cap || k.len() > key_cap {
            LAST.with_borrow_mut(|l| {
                *l = Some(Kept {
                    name: name.to_owned(),
                    cert: c,
                    key: k,
                })
            });
            return Err(QR_ETOOSMALL);
        }
        // SAFETY: `cert`/`key` hold `cert_cap`/`key_cap` >= the lengths written
        // (so non-null here), by contract; the sources are our own vectors.
        unsafe {
            std::ptr::copy_nonoverlapping(c.as_ptr(), cert, c.len());
            std::ptr::copy_nonoverlapping(k.as_ptr(), key, k.len());
        }
        Ok(QR_OK)
    })
}

/// Read the file at `path` (a PEM or DER certificate, chain or key) into
/// `buf`, for the `qr_engine_config` TLS fields; `*len` gets its length.
/// Size query: with `buf` NULL or `cap` too small it returns `QR_ETOOSMALL`
/// with `*len` set. A missing or unreadable file is `QR_EINVAL`, with the
/// path and the reason in `qr_last_error`.
///
/// Returns: the file's length (>= 0), `QR_ETOOSMALL` (`*len` set), `QR_ENULL`,
/// `QR_EINVAL` (missing or unreadable file), `QR_EPANIC`.
///
/// # Safety
/// `path` is NUL-terminated; `buf` points to `cap` writable bytes (NULL only
/// with 0); `len` is writable.
#[no_mangle]
pub unsafe extern "C" fn qr_tls_load_file(
    path: *const c_char,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: NUL-terminated by contract (null-checked).
        let path = unsafe { text(path) }?;
        if (buf.is_null() && cap > 0) || len.is_null() {
            return Err(QR_ENULL);
        }
        let data =
            std::fs::read(path).map_err(|e| fail(QR_EINVAL, format!("cannot read {path}: {e}")))?;
        // SAFETY: `buf`/`cap` and `len` as the caller's contract says.
        unsafe { copy_out(&data, buf, cap, len) }?;
        Ok(QR_OK)
    })
}
