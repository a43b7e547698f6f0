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
    /// How long a reordered packet is held back.
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
            reorder_delay: Duration::from_micros(300),
            ..Faults::default()
        }
    }

    pub(crate) fn needs_wire_thread(&self) -> bool {
        !self.delay.is_zero() || (self.reorder > 0.0 && !self.reorder_delay.is_zero())
    }
}
