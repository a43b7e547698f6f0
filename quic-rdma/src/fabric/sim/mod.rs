//! `sim`: an in-process UD fabric between endpoints on threads.
//!
//! It honours every hardware semantic of docs/architecture.md §2 (MTU with silent drop of
//! oversized sends, GRH in receive buffers in IPv4 and IPv6 layouts, silent drop
//! with no posted receive, P_Key/Q_Key/QPN checks, in-order send completions)
//! and injects faults deterministically from a seed: loss, duplication,
//! reordering, corruption, delay, ECN marking and receive-queue starvation.
//! It is the test bed of every layer above and the "ideal NIC" of the benchmarks.

mod faults;
mod qp;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;

pub use faults::Faults;
pub use qp::{SimQp, SimQpHandle};

use super::{check_pkey, check_qkey, FabricError, Gid, Mtu, Qpn, DEFAULT_PKEY, DEFAULT_QKEY};
use qp::QpRx;
use wire::Wire;

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

/// What the fabric itself did to packets (the "wire" counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FabricStats {
    /// Packets handed to a destination QP's receive queue.
    pub delivered: u64,
    /// Packets lost by fault injection.
    pub lost: u64,
    /// Extra copies made by fault injection.
    pub duplicated: u64,
    /// Packets held back so later ones overtake them.
    pub reordered: u64,
    /// Packets with a byte flipped.
    pub corrupted: u64,
    /// Packets marked ECN CE.
    pub ce_marked: u64,
    /// Packets to a GID no port has.
    pub unreachable: u64,
    /// Attempts to destroy an AH with sends still in flight (a bug on hardware).
    pub ah_destroy_in_use: u64,
}

/// A simulated fabric. Cheap to clone; every clone is the same fabric.
#[derive(Clone)]
pub struct SimFabric {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    cfg: SimConfig,
    state: Mutex<State>,
    wire_cv: Condvar,
}

pub(crate) struct State {
    /// Receive side of every QP, by (GID, QPN).
    qps: HashMap<Qpn, QpRx>,
    /// The fabric's starvation fault probability (copied for the delivery path).
    faults_starve: f64,
    /// Per-port drops for packets no QP could take (unknown QPN).
    port_unknown_qpn: HashMap<Gid, u64>,
    next_qpn: Qpn,
    rng: StdRng,
    stats: FabricStats,
    wire: Wire,
    /// Recycled packet buffers: no allocation per packet in steady state.
    free_bufs: Vec<Vec<u8>>,
}

impl SimFabric {
    /// A fabric with `cfg`.
    pub fn new(cfg: SimConfig) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                qps: HashMap::new(),
                faults_starve: cfg.faults.starve,
                port_unknown_qpn: HashMap::new(),
                next_qpn: 0x11,
                rng: StdRng::seed_from_u64(cfg.seed),
                stats: FabricStats::default(),
                wire: Wire::default(),
                free_bufs: Vec::new(),
            }),
            wire_cv: Condvar::new(),
            cfg,
        });
        if shared.cfg.faults.holds_packets() {
            wire::spawn(Arc::downgrade(&shared));
        }
        SimFabric { shared }
    }

    /// The fabric's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.shared.cfg
    }

    /// Create a UD QP on the port with GID `gid` (the port exists once a QP uses it).
    pub fn create_qp(&self, gid: Gid, opts: SimQpOptions) -> Result<SimQp, FabricError> {
        check_qkey(opts.qkey)?;
        check_pkey(opts.pkey)?;
        let mut st = self.shared.lock();
        let qpn = st.next_qpn;
        st.next_qpn += 1;
        st.qps.insert(qpn, QpRx::new(gid, opts.qkey, opts.pkey));
        st.port_unknown_qpn.entry(gid).or_default();
        drop(st);
        Ok(SimQp::new(self.shared.clone(), gid, qpn, opts))
    }

    /// The wire counters.
    pub fn stats(&self) -> FabricStats {
        self.shared.lock().stats
    }

    /// Number of packets still travelling (delayed or held back for reordering).
    pub fn in_flight(&self) -> usize {
        self.shared.lock().wire.len()
    }

    /// Wait up to `timeout` for delayed packets to land (for tests).
    pub fn settle(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while self.in_flight() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in the sim; keep the fabric usable
        // for the other endpoints' diagnostics rather than cascading panics.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFabric")
            .field("cfg", &self.shared.cfg)
            .finish()
    }
}
