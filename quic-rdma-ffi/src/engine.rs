//! `qr_engine`: one poll-mode QUIC endpoint over one UD queue pair.
#![allow(non_camel_case_types)]

use std::net::IpAddr;
use std::time::Instant;

use quic_rdma::engine::{
    client_config, server_config, AcceptPolicy, ConnHandle, Engine, EngineConfig, Event, IncomingId,
};
use quic_rdma::fabric::sim::SimQpOptions;
use quic_rdma::fabric::{Gid, UdQueuePair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::config::{
    qr_addr, qr_engine_config, QR_ACCEPT_ALL, QR_ACCEPT_MANUAL, QR_ACCEPT_REFUSE, QR_ACCEPT_RETRY,
};
use crate::error::{code_of, guard, guard64, QR_EFABRIC, QR_EINVAL, QR_OK};
use crate::events::qr_event;
use crate::fabric::qr_fabric;
use crate::ptr::{bytes, obj, obj_ref, put, read_versioned, text};

/// An engine. Not thread-safe: use one from one thread at a time.
pub struct qr_engine {
    pub(crate) engine: Engine<Box<dyn UdQueuePair>>,
    /// Events polled but not yet handed out (the caller's array was full).
    pending: Vec<Event>,
    cursor: usize,
}

fn policy(p: u32) -> Result<AcceptPolicy, i32> {
    Ok(match p {
        QR_ACCEPT_ALL => AcceptPolicy::AcceptAll,
        QR_ACCEPT_REFUSE => AcceptPolicy::RefuseAll,
        QR_ACCEPT_RETRY => AcceptPolicy::RetryThenAccept,
        QR_ACCEPT_MANUAL => AcceptPolicy::Manual,
        _ => return Err(QR_EINVAL),
    })
}

/// Create an engine on `fabric` from `cfg` into `*out`: a queue pair on the
/// port with GID `cfg->gid`, a UD socket over it, a QUIC endpoint over that.
///
/// # Safety
/// `fabric` is a live `qr_fabric`; `cfg` points to at least `cfg->struct_size`
/// bytes with valid string and buffer pointers; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_new(
    fabric: *const qr_fabric,
    cfg: *const qr_engine_config,
    out: *mut *mut qr_engine,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let (f, c) = unsafe { (obj_ref(fabric)?, read_versioned(cfg)?) };
        // SAFETY: NUL-terminated by contract (null-checked).
        let gid_text = unsafe { text(c.gid) }?;
        let gid: Gid = match gid_text.parse::<IpAddr>().map_err(|_| QR_EINVAL)? {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        };
        // SAFETY: buffer pointers with their lengths, by contract (NULL allowed with 0).
        let (cert, key, ca) = unsafe {
            (
                bytes(c.cert_der, c.cert_der_len)?,
                bytes(c.key_der, c.key_der_len)?,
                bytes(c.ca_der, c.ca_der_len)?,
            )
        };
        let mtu = f.sim.config().mtu.bytes();
        let mut ecfg = EngineConfig {
            accept: policy(c.accept_policy)?,
            routing_key: c.routing_key,
            ..EngineConfig::default()
        };
        if !cert.is_empty() {
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.to_vec()));
            ecfg.server = Some(
                server_config(vec![CertificateDer::from(cert.to_vec())], key, mtu)
                    .map_err(|e| code_of(&e))?,
            );
        }
        if !ca.is_empty() {
            ecfg.client = Some(
                client_config([CertificateDer::from(ca.to_vec())], mtu).map_err(|e| code_of(&e))?,
            );
        }
        let qp = f
            .sim
            .create_qp(gid, SimQpOptions::default())
            .map_err(|_| QR_EFABRIC)?;
        let engine =
            Engine::new(Box::new(qp) as Box<dyn UdQueuePair>, ecfg).map_err(|e| code_of(&e))?;
        let e = Box::into_raw(Box::new(qr_engine {
            engine,
            pending: Vec::with_capacity(256),
            cursor: 0,
        }));
        // SAFETY: `out` writable by contract (null-checked by `put`).
        if let Err(err) = unsafe { put(out, e) } {
            // SAFETY: from Box::into_raw just above, never shared.
            drop(unsafe { Box::from_raw(e) });
            return Err(err);
        }
        Ok(QR_OK)
    })
}

/// Free an engine (its connections are dropped without a CONNECTION_CLOSE;
/// close them first for a graceful end). NULL is a no-op.
///
/// # Safety
/// `e` is NULL or came from `qr_engine_new` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_free(e: *mut qr_engine) {
    guard(|| {
        if !e.is_null() {
            // SAFETY: from `qr_engine_new` and never freed before, by contract.
            drop(unsafe { Box::from_raw(e) });
        }
        Ok(QR_OK)
    });
}

/// Our address, for peers to connect to.
///
/// # Safety
/// `e` is a live engine; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_local_addr(e: *const qr_engine, out: *mut qr_addr) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        // SAFETY: writable by contract.
        unsafe { put(out, e.engine.local_addr().into()) }?;
        Ok(QR_OK)
    })
}

/// The active MTU of the engine's fabric port.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_mtu(e: *const qr_engine) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        Ok(e.engine.mtu() as i32)
    })
}

/// Drive the engine (receive, timers, transmit) and write up to `cap` events
/// into `events`. Returns how many were written (≥ 0). Events that did not fit
/// are kept and returned first by the next call (which then does no I/O), so a
/// small array loses nothing.
///
/// # Safety
/// `e` is a live engine; `events` points to `cap` writable `qr_event`s.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_poll(
    e: *mut qr_engine,
    events: *mut qr_event,
    cap: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        if events.is_null() && cap > 0 {
            return Err(crate::error::QR_ENULL);
        }
        if e.cursor == e.pending.len() {
            e.pending.clear();
            e.cursor = 0;
            e.engine.poll(Instant::now(), &mut e.pending);
        }
        let n = (e.pending.len() - e.cursor).min(cap).min(i32::MAX as usize);
        for (i, ev) in e.pending[e.cursor..e.cursor + n].iter().enumerate() {
            // SAFETY: i < n <= cap and `events` holds `cap` writable entries.
            unsafe { events.add(i).write(qr_event::from(*ev)) };
        }
        e.cursor += n;
        Ok(n as i32)
    })
}

/// Microseconds until the engine needs a `qr_engine_poll` even if nothing
/// arrives (0: now), or -1 with no timer armed. For callers that sleep.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_next_timeout_us(e: *mut qr_engine) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        Ok(match e.engine.next_deadline() {
            None => -1,
            Some(t) => t
                .saturating_duration_since(Instant::now())
                .as_micros()
                .min(i64::MAX as u128) as i64,
        })
    })
}

/// Start a connection to `remote`, verifying its certificate for `server_name`;
/// the id goes to `*conn`. `QR_EVENT_CONNECTED` follows.
///
/// # Safety
/// `e` is a live engine; `remote` readable; `server_name` NUL-terminated; `conn` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_connect(
    e: *mut qr_engine,
    remote: *const qr_addr,
    server_name: *const std::ffi::c_char,
    conn: *mut u64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let (e, remote, name) = unsafe { (obj(e)?, obj_ref(remote)?, text(server_name)?) };
        if conn.is_null() {
            return Err(crate::error::QR_ENULL);
        }
        let h = e
            .engine
            .connect(Instant::now(), (*remote).into(), name)
            .map_err(|err| code_of(&err))?;
        // SAFETY: writable by contract, checked non-null above.
        unsafe { put(conn, h.to_bits()) }?;
        Ok(QR_OK)
    })
}

/// Accept attempt `incoming` (from `QR_EVENT_INCOMING`); the connection id goes to `*conn`.
///
/// # Safety
/// `e` is a live engine; `conn` writable.
#[no_mangle]
pub unsafe extern "C" fn qr_accept(e: *mut qr_engine, incoming: u64, conn: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        if conn.is_null() {
            return Err(crate::error::QR_ENULL);
        }
        let h = e
            .engine
            .accept(Instant::now(), IncomingId::from_bits(incoming))
            .map_err(|err| code_of(&err))?;
        // SAFETY: writable by contract, checked non-null above.
        unsafe { put(conn, h.to_bits()) }?;
        Ok(QR_OK)
    })
}

/// Refuse attempt `incoming` (the client sees CONNECTION_REFUSED).
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_refuse(e: *mut qr_engine, incoming: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .refuse(IncomingId::from_bits(incoming))
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Answer attempt `incoming` with a Retry (address validation).
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_retry(e: *mut qr_engine, incoming: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .retry(IncomingId::from_bits(incoming))
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Drop attempt `incoming` without answering.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_ignore(e: *mut qr_engine, incoming: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        e.engine
            .ignore(IncomingId::from_bits(incoming))
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}

/// Close `conn` with application `code` and `reason` (`reason_len` bytes, may be NULL/0).
///
/// # Safety
/// `e` is a live engine; `reason` points to `reason_len` readable bytes (or is NULL with 0).
#[no_mangle]
pub unsafe extern "C" fn qr_close(
    e: *mut qr_engine,
    conn: u64,
    code: u64,
    reason: *const u8,
    reason_len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let (e, reason) = unsafe { (obj(e)?, bytes(reason, reason_len)?) };
        e.engine
            .close(Instant::now(), ConnHandle::from_bits(conn), code, reason)
            .map_err(|err| code_of(&err))?;
        Ok(QR_OK)
    })
}
