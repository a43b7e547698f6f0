//! Finding each other without writing TCP code: the address-exchange
//! service (docs/architecture.md §3, `quic_rdma::discovery`).
//! A server publishes its engine's UD address on a TCP port; a client asks
//! once, then talks QUIC over the fabric. Unauthenticated by design: QUIC's
//! TLS handshake authenticates the server afterwards, so a forged answer can
//! only make the connection fail.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::time::Duration;

use quic_rdma::discovery::{query, BootstrapHandle, BootstrapServer, PeerInfo};
use quic_rdma::fabric::ROCEV2_UDP_PORT;

use crate::config::qr_addr;
use crate::engine::qr_engine;
use crate::error::{fail, guard, QR_ECONNECT, QR_EFABRIC, QR_OK};
use crate::ptr::{obj_ref, put, text};

/// A running address-exchange service (`qr_bootstrap_serve`).
pub struct qr_bootstrap {
    _handle: BootstrapHandle,
}

/// Publish `e`'s address on TCP `listen` ("IP:PORT") so peers find it with
/// `qr_bootstrap_query`. Answers on one background thread of its own (the
/// only thread the library starts; the exchange is off the data path) until
/// `qr_bootstrap_free`. `QR_EFABRIC` when the port cannot be bound
/// (`qr_last_error` says why).
///
/// Returns: `QR_OK` with the service in `*out`; `QR_ENULL`, `QR_EINVAL`
/// (`listen` not UTF-8), `QR_EFABRIC` (`listen` not "IP:PORT", or cannot
/// bind), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `listen` NUL-terminated; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_bootstrap_serve(
    e: *const qr_engine,
    listen: *const c_char,
    out: *mut *mut qr_bootstrap,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let (e, listen) = unsafe { (obj_ref(e)?, text(listen)?) };
        // The active MTU (the engine's may be larger: segmentation).
        let info = PeerInfo::of_socket(e.engine.socket(), ROCEV2_UDP_PORT);
        let handle = BootstrapServer::bind(listen, info)
            .and_then(BootstrapServer::spawn)
            .map_err(|err| fail(QR_EFABRIC, format!("address service on {listen}: {err}")))?;
        let b = Box::into_raw(Box::new(qr_bootstrap { _handle: handle }));
        // SAFETY: writable by contract (null-checked by `put`).
        if let Err(err) = unsafe { put(out, b) } {
            // SAFETY: from Box::into_raw just above, never shared.
            drop(unsafe { Box::from_raw(b) });
            return Err(err);
        }
        Ok(QR_OK)
    })
}

/// Stop the service (exchanges in progress end by their 5 s deadline). NULL is a no-op.
///
/// # Safety
/// `b` is NULL or came from `qr_bootstrap_serve` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn qr_bootstrap_free(b: *mut qr_bootstrap) {
    guard(|| {
        if !b.is_null() {
            // SAFETY: from `qr_bootstrap_serve` and never freed before, by contract.
            drop(unsafe { Box::from_raw(b) });
        }
        Ok(QR_OK)
    });
}

/// Ask the service at `server` ("HOST:PORT") for its engine's address, within
/// `timeout_ms` (0: 5 s); the answer goes to `*out`, ready for `qr_connect`.
/// `QR_ECONNECT` when nobody answers or the answer is malformed
/// (`qr_last_error` says which).
///
/// Returns: `QR_OK` with the address in `*out`; `QR_ENULL`, `QR_EINVAL`
/// (`server` not UTF-8), `QR_ECONNECT` (`server` malformed, nobody answered
/// in time, or a malformed answer), `QR_EPANIC`.
///
/// # Safety
/// `server` NUL-terminated; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_bootstrap_query(
    server: *const c_char,
    timeout_ms: u32,
    out: *mut qr_addr,
) -> i32 {
    guard(|| {
        // SAFETY: NUL-terminated by contract.
        let server = unsafe { text(server) }?;
        let timeout = Duration::from_millis(if timeout_ms == 0 {
            5000
        } else {
            timeout_ms.into()
        });
        let info = query(server, timeout)
            .map_err(|err| fail(QR_ECONNECT, format!("address service at {server}: {err}")))?;
        // SAFETY: writable by contract (null-checked by `put`).
        unsafe { put(out, info.addr.into()) }?;
        Ok(QR_OK)
    })
}
