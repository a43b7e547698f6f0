//! The fabric's shared state: every QP's receive side, the wire, the fault
//! RNG and the clock; putting a packet on the wire (faults first) and
//! delivering it (the receiver's checks, then its receive queue).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::config::{SimClock, SimConfig};
use super::packet::{BufPool, Packet};
use super::rx::QpRx;
use super::stats::FabricStats;
use super::wire::Wire;
use crate::fabric::keys::accept;
use crate::fabric::qpn_map::QpnMap;
use crate::fabric::{Gid, Grh, GrhLayout, KeyDrop, PacketKeys, Qpn, GRH_LEN};

/// RoCEv2 bytes around a UD payload in the IP payload: UDP 8 + BTH 12 + DETH 8 + ICRC 4.
const ROCEV2_UDP_OVERHEAD: usize = 8 + 12 + 8 + 4;

/// What a fabric and its QPs share.
pub(crate) struct Shared {
    pub(crate) cfg: SimConfig,
    state: Mutex<State>,
    /// Recycled packet buffers, behind a lock of their own: senders fill them
    /// and receivers empty them outside the fabric's lock, which is held only
    /// to move packets (so the two sides do not copy in turn).
    bufs: Mutex<BufPool>,
    /// Wakes the wire thread (real-time clock) when a packet is held.
    pub(crate) wire_cv: Condvar,
}

/// Everything behind the fabric's lock.
pub(crate) struct State {
    /// Receive side of every QP, by QPN: looked up on every send, arrival
    /// and poll, so not SipHash ([`QpnMap`]).
    pub(crate) qps: QpnMap<QpRx>,
    /// Per-port drops for packets no QP could take (unknown QPN).
    pub(crate) port_unknown_qpn: HashMap<Gid, u64>,
    pub(crate) next_qpn: Qpn,
    rng: StdRng,
    pub(crate) stats: FabricStats,
    pub(crate) wire: Wire,
    /// The caller's time (`SimClock::Manual`); `None`: the wall clock.
    virtual_now: Option<Instant>,
    /// Packets still to be lost on purpose ([`super::SimFabric::lose_next`]).
    pub(crate) lose_next: u64,
}

impl Shared {
    pub(crate) fn new(cfg: SimConfig) -> Self {
        let virtual_now = match cfg.clock {
            SimClock::RealTime => None,
            SimClock::Manual { start } => Some(start),
        };
        Shared {
            state: Mutex::new(State {
                qps: QpnMap::default(),
                port_unknown_qpn: HashMap::new(),
                next_qpn: 0x11,
                rng: StdRng::seed_from_u64(cfg.seed),
                stats: FabricStats::default(),
                wire: Wire::default(),
                virtual_now,
                lose_next: 0,
            }),
            bufs: Mutex::new(BufPool::default()),
            wire_cv: Condvar::new(),
            cfg,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in the sim; keep the fabric usable
        // for the other endpoints' diagnostics rather than cascading panics.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The buffer pool (never taken while holding [`lock`](Self::lock)'s
    /// guard: one lock at a time, so no order to get wrong).
    pub(crate) fn bufs(&self) -> MutexGuard<'_, BufPool> {
        self.bufs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// The fabric's time: the caller's under a manual clock, else the wall clock.
    pub(crate) fn now(&self) -> Instant {
        self.virtual_now.unwrap_or_else(Instant::now)
    }

    /// Move a manual clock to `now` (never backwards).
    pub(crate) fn set_now(&mut self, now: Instant) {
        if let Some(t) = &mut self.virtual_now {
            *t = (*t).max(now);
        }
    }

    /// Put a packet on the wire: apply faults, then deliver now or hold it.
    /// Returns whether a packet was held (the wire thread must look).
    pub(crate) fn transmit(&mut self, cfg: &SimConfig, mut pkt: Packet, now: Instant) -> bool {
        self.stats.sent += 1;
        if self.lose_next > 0 {
            self.lose_next -= 1;
            self.stats.lost += 1;
            return false;
        }
        let f = &cfg.faults;
        if f.loss > 0.0 && self.rng.gen_bool(f.loss) {
            self.stats.lost += 1;
            return false;
        }
        let payload_len = pkt.payload().len();
        if f.corrupt > 0.0 && payload_len > 0 && self.rng.gen_bool(f.corrupt) {
            let i = GRH_LEN + self.rng.gen_range(0..payload_len);
            pkt.data[i] ^= 1 << self.rng.gen_range(0..8);
            self.stats.corrupted += 1;
        }
        if f.ecn_ce > 0.0 && pkt.traffic_class & 0b11 != 0 && self.rng.gen_bool(f.ecn_ce) {
            pkt.traffic_class |= 0b11;
            self.stats.ce_marked += 1;
        }
        let mut held = false;
        if f.duplicate > 0.0 && self.rng.gen_bool(f.duplicate) {
            let copy = Packet {
                data: pkt.data.clone(),
                ..pkt
            };
            self.stats.duplicated += 1;
            held |= self.schedule(cfg, copy, now);
        }
        held | self.schedule(cfg, pkt, now)
    }

    fn schedule(&mut self, cfg: &SimConfig, pkt: Packet, now: Instant) -> bool {
        let f = &cfg.faults;
        let mut delay = f.delay;
        if f.reorder > 0.0 && self.rng.gen_bool(f.reorder) {
            delay += f.reorder_hold();
            self.stats.reordered += 1;
        }
        if delay.is_zero() {
            self.deliver(cfg, pkt);
            return false;
        }
        self.wire.hold(now + delay, pkt);
        true
    }

    /// Deliver every packet due by `now`; returns when the next one is due.
    pub(crate) fn pump(&mut self, cfg: &SimConfig, now: Instant) -> Option<Instant> {
        while let Some(pkt) = self.wire.pop_due(now) {
            self.deliver(cfg, pkt);
        }
        self.wire.next_due()
    }

    /// The receiver's key checks (shared with every provider), then its
    /// receive queue (shared with `soft`): no posted receive, no packet.
    fn deliver(&mut self, cfg: &SimConfig, pkt: Packet) {
        let starve = cfg.faults.starve;
        let starved = starve > 0.0 && self.rng.gen_bool(starve);
        // The fabric's time, read below only for a QP that stamps arrivals.
        let virtual_now = self.virtual_now;
        let keys = PacketKeys {
            pkey: pkt.pkey,
            dest_qp: pkt.dqpn,
            qkey: pkt.qkey,
        };
        // A QP that moved to another GID is no longer reached at the old one.
        let rx = self.qps.get_mut(&pkt.dqpn).filter(|q| q.gid == pkt.dgid);
        let (rx_rq, doorbell) = match rx {
            Some(q) => (Some(&mut q.rq), Some(&q.doorbell)),
            None => (None, None),
        };
        let rq = match accept(keys, rx_rq) {
            Ok(rq) => rq,
            Err(KeyDrop::UnknownQpn) => {
                match self.port_unknown_qpn.get_mut(&pkt.dgid) {
                    Some(n) => *n += 1,
                    None => self.stats.unreachable += 1,
                }
                return;
            }
            Err(_) => return,
        };
        let layout = GrhLayout::for_gid(pkt.dgid);
        let payload_len = pkt.payload().len();
        let imm_len = if pkt.imm.is_some() { 4 } else { 0 };
        let grh = Grh {
            sgid: pkt.sgid,
            dgid: pkt.dgid,
            traffic_class: pkt.traffic_class,
            // IPv4 carries no flow label (RoCEv2 Annex A17.4.5.1).
            flow_label: if layout == GrhLayout::Ipv4 {
                0
            } else {
                pkt.flow_label
            },
            hop_limit: pkt.hop_limit,
            ip_payload_len: (ROCEV2_UDP_OVERHEAD + payload_len.next_multiple_of(4) + imm_len)
                as u16,
        };
        let byte_len = pkt.data.len();
        // A packet no receive takes is freed, not pooled: drops are rare
        // (faults, a starved queue), and the pool is not this lock's to take.
        let mut data = Some(pkt.data);
        // Before the arrival wakes the owner (a dropped packet rings for nothing:
        // the owner's next poll finds the queue empty and settles it).
        if let Some(d) = doorbell {
            d.store(true, std::sync::atomic::Ordering::Release);
        }
        if rq.stamping() {
            // Delivered now on the fabric's clock (StampClock::SimFabric).
            rq.set_arrival_time(virtual_now.unwrap_or_else(Instant::now));
        }
        let placed = rq.arrive(byte_len, pkt.imm, pkt.src_qp, starved, || {
            let mut d = data.take().expect("filled once");
            grh.write(&mut d[..GRH_LEN], layout);
            d
        });
        if placed.is_some() {
            self.stats.delivered += 1;
        }
    }
}
