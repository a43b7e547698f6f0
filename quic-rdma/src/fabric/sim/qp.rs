//! A simulated UD queue pair.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use rand::Rng;

use super::wire::Packet;
use super::{Shared, SimQpOptions, State};
use crate::fabric::grh::{Grh, GrhLayout};
use crate::fabric::send_queue::SendQueue;
use crate::fabric::{
    check_keys, send_qkey, AhAttr, AhId, AsyncEvent, Completion, FabricError, Gid, KeyDrop, Memory,
    PacketKeys, ProviderDrops, QpAttr, QpKeys, Qpn, RecvWr, Region, SendWr, UdQueuePair, WcOpcode,
    WcStatus, GRH_LEN,
};

/// RoCEv2 bytes around a UD payload in the IP payload: UDP 8 + BTH 12 + DETH 8 + ICRC 4.
const ROCEV2_UDP_OVERHEAD: usize = 8 + 12 + 8 + 4;

/// One packet waiting in a receive queue for the receiver to poll.
struct Arrival {
    data: Vec<u8>,
    grh: Grh,
    src_qp: Qpn,
    imm: Option<u32>,
}

/// The receive side of a QP, inside the fabric (written by senders' threads).
pub(crate) struct QpRx {
    gid: Gid,
    qkey: u32,
    pkey: u16,
    /// Posted receives not yet consumed by an arrival.
    credits: u32,
    arrived: VecDeque<Arrival>,
    drops: ProviderDrops,
    waker: Option<Waker>,
    events: VecDeque<AsyncEvent>,
    /// In the error state: arrivals are dropped, posted receives flushed.
    error: bool,
}

impl QpRx {
    pub(crate) fn new(gid: Gid, qkey: u32, pkey: u16) -> Self {
        QpRx {
            gid,
            qkey,
            pkey,
            credits: 0,
            arrived: VecDeque::new(),
            drops: ProviderDrops::default(),
            waker: None,
            events: VecDeque::new(),
            error: false,
        }
    }

    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Enter the error state: no receive is usable any more (IBA 10.3.1).
    fn fail(&mut self) {
        self.error = true;
        self.credits = 0;
        self.wake();
    }
}

impl State {
    /// The receiver's key checks ([`check_keys`], shared with every provider),
    /// then the UD rule: no posted receive, no packet.
    pub(crate) fn deliver(&mut self, pkt: Packet) {
        let starve = self.faults_starve;
        let starved = starve > 0.0 && self.rng.gen_bool(starve);
        let keys = PacketKeys {
            pkey: pkt.pkey,
            dest_qp: pkt.dqpn,
            qkey: pkt.qkey,
        };
        let qp = self.qps.get_mut(&pkt.dqpn).filter(|q| q.gid == pkt.dgid);
        let ours = qp.as_ref().map(|q| QpKeys {
            pkey: q.pkey,
            qkey: q.qkey,
        });
        let qp = match (check_keys(keys, ours), qp) {
            (Ok(()), Some(qp)) => qp,
            (Err(cause), Some(qp)) if cause != KeyDrop::UnknownQpn => {
                qp.drops.count(cause);
                self.recycle(pkt.data);
                return;
            }
            _ => {
                match self.port_unknown_qpn.get_mut(&pkt.dgid) {
                    Some(n) => *n += 1,
                    None => self.stats.unreachable += 1,
                }
                self.recycle(pkt.data);
                return;
            }
        };
        if qp.credits == 0 || starved {
            // A QP in the error state has no usable receive either.
            qp.drops.no_recv_posted += 1;
        } else {
            qp.credits -= 1;
            let layout = GrhLayout::for_gid(qp.gid);
            let padded = pkt.data.len().next_multiple_of(4);
            let imm_len = if pkt.imm.is_some() { 4 } else { 0 };
            let grh = Grh {
                sgid: pkt.sgid,
                dgid: pkt.dgid,
                traffic_class: pkt.traffic_class,
                flow_label: if layout == GrhLayout::Ipv4 {
                    0
                } else {
                    pkt.flow_label
                },
                hop_limit: pkt.hop_limit,
                ip_payload_len: (ROCEV2_UDP_OVERHEAD + padded + imm_len) as u16,
            };
            qp.arrived.push_back(Arrival {
                data: pkt.data,
                grh,
                src_qp: pkt.src_qp,
                imm: pkt.imm,
            });
            qp.wake();
            self.stats.delivered += 1;
            return;
        }
        self.recycle(pkt.data);
    }
}

/// A simulated UD queue pair (see the [module docs](super)).
pub struct SimQp {
    shared: Arc<Shared>,
    attr: QpAttr,
    next_lkey: u32,
    sq: SendQueue<AhAttr>,
    posted: VecDeque<RecvWr>,
}

/// A control handle to a simulated QP, for tests: move it to another GID
/// (migration), or inject an async event.
#[derive(Clone)]
pub struct SimQpHandle {
    shared: Arc<Shared>,
    qpn: Qpn,
}

impl SimQp {
    pub(crate) fn new(shared: Arc<Shared>, gid: Gid, qpn: Qpn, opts: SimQpOptions) -> Self {
        let cfg = &shared.cfg;
        let attr = QpAttr {
            qpn,
            qkey: opts.qkey,
            pkey: opts.pkey,
            gid,
            active_mtu: cfg.mtu,
            max_inline: cfg.max_inline,
            max_send_wr: cfg.max_send_wr,
            max_recv_wr: opts.max_recv_wr.unwrap_or(cfg.max_recv_wr),
        };
        SimQp {
            shared,
            next_lkey: 0x100 + qpn * 0x1000,
            sq: SendQueue::new(&attr),
            attr,
            posted: VecDeque::new(),
        }
    }

    /// A control handle for tests.
    pub fn handle(&self) -> SimQpHandle {
        SimQpHandle {
            shared: self.shared.clone(),
            qpn: self.attr.qpn,
        }
    }

    /// Sends posted and not yet retired by a polled completion.
    pub fn sends_outstanding(&self) -> usize {
        self.sq.outstanding()
    }
}

impl SimQpHandle {
    /// Move the QP to a new GID, as when the host's IP address changes; the QP
    /// receives `AsyncEvent::GidChanged` and packets to the old GID go nowhere.
    pub fn set_gid(&self, new: Gid) {
        let mut st = self.shared.lock();
        st.port_unknown_qpn.entry(new).or_default();
        if let Some(q) = st.qps.get_mut(&self.qpn) {
            q.gid = new;
            q.events.push_back(AsyncEvent::GidChanged { new });
            q.wake();
        }
    }

    /// Fail the QP as a HCA does on a fatal error: it enters the error state
    /// (sends and posted receives are flushed, arrivals dropped) and raises
    /// [`AsyncEvent::QpFatal`]. [`UdQueuePair::recover`] brings it back.
    pub fn fail(&self) {
        let mut st = self.shared.lock();
        if let Some(q) = st.qps.get_mut(&self.qpn) {
            q.fail();
            q.events.push_back(AsyncEvent::QpFatal);
        }
    }

    /// Queue an async event on the QP (port down, QP fatal, ...).
    pub fn inject_event(&self, ev: AsyncEvent) {
        let mut st = self.shared.lock();
        if let Some(q) = st.qps.get_mut(&self.qpn) {
            q.events.push_back(ev);
            q.wake();
        }
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.shared.lock().qps.remove(&self.attr.qpn);
    }
}

impl std::fmt::Debug for SimQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimQp").field("attr", &self.attr).finish()
    }
}

impl UdQueuePair for SimQp {
    fn attr(&self) -> &QpAttr {
        &self.attr
    }

    fn register(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.sq.register(region, self.next_lkey);
        self.next_lkey += 1;
        Ok(())
    }

    fn create_ah(&mut self, attr: &AhAttr) -> Result<AhId, FabricError> {
        Ok(self.sq.create_ah(*attr))
    }

    fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError> {
        let r = self.sq.destroy_ah(ah);
        if let Err(FabricError::AhBusy(_)) = r {
            self.shared.lock().stats.ah_destroy_in_use += 1;
        }
        r
    }

    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        let shared = self.shared.clone();
        let cfg = &shared.cfg;
        let mut st = shared.lock();
        let sgid = st.qps.get(&self.attr.qpn).map_or(self.attr.gid, |q| q.gid);
        if st.qps.get(&self.attr.qpn).is_some_and(|q| q.error) {
            self.sq.set_error();
        }
        let now = Instant::now();
        let mut wake_wire = false;
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let posted = self.sq.post(mem, wr, |ah, d| {
                let pkt = Packet {
                    dgid: ah.dgid,
                    dqpn: wr.remote_qpn,
                    sgid,
                    src_qp: self.attr.qpn,
                    pkey: self.attr.pkey,
                    qkey: send_qkey(wr.remote_qkey, self.attr.qkey),
                    imm: wr.imm,
                    traffic_class: ah.traffic_class,
                    flow_label: ah.flow_label,
                    hop_limit: ah.hop_limit,
                    data: st.packet_buf(d),
                };
                wake_wire |= st.transmit(cfg, pkt, now);
            });
            if let Err(e) = posted {
                result = Err((i, e));
                break;
            }
        }
        // A send that completed in error failed the whole QP (IBA 10.8.3).
        if self.sq.in_error() {
            if let Some(q) = st.qps.get_mut(&self.attr.qpn) {
                q.fail();
            }
        }
        drop(st);
        if wake_wire {
            shared.wire_cv.notify_one();
        }
        result
    }

    fn post_recv(&mut self, mem: &Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        let mut st = self.shared.lock();
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return Err((0, FabricError::QpError("QP destroyed".into())));
        };
        for (i, wr) in wrs.iter().enumerate() {
            if self.posted.len() >= self.attr.max_recv_wr as usize {
                return Err((i, FabricError::QueueFull(self.posted.len())));
            }
            if mem.resolve(&wr.sge).is_none() || !self.sq.is_registered(wr.sge.lkey) {
                return Err((
                    i,
                    FabricError::QpError(format!("receive buffer {:?} not registered", wr.sge)),
                ));
            }
            self.posted.push_back(*wr);
            if !rx.error {
                rx.credits += 1;
            }
        }
        Ok(())
    }

    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        self.sq.poll(out)
    }

    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        let shared = self.shared.clone();
        let mut st = shared.lock();
        let mut n = 0;
        while n < out.len() {
            let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
                break;
            };
            let Some(a) = rx.arrived.pop_front() else {
                // In the error state every receive still posted completes flushed.
                if !rx.error {
                    break;
                }
                let Some(wr) = self.posted.pop_front() else {
                    break;
                };
                out[n] = Completion::recv_flushed(wr.wr_id);
                n += 1;
                continue;
            };
            let wr = self
                .posted
                .pop_front()
                .expect("an arrival always consumed a posted receive");
            let layout = GrhLayout::for_gid(rx.gid);
            let buf = mem.resolve_mut(&wr.sge);
            let status = match buf {
                Some(buf) if buf.len() >= GRH_LEN + a.data.len() => {
                    a.grh.write(&mut buf[..GRH_LEN], layout);
                    buf[GRH_LEN..GRH_LEN + a.data.len()].copy_from_slice(&a.data);
                    WcStatus::Success
                }
                Some(_) => {
                    rx.drops.too_long += 1;
                    WcStatus::LocLenErr
                }
                None => WcStatus::LocProtErr,
            };
            out[n] = Completion {
                wr_id: wr.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: (GRH_LEN + a.data.len()) as u32,
                imm: a.imm,
                src_qp: a.src_qp,
            };
            n += 1;
            st.recycle(a.data);
        }
        n
    }

    fn arm(&mut self, waker: &Waker) -> bool {
        let mut st = self.shared.lock();
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return true;
        };
        match &rx.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => rx.waker = Some(waker.clone()),
        }
        !rx.arrived.is_empty()
            || !rx.events.is_empty()
            || self.sq.has_completions()
            || (rx.error && !self.posted.is_empty())
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        let ev = self
            .shared
            .lock()
            .qps
            .get_mut(&self.attr.qpn)
            .and_then(|q| q.events.pop_front());
        if let Some(AsyncEvent::GidChanged { new }) = ev {
            self.attr.gid = new;
        }
        ev
    }

    fn recover(&mut self) -> Result<(), FabricError> {
        let shared = self.shared.clone();
        let mut st = shared.lock();
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return Err(FabricError::QpError("QP destroyed".into()));
        };
        rx.error = false;
        rx.credits = 0;
        // A failure reported before the reset was about the QP just reset: drop
        // it, or it would reset the recovered QP again.
        rx.events.retain(|e| *e != AsyncEvent::QpFatal);
        let stale: Vec<Vec<u8>> = rx.arrived.drain(..).map(|a| a.data).collect();
        for data in stale {
            st.recycle(data);
        }
        self.posted.clear();
        self.sq.reset();
        Ok(())
    }

    fn drops(&self) -> ProviderDrops {
        let st = self.shared.lock();
        let rx = st.qps.get(&self.attr.qpn);
        let mut d = rx.map(|q| q.drops).unwrap_or_default();
        let port = rx.map_or(self.attr.gid, |q| q.gid);
        d.unknown_qpn = st.port_unknown_qpn.get(&port).copied().unwrap_or(0);
        d.oversize_sent = self.sq.oversize_sent();
        d
    }
}
