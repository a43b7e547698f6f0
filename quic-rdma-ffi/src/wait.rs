//! `qr_engine_wait`: the engine's spin-then-sleep driver for C callers, so
//! an idle engine costs no CPU and a request still meets a spinning poll
//! (`quic_rdma::engine::Waiter`; the decision logic is `IdlePolicy`).

use quic_rdma::engine::{IdleConfig, Wait, Waiter};
use std::time::Duration;

use crate::engine::qr_engine;
use crate::error::{code_of, fail, guard, QR_EINVAL, QR_OK};
use crate::ptr::obj;

/// `qr_engine_wait` returned at once (within the spin budget, or work is
/// waiting): poll again.
pub const QR_WAIT_SPUN: i32 = 0;
/// `qr_engine_wait` slept and was woken by readiness: poll now.
pub const QR_WAIT_WOKEN: i32 = 1;
/// `qr_engine_wait` slept until the engine's next timer or the caller's limit.
pub const QR_WAIT_TIMEOUT: i32 = 2;
/// `qr_engine_set_idle` budget meaning "never sleep" (pure busy-poll).
pub const QR_SPIN_FOREVER: u64 = u64::MAX;

/// How `qr_engine_wait` idles: spin for a budget after the last activity,
/// then sleep. `spin_min_ns == spin_max_ns`: a fixed budget; `spin_min_ns <
/// spin_max_ns`: the budget adapts to the gaps between requests within those
/// bounds (it starts in the middle); both 0: the default, adaptive between
/// 25 and 200 µs; both `QR_SPIN_FOREVER`: never sleep. `QR_EINVAL` if
/// `spin_min_ns > spin_max_ns`. Resets what the adaptation learnt.
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EINVAL` (`spin_min_ns` above
/// `spin_max_ns`), `QR_EFABRIC` (no eventfd), `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_set_idle(
    e: *mut qr_engine,
    spin_min_ns: u64,
    spin_max_ns: u64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let cfg = match (spin_min_ns, spin_max_ns) {
            (0, 0) => IdleConfig::default(),
            (QR_SPIN_FOREVER, QR_SPIN_FOREVER) => IdleConfig::BUSY_POLL,
            (lo, hi) if lo > hi => {
                return Err(fail(
                    QR_EINVAL,
                    "qr_engine_set_idle: spin_min_ns above spin_max_ns (swap them)",
                ))
            }
            (lo, hi) => IdleConfig::adaptive(Duration::from_nanos(lo), Duration::from_nanos(hi)),
        };
        e.waiter = Some(Waiter::new(cfg).map_err(|err| code_of(&err))?);
        Ok(QR_OK)
    })
}

/// Call after a `qr_engine_poll` that left nothing to do. Returns at once
/// (`QR_WAIT_SPUN`) while the engine is busy or within its spin budget, or
/// when polled events are still waiting to be handed out; otherwise arms the
/// engine — staying awake if something arrived since the last poll, so no
/// event is lost — and sleeps until the fabric has work (`QR_WAIT_WOKEN`) or
/// until the engine's next timer or `max_wait_ns` from `now_ns` passed
/// (`QR_WAIT_TIMEOUT`). `now_ns` is the caller's time as for
/// `qr_engine_poll_at` (0: the library's clock); `max_wait_ns` -1: no limit
/// but the engine's timers (none with no connections: it sleeps until a
/// packet arrives). Works for every provider (`sim` wakes through the engine's
/// waker, `soft` and `verbs` through their descriptor as well). The budget is
/// `qr_engine_set_idle`'s (the default if never set). Negative: `QR_ENULL`,
/// `QR_EINVAL` (`max_wait_ns` below -1), `QR_EFABRIC` (no eventfd for the
/// sleep: `qr_last_error` says why).
///
/// Returns: `QR_WAIT_SPUN`, `QR_WAIT_WOKEN` or `QR_WAIT_TIMEOUT` (>= 0);
/// `QR_ENULL`, `QR_EINVAL` (`max_wait_ns` below -1), `QR_EFABRIC`, `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine.
#[no_mangle]
pub unsafe extern "C" fn qr_engine_wait(e: *mut qr_engine, now_ns: u64, max_wait_ns: i64) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        if max_wait_ns < -1 {
            return Err(QR_EINVAL);
        }
        if e.has_pending() {
            return Ok(QR_WAIT_SPUN);
        }
        let (now, _) = e.clock.now(now_ns);
        let limit = u64::try_from(max_wait_ns)
            .ok()
            .map(|ns| now + Duration::from_nanos(ns));
        if e.waiter.is_none() {
            e.waiter = Some(Waiter::new(IdleConfig::default()).map_err(|err| code_of(&err))?);
        }
        let w = e.waiter.as_mut().expect("set above");
        Ok(match w.wait(&mut e.engine, now, false, limit) {
            Wait::Spun => QR_WAIT_SPUN,
            Wait::Woken => QR_WAIT_WOKEN,
            Wait::TimedOut => QR_WAIT_TIMEOUT,
        })
    })
}
