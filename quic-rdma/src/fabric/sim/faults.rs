//! Fault injection knobs of the `sim` fabric.

use std::time::Duration;

/// Per-packet fault probabilities and delays. All zero by default (an ideal NIC).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back by `reorder_delay` so later ones overtake it.
    pub reorder: f64,
    /// How long a reordered packet is held back; zero means
    /// [`Faults::DEFAULT_REORDER_DELAY`].
    pub reorder_delay: Duration,
    /// Probability one payload byte is flipped.
    pub corrupt: f64,
    /// Fixed one-way delay of every packet.
    pub delay: Duration,
    /// Probability an arriving packet finds the receive queue starved (dropped as
    /// if no receive were posted), on top of real starvation.
    pub starve: f64,
    /// Probability an ECN-capable packet is marked CE (congestion experienced).
    pub ecn_ce: f64,
}

impl Faults {
    /// How long a reordered packet is held back when `reorder_delay` is zero:
    /// long enough for a burst of later packets to overtake it.
    pub const DEFAULT_REORDER_DELAY: Duration = Duration::from_micros(300);

    /// Loss alone.
    pub fn lossy(loss: f64) -> Self {
        Faults {
            loss,
            ..Faults::default()
        }
    }

    /// Loss with duplication and reordering on (the "hostile fabric" of the tests).
    pub fn hostile(loss: f64) -> Self {
        Faults {
            loss,
            duplicate: 0.01,
            reorder: 0.02,
            reorder_delay: Faults::DEFAULT_REORDER_DELAY,
            ..Faults::default()
        }
    }

    /// How long a reordered packet is held back.
    pub(crate) fn reorder_hold(&self) -> Duration {
        if self.reorder_delay.is_zero() {
            Faults::DEFAULT_REORDER_DELAY
        } else {
            self.reorder_delay
        }
    }

    /// Whether some packets are delivered later than sent (a fixed delay, or
    /// reordering): only the wire thread delivers those, so it must run. The
    /// same two knobs are what puts a packet on the timed wire in `schedule`
    /// (under [`super::SimClock::Manual`] the caller delivers them instead).
    pub(crate) fn holds_packets(&self) -> bool {
        !self.delay.is_zero() || self.reorder > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every knob that can put a packet on the timed wire starts the thread
    /// that delivers it (reordering without a hold time used to lose packets).
    #[test]
    fn reordering_alone_needs_the_wire_thread() {
        let f = Faults {
            reorder: 0.1,
            ..Faults::default()
        };
        assert!(f.holds_packets());
        assert_eq!(f.reorder_hold(), Faults::DEFAULT_REORDER_DELAY);
        assert!(!Faults::lossy(0.5).holds_packets());
        let delayed = Faults {
            delay: Duration::from_millis(1),
            ..Faults::default()
        };
        assert!(delayed.holds_packets());
    }
}
