//! The simulated wire: fault injection, delayed delivery and the receiver checks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Weak;
use std::time::{Duration, Instant};

use rand::Rng;

use super::{Shared, SimConfig, State};
use crate::fabric::{Gid, Qpn};

/// A packet on the simulated wire: the fields a RoCEv2 packet carries.
pub(crate) struct Packet {
    pub(crate) dgid: Gid,
    pub(crate) dqpn: Qpn,
    pub(crate) sgid: Gid,
    pub(crate) src_qp: Qpn,
    pub(crate) pkey: u16,
    pub(crate) qkey: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) traffic_class: u8,
    pub(crate) flow_label: u32,
    pub(crate) hop_limit: u8,
    pub(crate) data: Vec<u8>,
}

struct Timed {
    at: Instant,
    seq: u64,
    pkt: Packet,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    // Min-heap on (time, sequence): equal times keep send order.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Packets in flight with a delivery time.
#[derive(Default)]
pub(crate) struct Wire {
    heap: BinaryHeap<Timed>,
    seq: u64,
}

impl Wire {
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

impl State {
    /// Take a recycled packet buffer holding a copy of `data`.
    pub(crate) fn packet_buf(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self.free_bufs.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(data);
        v
    }

    pub(crate) fn recycle(&mut self, buf: Vec<u8>) {
        if self.free_bufs.len() < 8192 {
            self.free_bufs.push(buf);
        }
    }

    /// Put a packet on the wire: apply faults, then deliver now or later.
    pub(crate) fn transmit(&mut self, cfg: &SimConfig, mut pkt: Packet, now: Instant) -> bool {
        let f = &cfg.faults;
        if f.loss > 0.0 && self.rng.gen_bool(f.loss) {
            self.stats.lost += 1;
            self.recycle(pkt.data);
            return false;
        }
        if f.corrupt > 0.0 && !pkt.data.is_empty() && self.rng.gen_bool(f.corrupt) {
            let i = self.rng.gen_range(0..pkt.data.len());
            pkt.data[i] ^= 1 << self.rng.gen_range(0..8);
            self.stats.corrupted += 1;
        }
        if f.ecn_ce > 0.0 && pkt.traffic_class & 0b11 != 0 && self.rng.gen_bool(f.ecn_ce) {
            pkt.traffic_class |= 0b11;
            self.stats.ce_marked += 1;
        }
        let mut woke = false;
        if f.duplicate > 0.0 && self.rng.gen_bool(f.duplicate) {
            let copy = Packet {
                data: self.packet_buf(&pkt.data),
                ..pkt
            };
            self.stats.duplicated += 1;
            woke |= self.schedule(cfg, copy, now);
        }
        woke | self.schedule(cfg, pkt, now)
    }

    fn schedule(&mut self, cfg: &SimConfig, pkt: Packet, now: Instant) -> bool {
        let f = &cfg.faults;
        let mut delay = f.delay;
        if f.reorder > 0.0 && self.rng.gen_bool(f.reorder) {
            delay += f.reorder_hold();
            self.stats.reordered += 1;
        }
        if delay.is_zero() {
            self.deliver(pkt);
            return false;
        }
        let seq = self.wire.seq;
        self.wire.seq += 1;
        self.wire.heap.push(Timed {
            at: now + delay,
            seq,
            pkt,
        });
        true
    }

    /// Deliver every packet whose time has come; returns the next due time.
    pub(crate) fn pump(&mut self, now: Instant) -> Option<Instant> {
        while let Some(t) = self.wire.heap.peek() {
            if t.at > now {
                return Some(t.at);
            }
            let t = self.wire.heap.pop().expect("peeked");
            self.deliver(t.pkt);
        }
        None
    }
}

/// Run the wire thread: it delivers delayed packets on time, and exits once the
/// fabric is gone.
pub(crate) fn spawn(shared: Weak<Shared>) {
    std::thread::Builder::new()
        .name("sim-wire".into())
        .spawn(move || loop {
            let Some(sh) = shared.upgrade() else { return };
            let mut st = sh.lock();
            let next = st.pump(Instant::now());
            let wait = next
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_millis(20))
                .min(Duration::from_millis(20));
            let (g, _) = sh
                .wire_cv
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner());
            drop(g);
        })
        .expect("spawn sim wire thread");
}
