//! Spin before sleeping: the receive path stays awake for a short window after
//! its last packet, so a steady flow never puts the thread to sleep.
//!
//! Why: a sleeping receiver is woken by the sender (`sim`: the waker, from the
//! sender's thread; `soft`/`verbs`: the reactor, on descriptor readiness), and a
//! wake-up of a thread whose CPU went idle costs a scheduler round trip —
//! tens of microseconds in a virtual machine, where the idle vCPU halted and
//! must be resumed by the host. A bulk flow in which each side drains its queue
//! a little faster than the other fills it sleeps and wakes thousands of times
//! a second, and each wake-up is time in which neither side works. The engine
//! busy-polls for this reason; the adapter cannot own the thread (the runtime
//! does), so it yields instead: `poll_recv` asks to be polled again at once
//! (the task wakes itself) and yields the CPU to any other runnable thread,
//! for at most the window, before it arms the queue pair and sleeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The spin window `RdmaUdpSocket::new` uses: none. A wake-up costs ~45 µs on
/// the 2-vCPU benchmark VM when it is quiet (a futex ping-pong between its
/// vCPUs: 90 µs per round trip, 1.5 µs spinning), so a window longer than that
/// should pay on an idle machine; but on a loaded one the yield hands the CPU
/// to another process for a whole time slice, and in interleaved runs at load
/// 8–10 a 50 µs window made `quinn-adapter/sim` slower in 4 of 5 rounds
/// (benches/results/quinn-adapter.md). Opt in where cores are dedicated.
pub(super) const DEFAULT_IDLE_SPIN: Duration = Duration::ZERO;

/// When the receive path last saw a packet, and how long to spin after it.
#[derive(Debug)]
pub(super) struct IdleSpin {
    window: Duration,
    base: Instant,
    /// Nanoseconds after `base` until which to spin (0: not spinning).
    until: AtomicU64,
}

impl IdleSpin {
    /// Spin for `window` after each packet (`Duration::ZERO`: never spin).
    pub(super) fn new(window: Duration) -> Self {
        IdleSpin {
            window,
            base: Instant::now(),
            until: AtomicU64::new(0),
        }
    }

    /// The window.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// Something arrived at `now`: keep spinning until `now + window`.
    pub(super) fn on_receive(&self, now: Instant) {
        if !self.window.is_zero() {
            let until = self
                .nanos(now)
                .saturating_add(self.window.as_nanos() as u64);
            self.until.store(until, Ordering::Relaxed);
        }
    }

    /// Whether the receive path should poll again instead of sleeping at `now`.
    pub(super) fn keep_spinning(&self, now: Instant) -> bool {
        self.nanos(now) < self.until.load(Ordering::Relaxed)
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_for_the_window_after_the_last_packet_only() {
        let s = IdleSpin::new(Duration::from_micros(50));
        let t = Instant::now() + Duration::from_millis(1);
        // Nothing received yet: sleep at once.
        assert!(!s.keep_spinning(t));
        s.on_receive(t);
        assert!(s.keep_spinning(t + Duration::from_micros(49)));
        assert!(!s.keep_spinning(t + Duration::from_micros(50)));
        // A later packet extends the window from its own time.
        s.on_receive(t + Duration::from_micros(40));
        assert!(s.keep_spinning(t + Duration::from_micros(89)));
        assert!(!s.keep_spinning(t + Duration::from_micros(90)));
    }

    #[test]
    fn a_zero_window_never_spins() {
        let s = IdleSpin::new(Duration::ZERO);
        let t = Instant::now();
        s.on_receive(t);
        assert!(!s.keep_spinning(t));
    }
}
