//! Flow control and chunk sizing, sans-IO (time is passed in).
//!
//! Credit: the master may have at most `window` bytes of a stream sent but not
//! acknowledged by the replica ([`Credit`]); the replica acknowledges what it
//! has delivered to its application, so a slow consumer stops the master from
//! sending, and QUIC's stream and connection windows stop it buffering in the
//! transport. Nothing in between grows without bound.
//!
//! Chunk size: a chunk should take about a quarter of a round trip to drain at
//! the measured throughput — large enough that per-frame costs vanish, small
//! enough that acks flow back several times per RTT. Clamped to
//! 128 KiB..=1 MiB ([`ChunkSizer`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Smallest adaptive chunk.
pub const MIN_CHUNK: usize = 128 << 10;

/// Largest adaptive chunk (equal to the frame codec's limit).
pub const MAX_CHUNK: usize = super::frame::MAX_CHUNK;

/// Sent-but-unacknowledged bytes of one stream, bounded by a window, with the
/// time each chunk left, so an ack yields the credit turnaround time.
#[derive(Debug)]
pub struct Credit {
    window: u64,
    acked: u64,
    sent: u64,
    /// (end position, when sent) of chunks in flight, oldest first.
    in_flight: VecDeque<(u64, Instant)>,
}

impl Credit {
    /// A stream starting at `position`, allowed `window` bytes in flight.
    pub fn new(position: u64, window: u64) -> Credit {
        Credit {
            window: window.max(MAX_CHUNK as u64),
            acked: position,
            sent: position,
            in_flight: VecDeque::new(),
        }
    }

    /// How many bytes may be sent now.
    pub fn available(&self) -> u64 {
        self.window.saturating_sub(self.sent - self.acked)
    }

    /// Position after the last byte sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Highest position acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Record `n` bytes sent at `now`.
    pub fn on_send(&mut self, n: u64, now: Instant) {
        self.sent += n;
        self.in_flight.push_back((self.sent, now));
        // Bounded: at most window / smallest chunk entries matter; merge the
        // oldest when a peer acks rarely (their times only get older).
        if self.in_flight.len() > 1024 {
            self.in_flight.pop_front();
        }
    }

    /// Record an ack up to `position` at `now`; the turnaround of the newest
    /// chunk it covers, if it covers one. Acks beyond what was sent or behind
    /// an earlier ack are ignored (returns `None`).
    pub fn on_ack(&mut self, position: u64, now: Instant) -> Option<Duration> {
        if position <= self.acked || position > self.sent {
            return None;
        }
        self.acked = position;
        let mut rtt = None;
        while let Some(&(end, at)) = self.in_flight.front() {
            if end > position {
                break;
            }
            rtt = Some(now.saturating_duration_since(at));
            self.in_flight.pop_front();
        }
        rtt
    }
}

/// Chooses the next chunk size from acked throughput and turnaround.
#[derive(Debug)]
pub struct ChunkSizer {
    /// Smoothed turnaround time.
    srtt: Option<Duration>,
    /// Smoothed throughput in bytes per second.
    rate: Option<f64>,
    last: Option<(Instant, u64)>,
}

impl Default for ChunkSizer {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkSizer {
    /// No measurements yet: chunks start at the minimum.
    pub fn new() -> ChunkSizer {
        ChunkSizer {
            srtt: None,
            rate: None,
            last: None,
        }
    }

    /// Feed an ack: total bytes acked so far at `now`, and the turnaround it
    /// measured, if any.
    pub fn on_ack(&mut self, acked_total: u64, rtt: Option<Duration>, now: Instant) {
        if let Some(r) = rtt {
            self.srtt = Some(match self.srtt {
                Some(s) => (s * 7 + r) / 8,
                None => r,
            });
        }
        if let Some((t0, b0)) = self.last {
            let dt = now.saturating_duration_since(t0).as_secs_f64();
            // Too short an interval measures scheduling noise, not the path.
            if dt >= 0.002 && acked_total > b0 {
                let sample = (acked_total - b0) as f64 / dt;
                self.rate = Some(match self.rate {
                    Some(r) => 0.75 * r + 0.25 * sample,
                    None => sample,
                });
                self.last = Some((now, acked_total));
            }
        } else {
            self.last = Some((now, acked_total));
        }
    }

    /// The smoothed turnaround, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The next chunk size, 128 KiB..=1 MiB.
    pub fn chunk(&self) -> usize {
        match (self.rate, self.srtt) {
            (Some(rate), Some(rtt)) => {
                let bdp_quarter = rate * rtt.as_secs_f64() / 4.0;
                (bdp_quarter as usize).clamp(MIN_CHUNK, MAX_CHUNK)
            }
            _ => MIN_CHUNK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_bounds_what_is_in_flight() {
        let t = Instant::now();
        let mut c = Credit::new(1000, 4 << 20);
        assert_eq!(c.available(), 4 << 20);
        c.on_send(3 << 20, t);
        c.on_send(1 << 20, t);
        assert_eq!(c.available(), 0);
        let rtt = c.on_ack(1000 + (3 << 20), t + Duration::from_millis(5));
        assert_eq!(rtt, Some(Duration::from_millis(5)));
        assert_eq!(c.available(), 3 << 20);
        // Stale and impossible acks change nothing.
        assert_eq!(c.on_ack(1000, t), None);
        assert_eq!(c.on_ack(1000 + (5 << 20), t), None);
        assert_eq!(c.acked(), 1000 + (3 << 20));
    }

    #[test]
    fn chunk_grows_with_bandwidth_delay_and_stays_clamped() {
        let t = Instant::now();
        let mut s = ChunkSizer::new();
        assert_eq!(s.chunk(), MIN_CHUNK);
        // 1 GB/s with 2 ms turnaround: a quarter BDP is 500 kB.
        s.on_ack(0, Some(Duration::from_millis(2)), t);
        for i in 1..=20u64 {
            s.on_ack(
                i * 10_000_000,
                Some(Duration::from_millis(2)),
                t + Duration::from_millis(10 * i),
            );
        }
        let c = s.chunk();
        assert!((400_000..=600_000).contains(&c), "{c}");
        // 10 GB/s, 10 ms: clamped to 1 MiB.
        for i in 21..=60u64 {
            s.on_ack(
                200_000_000 + (i - 20) * 100_000_000,
                Some(Duration::from_millis(10)),
                t + Duration::from_millis(10 * i),
            );
        }
        assert_eq!(s.chunk(), MAX_CHUNK);
        // A slow path (1 MB/s, 1 ms): the floor.
        let mut slow = ChunkSizer::new();
        for i in 0..20u64 {
            slow.on_ack(
                i * 10_000,
                Some(Duration::from_millis(1)),
                t + Duration::from_millis(10 * i),
            );
        }
        assert_eq!(slow.chunk(), MIN_CHUNK);
    }
}
