//! A self-signed certificate helper for tests and examples.

use std::ffi::c_char;

use crate::error::{guard, QR_EINVAL, QR_ENULL, QR_ETLS, QR_ETOOSMALL, QR_OK};
use crate::ptr::{put, text};

/// Generate a self-signed certificate for `name` and its PKCS#8 key, both DER,
/// into the caller's buffers. The lengths go to `*cert_len` / `*key_len`; if a
/// buffer is too small, `QR_ETOOSMALL` with the needed lengths set (call again).
/// For tests and examples: production servers load a real certificate.
///
/// # Safety
/// `name` is NUL-terminated; `cert`/`key` point to `cert_cap`/`key_cap`
/// writable bytes; `cert_len`/`key_len` are writable.
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
        if cert.is_null() || key.is_null() || cert_len.is_null() || key_len.is_null() {
            return Err(QR_ENULL);
        }
        if name.is_empty() {
            return Err(QR_EINVAL);
        }
        let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).map_err(|_| QR_ETLS)?;
        let c = ck.cert.der().to_vec();
        let k = ck.key_pair.serialize_der();
        // SAFETY: writable by contract (checked non-null above).
        unsafe {
            put(cert_len, c.len())?;
            put(key_len, k.len())?;
        }
        if c.len() > cert_cap || k.len() > key_cap {
            return Err(QR_ETOOSMALL);
        }
        // SAFETY: `cert`/`key` hold `cert_cap`/`key_cap` >= the lengths written, by contract;
        // the sources are our own vectors, distinct from the caller's memory.
        unsafe {
            std::ptr::copy_nonoverlapping(c.as_ptr(), cert, c.len());
            std::ptr::copy_nonoverlapping(k.as_ptr(), key, k.len());
        }
        Ok(QR_OK)
    })
}
