//! `sim`: an in-process UD fabric between endpoints on threads.
//!
//! It honours every hardware semantic of docs/architecture.md §2 (MTU with silent drop of
//! oversized sends, GRH in receive buffers in IPv4 and IPv6 layouts, silent drop
//! with no posted receive, P_Key/Q_Key/QPN checks, in-order send completions)
//! and injects faults deterministically from a seed: loss, duplication,
//! reordering, corruption, delay, ECN marking and receive-queue starvation.
//! It is the test bed of every layer above and the "ideal NIC" of the benchmarks.
//!
//! Time comes from the wall clock ([`SimClock::RealTime`], a wire thread
//! delivers delayed packets) or from the caller ([`SimClock::Manual`]: no
//! thread, [`SimFabric::advance`] delivers what is due), so tests can drive
//! timers of the layers above in virtual time, reproducibly from the seed.
//!
//! Files, each depending only on those listed before it: `faults`, `config`,
//! `stats`, `packet`, `wire` (the timed queue), `rx` (a QP's receive side),
//! `state` (the shared state: transmit and deliver), `wire_thread`, `qp`.

mod config;
mod faults;
mod packet;
mod qp;
mod rx;
mod state;
mod stats;
mod wire;
mod wire_thread;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use config::{SimClock, SimConfig, SimQpOptions};
pub use faults::Faults;
pub use qp::{SimQp, SimQpHandle};
pub use stats::FabricStats;

use super::{check_pkey, check_qkey, FabricError, Gid, QpKeys};
use rx::QpRx;
use state::Shared;

/// A simulated fabric. Cheap to clone; every clone is the same fabric.
#[derive(Clone)]
pub struct SimFabric {
    shared: Arc<Shared>,
}

impl SimFabric {
    /// A fabric with `cfg`. Under [`SimClock::RealTime`] with faults that hold
    /// packets (delay, reordering) it starts the wire thread that delivers them.
    pub fn new(cfg: SimConfig) -> Self {
        let real_time = cfg.clock == SimClock::RealTime;
        let holds = cfg.faults.holds_packets();
        let shared = Arc::new(Shared::new(cfg));
        if real_time && holds {
            wire_thread::spawn(Arc::downgrade(&shared));
        }
        SimFabric { shared }
    }

    /// A fabric on the caller's clock, starting at `start` (see [`SimClock::Manual`]).
    pub fn manual(cfg: SimConfig, start: Instant) -> Self {
        SimFabric::new(SimConfig {
            clock: SimClock::Manual { start },
            ..cfg
        })
    }

    /// The fabric's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.shared.cfg
    }

    /// Create a UD QP on the port with GID `gid` (the port exists once a QP uses it).
    pub fn create_qp(&self, gid: Gid, opts: SimQpOptions) -> Result<SimQp, FabricError> {
        check_qkey(opts.qkey)?;
        check_pkey(opts.pkey)?;
        let depth = opts.max_recv_wr.unwrap_or(self.shared.cfg.max_recv_wr) as usize;
        let keys = QpKeys {
            pkey: opts.pkey,
            qkey: opts.qkey,
        };
        let mut st = self.shared.lock();
        let qpn = st.next_qpn;
        st.next_qpn += 1;
        let rx = QpRx::new(gid, keys, depth);
        let doorbell = rx.doorbell();
        st.qps.insert(qpn, rx);
        st.port_unknown_qpn.entry(gid).or_default();
        drop(st);
        Ok(SimQp::new(self.shared.clone(), gid, qpn, opts, doorbell))
    }

    /// The wire counters.
    pub fn stats(&self) -> FabricStats {
        self.shared.lock().stats
    }

    /// Number of packets still travelling (delayed or held back for reordering).
    pub fn in_flight(&self) -> usize {
        self.shared.lock().wire.len()
    }

    /// Lose the next `n` packets put on the wire (counted in
    /// [`FabricStats::lost`]), before any random fault is drawn: a test's
    /// way to drop one chosen packet.
    pub fn lose_next(&self, n: u64) {
        self.shared.lock().lose_next += n;
    }

    /// The fabric's time: the caller's under [`SimClock::Manual`], else now.
    pub fn now(&self) -> Instant {
        self.shared.lock().now()
    }

    /// Move time to `now` and deliver every packet due by then, in (due time,
    /// send order); returns when the next held packet is due. Under
    /// [`SimClock::Manual`] this is the only way time passes (it never goes
    /// back: an earlier `now` delivers what is due by the fabric's time);
    /// under [`SimClock::RealTime`] it delivers early what the wire thread
    /// would deliver by `now`.
    pub fn advance(&self, now: Instant) -> Option<Instant> {
        let mut st = self.shared.lock();
        st.set_now(now);
        let now = st.now();
        st.pump(&self.shared.cfg, now)
    }

    /// When the next held packet is due (`None`: nothing in flight).
    pub fn next_due(&self) -> Option<Instant> {
        self.shared.lock().wire.next_due()
    }

    /// Let every packet in flight land: under [`SimClock::Manual`] by
    /// advancing time to the last one's due time (no waiting), under
    /// [`SimClock::RealTime`] by waiting up to `timeout` for the wire thread.
    pub fn settle(&self, timeout: Duration) {
        if let SimClock::Manual { .. } = self.shared.cfg.clock {
            while let Some(t) = self.next_due() {
                self.advance(t);
            }
            return;
        }
        let deadline = Instant::now() + timeout;
        while self.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl std::fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFabric")
            .field("cfg", &self.shared.cfg)
            .finish()
    }
}
