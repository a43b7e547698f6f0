//! What a simulated fabric and its queue pairs are configured with.

use std::time::Instant;

use super::faults::Faults;
use crate::fabric::{Mtu, DEFAULT_PKEY, DEFAULT_QKEY};

/// Where the fabric's time comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimClock {
    /// The wall clock: delayed and reordered packets are delivered on time by
    /// a wire thread (for callers that run in real time: the quinn adapter,
    /// `qr demo`, benchmarks).
    #[default]
    RealTime,
    /// The caller's clock: no wire thread and no wall-clock reads. Time starts
    /// at `start` and moves only by [`SimFabric::advance`](super::SimFabric::advance),
    /// which delivers the packets due by then; with every random decision drawn
    /// from the seed, a single-threaded run is reproduced exactly by its seed.
    Manual {
        /// The fabric's time before the first `advance`.
        start: Instant,
    },
}

/// Configuration of a simulated fabric (shared by all its ports).
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Active MTU of every port.
    pub mtu: Mtu,
    /// `max_inline_data` granted to every QP.
    pub max_inline: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Fault injection.
    pub faults: Faults,
    /// Seed of the fault RNG (same seed, same decisions for the same packet order).
    pub seed: u64,
    /// Real time (a wire thread) or the caller's time.
    pub clock: SimClock,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            mtu: Mtu::M4096,
            max_inline: 188,
            max_send_wr: 1024,
            max_recv_wr: 4096,
            faults: Faults::default(),
            seed: 0x5eed,
            clock: SimClock::RealTime,
        }
    }
}

/// Options of one simulated queue pair.
#[derive(Clone, Copy, Debug)]
pub struct SimQpOptions {
    /// The Q_Key the QP accepts (must not be privileged).
    pub qkey: u32,
    /// The P_Key of the QP's partition (0x0000 and 0x8000 are refused).
    pub pkey: u16,
    /// Override of the fabric's receive queue depth.
    pub max_recv_wr: Option<u32>,
}

impl Default for SimQpOptions {
    fn default() -> Self {
        SimQpOptions {
            qkey: DEFAULT_QKEY,
            pkey: DEFAULT_PKEY,
            max_recv_wr: None,
        }
    }
}
