//! `qr_engine`: one poll-mode QUIC endpoint over one UD queue pair.
#![allow(non_camel_case_types)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use quic_rdma::engine::{ConnHandle, Engine, Event, IncomingId, Waiter};
use quic_rdma::fabric::UdQueuePair;

use crate::config::{qr_addr, qr_engine_config};
use crate::error::{code_of, guard, guard64, QR_EINVAL, QR_ENOFD, QR_OK};
use crate::events::{qr_event, QR_EVENT_INCOMING, QR_EVENT_V1_SIZE};
use crate::fabric::qr_fabric;
use crate::ptr::{bytes, obj, obj_ref, put, read_versioned, text};

/// An engine. Not thread-safe: use one from one thread at a time.
pub struct qr_engine {
    pub(crate) engine: Engine<Box<dyn UdQueuePair>>,
    /// Events polled but not yet handed out (the caller's array was full).
    pending: Vec<Event>,
    /// When each pending event was polled (caller's nanoseconds).
    pending_ns: Vec<u64>,
    cursor: usize,
    pub(crate) clock: Clock,
    /// Each connection's `qr_conn_set_user` pointer (as an address).
    pub(crate) users: HashMap<u64, usize>,
    /// `qr_engine_wait`'s spin-then-sleep driver (made on first use).
    pub(crate) waiter: Option<Waiter>,
}

/// Create an engine on `fabric` from `cfg` into `*out`: a queue pair on the
/// port with GID `cfg->gid`, a UD socket over it, a QUIC endpoint over that.
///
/// Returns: `QR_OK` with the engine in `*out`; `QR_ENULL` (a NULL `fabric`,
/// `cfg`, `cfg->gid` or `out`, or `cfg->options->pin_sha256` NULL with a
/// count), `QR_EINVAL` (a malformed or out-of-range config or options
/// field, a `struct_size` below version 1 or with unknown non-zero bytes beyond
/// this library's struct, pins without `ca_der`), `QR_ETLS` (certificate, key or roots unusable),
/// `QR_EFABRIC` (no port with that GID or address, queue pair setup
/// failed), `QR_ENODEVICE` (verbs: no such device), `QR_EPANIC`; `*out` is
/// untouched on failure and `qr_last_error` says why.
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
        let (f, c) = unsafe { (obj_ref(fabric)?, read_versioned(cfg, "qr_engine_config")?) };
        // SAFETY: NUL-terminated by contract (null-checked).
        let gid_text = unsafe { text(c.gid) }?;
        let qp = f.open_qp(gid_text)?;
        // QUIC's datagram size: the active MTU, or what the socket offers
        // above it when it segments (docs/architecture.md §6).
        let mtu = quic_rdma::socket::segment::datagram_mtu(qp.attr().active_mtu.bytes());
        // SAFETY: the config's pointers are valid by the caller's contract.
        let ecfg = unsafe { c.build(mtu) }?;
        let engine = Engine::new(qp, ecfg).map_err(|e| code_of(&e))?;
        let e = Box::into_raw(Box::new(qr_engine {
            engine,
            pending: Vec::with_capacity(256),
            pending_ns: Vec::with_capacity(256),
            cursor: 0,
            clock: Clock::new(),
            users: HashMap::with_capacity(64),
            waiter: None,
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
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EPANIC`.
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

/// The largest QUIC datagram of the engine: its fabric port's active MTU,
/// or more on an MTU below 2048, where larger datagrams go as parts.
///
/// Returns: the MTU in bytes (> 0), `QR_ENULL`, `QR_EPANIC`.
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

/// The engine's view of time: `Instant`s, either the library's monotonic
/// clock or mapped from the caller's nanoseconds (`*_at` calls), never going
/// backwards.
pub(crate) struct Clock {
    /// The caller's first `now_ns` and the `Instant` it was mapped to.
    anchor: Option<(u64, Instant)>,
    last: Instant,
}

impl Clock {
    fn new() -> Self {
        Clock {
            anchor: None,
            last: Instant::now(),
        }
    }

    /// `now_ns == 0`: the library's clock; otherwise the caller's (any
    /// monotonic nanosecond count: CLOCK_MONOTONIC, a calibrated TSC).
    /// Returns the instant and the time in nanoseconds on the caller's
    /// timeline (CLOCK_MONOTONIC for the library's clock).
    pub(crate) fn now(&mut self, now_ns: u64) -> (Instant, u64) {
        let ns = if now_ns == 0 { monotonic_ns() } else { now_ns };
        (self.at(now_ns), ns)
    }

    /// The `Instant` of [`Clock::now`].
    fn at(&mut self, now_ns: u64) -> Instant {
        let t = if now_ns == 0 {
            Instant::now()
        } else {
            let (ns0, t0) = *self.anchor.get_or_insert((now_ns, self.last));
            t0 + Duration::from_nanos(now_ns.saturating_sub(ns0))
        };
        self.last = self.last.max(t);
        self.last
    }
}

/// CLOCK_MONOTONIC in nanoseconds (what `Instant` reads on Linux).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// `t` on the caller's timeline, where `now` is `now_ns`.
fn ns_of(t: Instant, now_ns: u64, now: Instant) -> u64 {
    now_ns.saturating_add(t.saturating_duration_since(now).as_nanos() as u64)
}

impl qr_engine {
    /// Whether polled events wait to be handed out (then nobody should sleep).
    pub(crate) fn has_pending(&self) -> bool {
        self.cursor < self.pending.len()
    }

    /// Receive, run timers, transmit; the events go to the pending queue
    /// (after what the caller already took is dropped from its front).
    fn drive(&mut self, now: Instant, now_ns: u64) {
        if self.cursor > 0 {
            // Shifts in place: no allocation once the queue has grown.
            self.pending.drain(..self.cursor);
            self.pending_ns.drain(..self.cursor);
            self.cursor = 0;
        }
        self.engine.poll(now, &mut self.pending);
        self.pending_ns.resize(self.pending.len(), now_ns);
    }

    /// The C form of pending event `i`, with the connection's user pointer,
    /// its poll time, and for `QR_EVENT_CONNECTED` whether 0-RTT was accepted.
    fn c_event(&mut self, i: usize) -> qr_event {
        let ev = self.pending[i];
        let mut q = qr_event::from(ev);
        q.time_ns = self.pending_ns[i];
        if q.kind != QR_EVENT_INCOMING {
            q.user = self
                .users
                .get(&q.conn)
                .map_or(std::ptr::null_mut(), |&u| u as *mut c_void);
        }
        match ev {
            Event::Connected { conn } => {
                let z = self.engine.zero_rtt(conn).unwrap_or_default();
                q.code = u64::from(z.accepted);
            }
            Event::ConnectionClosed { conn } => {
                // The last event of the connection: its id is stale from now.
                self.users.remove(&conn.to_bits());
            }
            _ => {}
        }
        q
    }

    /// Hand out up to `cap` pending events, `stride` bytes apart, writing the
    /// first `stride.min(size_of::<qr_event>())` bytes of each and zeroing the
    /// rest of the stride.
    ///
    /// # Safety
    /// `events` points to `cap * stride` writable bytes (or `cap` is 0).
    unsafe fn hand_out(&mut self, events: *mut u8, cap: usize, stride: usize) -> i32 {
        let n = (self.pending.len() - self.cursor)
            .min(cap)
            .min(i32::MAX as usize);
        let copy = stride.min(size_of::<qr_event>());
        for i in 0..n {
            let q = self.c_event(self.cursor + i);
            // SAFETY: element i < n <= cap lies inside the caller's array of
            // `cap * stride` bytes; `q` is a local, distinct from it.
            unsafe {
                let dst = events.add(i * stride);
                std::ptr::copy_nonoverlapping((&q as *const qr_event).cast::<u8>(), dst, copy);
                std::ptr::write_bytes(dst.add(copy), 0, stride - copy);
            }
        }
        // Stream ids and codes come from decrypted frames (see valgrind.rs).
        crate::valgrind::mark_defined(events, n * stride);
        self.cursor += n;
        n as i32
    }
}

/// Drive the engine (receive, timers, transmit) and write up to `cap` events
/// into `events`; returns how many were written (≥ 0). Every call does the
/// I/O, whatever `cap` is; events that did not fit are kept, in order, and
/// returned first by later calls, so a small array (or `NULL, 0`) loses
/// nothing. The header makes `qr_engine_poll` a macro for
/// `qr_engine_poll_at(e, 0, events, cap, sizeof(qr_event))`, so code compiled
/// against it gets events of its own header's size; this exported function
/// writes `QR_EVENT_V1_SIZE` bytes per element, for programs built against
/// the first header (whose `qr_event` had that size).
///
/// Returns: the number of events written (>= 0), `QR_ENULL` (`e` NULL, or
/// `events` NULL with `cap` > 0), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `events` points to `cap` writable `qr_event`s.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_poll(
    e: *mut qr_engine,
    events: *mut qr_event,
    cap: usize,
) -> i32 {
    // SAFETY: the caller's contract above, with the first version's stride.
    unsafe { qr_engine_poll_at(e, 0, events, cap, QR_EVENT_V1_SIZE) }
}

/// `qr_engine_poll` with the caller's time and event size: `now_ns` is any
/// monotonic nanosecond count of the caller's (CLOCK_MONOTONIC, a calibrated
/// TSC; 0 means the library's clock) — the engine's timers follow it and
/// nothing reads a clock of its own; `event_size` is `sizeof(qr_event)` as
/// the caller's header has it (at least `QR_EVENT_V1_SIZE`; fields the
/// library does not know are zeroed). Use one time source per engine.
///
/// Returns: the number of events written (>= 0), `QR_ENULL` (`e` NULL, or
/// `events` NULL with `cap` > 0), `QR_EINVAL` (`event_size` below
/// `QR_EVENT_V1_SIZE`, or `cap * event_size` overflows), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `events` points to `cap * event_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_poll_at(
    e: *mut qr_engine,
    now_ns: u64,
    events: *mut qr_event,
    cap: usize,
    event_size: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        if events.is_null() && cap > 0 {
            return Err(crate::error::QR_ENULL);
        }
        if event_size < QR_EVENT_V1_SIZE || cap.checked_mul(event_size).is_none() {
            return Err(QR_EINVAL);
        }
        let (now, ns) = e.clock.now(now_ns);
        e.drive(now, ns);
        // SAFETY: `events` holds `cap * event_size` writable bytes by contract.
        Ok(unsafe { e.hand_out(events.cast::<u8>(), cap, event_size) })
    })
}

/// Do the I/O only (receive, timers, transmit) at `now_ns` (0: the library's
/// clock); events are kept for the next `qr_engine_poll`. Returns how many
/// events are waiting. For callers that send from one place and read events
/// from another, or flush a batch of writes at once.
///
/// Returns: the number of events waiting (>= 0), `QR_ENULL`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_flush(e: *mut qr_engine, now_ns: u64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let (now, ns) = e.clock.now(now_ns);
        e.drive(now, ns);
        Ok((e.pending.len() - e.cursor).min(i32::MAX as usize) as i32)
    })
}

/// Microseconds until the engine needs a `qr_engine_poll` even if nothing
/// arrives (0: now), or -1 with no timer armed. For callers that sleep.
///
/// Returns: microseconds (>= 0), -1 with no timer armed, `QR_ENULL` (also
/// negative: check for it before using -1), `QR_EPANIC`.
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

/// The next timer deadline on the caller's clock (the `now_ns` timeline of
/// `qr_engine_poll_at`), or -1 with no timer armed; `now_ns` is the caller's
/// time now (0: the library's clock, answer in its nanoseconds from now).
///
/// Returns: nanoseconds on the caller's timeline (>= 0), -1 with no timer
/// armed, `QR_ENULL`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_deadline_ns(e: *mut qr_engine, now_ns: u64) -> i64 {
    guard64(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let now = e.clock.at(now_ns);
        Ok(match e.engine.next_deadline() {
            None => -1,
            Some(t) => ns_of(t, now_ns, now).min(i64::MAX as u64) as i64,
        })
    })
}

/// The descriptor to sleep on (poll/epoll for readability) between polls:
/// the provider's readiness fd (a `soft` socket, a `verbs` completion
/// channel). Call `qr_engine_arm` before sleeping. Owned by the engine: do
/// not close it.
///
/// Returns the descriptor (>= 0), `QR_ENOFD` when the provider has none
/// (`sim`: keep polling, or use `qr_engine_wait`, which sleeps on every
/// provider), or `QR_ENULL`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_readiness_fd(e: *const qr_engine) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj_ref(e) }?;
        // A distinct code, not -1: -1 is QR_ENULL, and a caller must tell
        // "no descriptor" from "bad handle".
        e.engine
            .readiness_fd()
            .map(|fd| std::os::fd::AsRawFd::as_raw_fd(&fd))
            .ok_or(QR_ENOFD)
    })
}

/// Prepare to sleep on `qr_engine_readiness_fd`: returns 1 if work may already
/// be waiting (poll again instead of sleeping), 0 if sleeping until the fd is
/// readable or the next deadline is safe.
///
/// Returns: 0 (safe to sleep), 1 (poll again), `QR_ENULL`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_arm(e: *mut qr_engine) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let pending = e.cursor < e.pending.len();
        Ok(i32::from(e.engine.arm(std::task::Waker::noop()) || pending))
    })
}

/// Start a connection to `remote`, verifying its certificate for `server_name`;
/// the id goes to `*conn`. `QR_EVENT_CONNECTED` follows.
///
/// Returns: `QR_OK` with the id in `*conn`; `QR_ENULL`, `QR_EINVAL`
/// (`server_name` not UTF-8), `QR_ETLS` (no client config: set `ca_der`),
/// `QR_ECONNECT` (bad address or server name, CIDs exhausted; `qr_last_error`
/// says which), `QR_EPANIC`.
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
/// Returns: `QR_OK` with the id in `*conn`; `QR_ENULL`, `QR_ENOINCOMING`
/// (unknown or already decided), `QR_ECLOSED` (the attempt failed on
/// acceptance), `QR_EPANIC`.
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
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ENOINCOMING`, `QR_EPANIC`.
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
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ENOINCOMING`, `QR_EINVAL` (the attempt
/// already carries a validated token: it is dropped), `QR_EPANIC`.
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
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ENOINCOMING`, `QR_EPANIC`.
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
/// Returns: `QR_OK`, `QR_ENULL` (`e` NULL, or `reason` NULL with a length),
/// `QR_ENOCONN`, `QR_EINVAL` (`code` at or above 2^62), `QR_EPANIC`.
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
