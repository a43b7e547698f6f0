//! RTT figures quinn-proto 0.11 keeps to itself (its `RttEstimator` exposes
//! only the smoothed RTT and a minimum seeded with the initial estimate),
//! and the handshake's duration.
//!
//! Each RTT sample is recovered from successive smoothed RTTs: RFC 9002
//! §5.3 updates `smoothed = 7/8 smoothed + 1/8 adjusted_rtt`, so
//! `adjusted_rtt = 8 smoothed_new - 7 smoothed_old`. The engine reads the
//! smoothed RTT after every received datagram, and a datagram carries at
//! most one 1-RTT packet and so at most one ACK frame, i.e. one sample
//! (during the handshake coalesced packets may carry two; then the
//! recovered value is their blend). The variation follows RFC 9002 §5.3
//! (`rttvar = 3/4 rttvar + 1/4 |smoothed_old - adjusted_rtt|`, the first
//! sample giving `sample / 2`). A sample exactly equal to the smoothed RTT
//! leaves it unchanged and is not seen (it would not move rttvar up).

use std::time::{Duration, Instant};

use super::{ConnHandle, Engine, EngineError};
use crate::fabric::UdQueuePair;

/// A connection's RTT figures and handshake time
/// ([`Engine::rtt_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttStats {
    /// The smallest RTT sample: quinn-proto's `min_rtt` (RFC 9002 §5.2, ACK
    /// delay not subtracted) when it is below the initial estimate it is
    /// seeded with; otherwise the smallest recovered (ACK-delay-adjusted)
    /// sample. Zero before the first sample.
    pub min_rtt: Duration,
    /// RFC 9002 §5.3's rttvar over the recovered samples. Zero before the
    /// first sample.
    pub rtt_var: Duration,
    /// RTT samples seen.
    pub samples: u64,
    /// From the connection's start (`connect` or accept) to the handshake's
    /// completion, on the caller's clock; `None` until it completes.
    pub handshake: Option<Duration>,
}

/// The per-connection tracker behind [`RttStats`]. Kept in integer
/// nanoseconds: `observe` runs for every received datagram, and `Duration`
/// arithmetic (checked, split seconds/nanoseconds) cost ~125 instructions
/// per call there (callgrind, benches/results/latency-callgrind/).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RttTrack {
    /// quinn-proto's estimate before any sample (its `rtt()` then), ns.
    initial: u64,
    /// The smoothed RTT last read, ns.
    smoothed: u64,
    var: u64,
    min_sample: u64,
    samples: u64,
    started: Instant,
    handshake: Option<Duration>,
}

/// `d` in nanoseconds (saturating: RTTs are far below 584 years).
fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RttTrack {
    /// A connection started at `now` whose RTT estimate is `initial`.
    pub(crate) fn new(now: Instant, initial: Duration) -> Self {
        RttTrack {
            initial: ns(initial),
            smoothed: ns(initial),
            var: 0,
            min_sample: u64::MAX,
            samples: 0,
            started: now,
            handshake: None,
        }
    }

    /// The smoothed RTT after a received datagram.
    pub(crate) fn observe(&mut self, smoothed: Duration) {
        let smoothed = ns(smoothed);
        if smoothed == self.smoothed {
            return;
        }
        let sample = if self.samples == 0 {
            // The first sample replaces the initial estimate (RFC 9002 §5.3).
            self.var = smoothed / 2;
            smoothed
        } else {
            let s = smoothed
                .saturating_mul(8)
                .saturating_sub(self.smoothed.saturating_mul(7));
            let dev = s.abs_diff(self.smoothed);
            self.var = (self.var.saturating_mul(3).saturating_add(dev)) / 4;
            s
        };
        self.min_sample = self.min_sample.min(sample);
        self.samples += 1;
        self.smoothed = smoothed;
    }

    /// The handshake completed at `now`.
    pub(crate) fn connected(&mut self, now: Instant) {
        self.handshake
            .get_or_insert(now.saturating_duration_since(self.started));
    }

    /// The figures, with quinn-proto's own minimum `quinn_min`.
    pub(crate) fn stats(&self, quinn_min: Duration) -> RttStats {
        let min_rtt = if self.samples == 0 {
            Duration::ZERO
        } else if ns(quinn_min) < self.initial {
            quinn_min
        } else {
            Duration::from_nanos(self.min_sample)
        };
        RttStats {
            min_rtt,
            rtt_var: Duration::from_nanos(self.var),
            samples: self.samples,
            handshake: self.handshake,
        }
    }
}

impl<Q: UdQueuePair> Engine<Q> {
    /// `conn`'s minimum RTT, RTT variation and handshake time (see
    /// [`RttStats`] for how each is obtained).
    pub fn rtt_stats(&self, conn: ConnHandle) -> Result<RttStats, EngineError> {
        let c = self.conns.get_ref(conn)?;
        Ok(c.rtt.stats(c.inner.stats().path.min_rtt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// quinn-proto's update (RFC 9002 §5.3) for a sample.
    fn smooth(old: Duration, sample: Duration) -> Duration {
        (old * 7 + sample) / 8
    }

    #[test]
    fn samples_and_rttvar_are_recovered_from_the_smoothed_rtt() {
        let t0 = Instant::now();
        let mut t = RttTrack::new(t0, Duration::from_millis(2));
        assert_eq!(t.stats(Duration::from_millis(2)), RttStats::default());
        let us = Duration::from_micros;
        // RFC 9002 §5.3 computed alongside, from the true samples.
        let (mut srtt, mut var) = (us(100), us(50));
        t.observe(srtt);
        for s in [us(140), us(80), us(120), us(90), us(300)] {
            var = (var * 3 + srtt.abs_diff(s)) / 4;
            srtt = smooth(srtt, s);
            t.observe(srtt);
        }
        let st = t.stats(us(80));
        assert_eq!(st.samples, 6);
        assert_eq!(
            st.min_rtt,
            us(80),
            "quinn's minimum, below the initial 2 ms"
        );
        // Integer nanoseconds in quinn's division: within a few ns per step.
        assert!(
            st.rtt_var.abs_diff(var) < Duration::from_nanos(50),
            "{st:?} vs {var:?}"
        );
        // A path slower than the initial estimate: quinn's minimum stays at
        // 2 ms, the recovered samples give the real one.
        let mut slow = RttTrack::new(t0, Duration::from_millis(2));
        slow.observe(Duration::from_millis(10));
        slow.observe(smooth(Duration::from_millis(10), Duration::from_millis(6)));
        let st = slow.stats(Duration::from_millis(2));
        assert!(st.min_rtt.abs_diff(Duration::from_millis(6)) < Duration::from_nanos(10));
        slow.connected(t0 + Duration::from_millis(30));
        slow.connected(t0 + Duration::from_millis(99));
        assert_eq!(
            slow.stats(Duration::ZERO).handshake,
            Some(Duration::from_millis(30))
        );
    }
}
