//! The spin-then-sleep driver: what a caller runs between polls so an idle
//! engine costs no CPU and a request still meets a spinning poll.
//!
//! [`Waiter::wait`] asks the [`IdlePolicy`] (sans-IO, `idle.rs`) whether to
//! spin on; once the budget is spent it arms the engine, polls the answer
//! (`arm` says whether something arrived since the last poll: then it does not
//! sleep, or that event would wait for the next timer), and sleeps on the
//! engine's readiness until the next deadline. Readiness is two things, and
//! the sleep waits on both with one `poll(2)`:
//! - the provider's descriptor ([`Engine::readiness_fd`]: `soft`'s UDP socket,
//!   `verbs`' completion channel), readable when a packet or completion comes;
//! - the waker given to `arm`, which providers wake themselves (`sim` on an
//!   arrival; `soft` when another queue pair of the port read our packet off
//!   the shared socket): it writes to an eventfd the sleep also watches.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use super::idle::{Idle, IdleConfig, IdlePolicy};
use super::{Engine, EngineError, Event};
use crate::fabric::UdQueuePair;

/// What one [`Waiter::wait`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Returned at once: still within the spin budget (or work was waiting).
    Spun,
    /// Slept, and was woken by readiness: poll now.
    Woken,
    /// Slept until the engine's next deadline or the caller's limit.
    TimedOut,
}

/// Counters of a [`Waiter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Waits that returned at once.
    pub spins: u64,
    /// Sleeps entered.
    pub sleeps: u64,
    /// Sleeps ended by readiness (descriptor or waker).
    pub woken: u64,
    /// Sleeps that ran to the deadline or limit.
    pub timeouts: u64,
    /// Times `arm` found work already waiting (a sleep avoided, an event not lost).
    pub armed_busy: u64,
    /// Total time asleep.
    pub slept: Duration,
}

/// Wakes a sleeping [`Waiter`]: one write to its eventfd.
struct Signal(OwnedFd);

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        // EAGAIN means the counter is already non-zero: a wake-up is pending.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }
}

/// The spin-then-sleep driver of one engine (see the [module docs](self)).
pub struct Waiter {
    policy: IdlePolicy,
    signal: Arc<Signal>,
    waker: Waker,
    /// The engine's activity counter at the last wait.
    seen: u64,
    stats: WaitStats,
}

impl Waiter {
    /// A waiter with `cfg`. Fails only if the system refuses an eventfd.
    pub fn new(cfg: IdleConfig) -> Result<Self, EngineError> {
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| EngineError::Wait(std::io::Error::from(e)))?;
        let signal = Arc::new(Signal(fd));
        Ok(Waiter {
            policy: IdlePolicy::new(cfg),
            waker: Waker::from(signal.clone()),
            signal,
            seen: 0,
            stats: WaitStats::default(),
        })
    }

    /// The decision logic (its current budget).
    pub fn policy(&self) -> &IdlePolicy {
        &self.policy
    }

    /// The counters.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }

    /// Call after each [`Engine::poll`] (at `now`, the poll's time or later).
    /// Returns at once while the engine is busy or within its spin budget;
    /// otherwise arms the engine and, if nothing is waiting, sleeps until
    /// readiness, the engine's next deadline, or `limit`, whichever is first.
    /// Activity is what moved the engine's [`Engine::activity`] counter since
    /// the last call, and `busy` (the caller's own: events it handled, writes
    /// it made).
    pub fn wait<Q: UdQueuePair>(
        &mut self,
        engine: &mut Engine<Q>,
        now: Instant,
        busy: bool,
        limit: Option<Instant>,
    ) -> Wait {
        let act = engine.activity();
        let moved = act != self.seen;
        self.seen = act;
        if self.policy.after_poll(now, busy || moved) == Idle::Spin {
            self.stats.spins += 1;
            return Wait::Spun;
        }
        if engine.arm(&self.waker) {
            self.stats.armed_busy += 1;
            return Wait::Spun;
        }
        let until = match (engine.next_deadline(), limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        };
        let timeout = until.map(|u| u.saturating_duration_since(now));
        if timeout == Some(Duration::ZERO) {
            self.stats.spins += 1;
            return Wait::Spun;
        }
        self.policy.sleeping();
        self.stats.sleeps += 1;
        let t0 = Instant::now();
        let woken = self.sleep(engine.readiness_fd(), timeout);
        self.stats.slept += t0.elapsed();
        if woken {
            self.stats.woken += 1;
            Wait::Woken
        } else {
            self.stats.timeouts += 1;
            Wait::TimedOut
        }
    }

    /// Poll `engine` now and [`wait`](Self::wait) if the poll brought no
    /// event: the whole loop body of a caller with nothing else to do.
    /// Returns the poll's event count.
    pub fn poll<Q: UdQueuePair>(
        &mut self,
        engine: &mut Engine<Q>,
        events: &mut Vec<Event>,
        limit: Option<Instant>,
    ) -> usize {
        let now = Instant::now();
        let n = engine.poll(now, events);
        if n == 0 {
            self.wait(engine, now, false, limit);
        } else {
            // Count the activity now, so the next wait starts a fresh gap.
            self.seen = engine.activity();
            self.policy.after_poll(now, true);
        }
        n
    }

    /// Sleep on the eventfd and `fd` up to `timeout`; `true` if either woke us.
    fn sleep(&self, fd: Option<std::os::fd::BorrowedFd<'_>>, timeout: Option<Duration>) -> bool {
        // Timeouts beyond what a timespec holds are the same as none.
        let ts = timeout.and_then(|t| rustix::event::Timespec::try_from(t).ok());
        let mut fds = [
            PollFd::new(&self.signal.0, PollFlags::IN),
            PollFd::from_borrowed_fd(fd.unwrap_or(self.signal.0.as_fd()), PollFlags::IN),
        ];
        let n = if fd.is_some() { 2 } else { 1 };
        let ready = match rustix::event::poll(&mut fds[..n], ts.as_ref()) {
            Ok(k) => k > 0,
            // Interrupted by a signal: report a wake-up, the caller polls.
            Err(_) => true,
        };
        if fds[0].revents().contains(PollFlags::IN) {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.signal.0, &mut b);
        }
        ready
    }
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("budget", &self.policy.budget())
            .field("stats", &self.stats)
            .finish()
    }
}
