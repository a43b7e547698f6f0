//! A simulated UD queue pair: the send queue (shared with `soft`) on the
//! owner's side, the receive side ([`QpRx`](super::rx::QpRx)) in the fabric.

use std::sync::Arc;
use std::task::Waker;

use super::config::SimQpOptions;
use super::packet::{packet_data, Packet};
use super::rx::Doorbell;
use super::state::Shared;
use crate::fabric::recv_queue::{RecvQueue, Taken};
use crate::fabric::send_queue::SendQueue;
use crate::fabric::{
    send_qkey, AhAttr, AhId, AsyncEvent, Completion, FabricError, Gid, Memory, ProviderDrops,
    QpAttr, Qpn, RecvWr, Region, SendWr, StampClock, UdQueuePair,
};

/// A simulated UD queue pair (see the [module docs](super)).
pub struct SimQp {
    shared: Arc<Shared>,
    attr: QpAttr,
    next_lkey: u32,
    sq: SendQueue<AhAttr>,
    /// Rung by the fabric when a completion or event may wait: an empty poll
    /// does not take the fabric's lock.
    doorbell: Doorbell,
    /// Packets built by a post before it takes the fabric's lock (kept for
    /// their capacity).
    staging: Vec<Packet>,
    /// Pool buffers taken for a post and not used, or emptied by a poll.
    spare: Vec<Vec<u8>>,
    /// Receive completions taken under the lock, finished after it.
    taken: Vec<Taken<Vec<u8>>>,
}

/// A control handle to a simulated QP, for tests: move it to another GID
/// (migration), or inject an async event.
#[derive(Clone)]
pub struct SimQpHandle {
    shared: Arc<Shared>,
    qpn: Qpn,
}

impl SimQp {
    pub(crate) fn new(
        shared: Arc<Shared>,
        gid: Gid,
        qpn: Qpn,
        opts: SimQpOptions,
        doorbell: Doorbell,
    ) -> Self {
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
            doorbell,
            staging: Vec::new(),
            spare: Vec::new(),
            taken: Vec::new(),
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
            q.raise(AsyncEvent::GidChanged { new });
        }
    }

    /// Fail the QP as a HCA does on a fatal error: it enters the error state
    /// (sends and posted receives are flushed, arrivals dropped) and raises
    /// [`AsyncEvent::QpFatal`]. [`UdQueuePair::recover`] brings it back.
    pub fn fail(&self) {
        let mut st = self.shared.lock();
        if let Some(q) = st.qps.get_mut(&self.qpn) {
            q.fail();
            q.raise(AsyncEvent::QpFatal);
        }
    }

    /// Queue an async event on the QP (port down, QP fatal, ...).
    pub fn inject_event(&self, ev: AsyncEvent) {
        let mut st = self.shared.lock();
        if let Some(q) = st.qps.get_mut(&self.qpn) {
            q.raise(ev);
        }
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(mut q) = st.qps.remove(&self.attr.qpn) {
            q.rq.reset(drop);
        }
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

    fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.sq.deregister(region)
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

    /// The bytes are copied (the "DMA read") before the fabric's lock is
    /// taken, and the lock is held only to put the packets on the wire, so a
    /// sender's copies never wait for, or hold up, its receiver's.
    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        let shared = self.shared.clone();
        let cfg = &shared.cfg;
        let (sgid, in_error) = {
            let st = shared.lock();
            let rx = st.qps.get(&self.attr.qpn);
            (
                rx.map_or(self.attr.gid, |q| q.gid),
                rx.is_some_and(|q| q.rq.in_error()),
            )
        };
        if in_error {
            self.sq.set_error();
        }
        shared.bufs().take_into(wrs.len(), &mut self.spare);
        let (mut pkts, spare) = (std::mem::take(&mut self.staging), &mut self.spare);
        let mut result = Ok(());
        let mark = self.sq.queued();
        for (i, wr) in wrs.iter().enumerate() {
            let posted = self.sq.post(mem, wr, |ah, d| {
                pkts.push(Packet {
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
                    data: packet_data(spare.pop(), d),
                })
            });
            if let Err(e) = posted {
                result = Err((i, e));
                break;
            }
        }
        let mut st = shared.lock();
        let now = st.now();
        let mut held = false;
        for pkt in pkts.drain(..) {
            held |= st.transmit(cfg, pkt, now);
        }
        // The batch left on the fabric's wire at `now` (StampClock::SimFabric).
        self.sq.stamp_since(mark, now);
        // A send that completed in error failed the whole QP (IBA 10.8.3).
        if self.sq.in_error() {
            if let Some(q) = st.qps.get_mut(&self.attr.qpn) {
                q.fail();
            }
        }
        drop(st);
        self.staging = pkts;
        if !self.spare.is_empty() {
            shared.bufs().give_all(&mut self.spare);
        }
        if held {
            shared.wire_cv.notify_one();
        }
        result
    }

    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        let mut st = self.shared.lock();
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return Err((0, FabricError::QpError("QP destroyed".into())));
        };
        rx.rq.post(mem, wrs, |lkey| self.sq.is_registered(lkey))
    }

    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        self.sq.poll(out)
    }

    /// Arrivals are taken under the fabric's lock and copied into `mem` (the
    /// "DMA write") after it is released.
    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        if !self.doorbell.rung() {
            return 0;
        }
        {
            let mut st = self.shared.lock();
            let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
                return 0;
            };
            rx.rq.take(out.len(), &mut self.taken);
            rx.settle();
        }
        let spare = &mut self.spare;
        let n = RecvQueue::finish(&mut self.taken, mem, out, |b| spare.push(b));
        if !self.spare.is_empty() {
            self.shared.bufs().give_all(&mut self.spare);
        }
        n
    }

    fn arm(&mut self, waker: &Waker) -> bool {
        let mut st = self.shared.lock();
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return true;
        };
        rx.rq.set_waker(waker);
        rx.rq.ready() || !rx.events.is_empty() || self.sq.has_completions()
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        if !self.doorbell.rung() {
            return None;
        }
        let ev = self
            .shared
            .lock()
            .qps
            .get_mut(&self.attr.qpn)
            .and_then(|q| {
                let ev = q.events.pop_front();
                q.settle();
                ev
            });
        if let Some(AsyncEvent::GidChanged { new }) = ev {
            self.attr.gid = new;
        }
        ev
    }

    fn recover(&mut self) -> Result<(), FabricError> {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return Err(FabricError::QpError("QP destroyed".into()));
        };
        rx.rq.reset(drop);
        // A failure reported before the reset was about the QP just reset: drop
        // it, or it would reset the recovered QP again.
        rx.events.retain(|e| *e != AsyncEvent::QpFatal);
        self.sq.reset();
        Ok(())
    }

    fn enable_timestamps(&mut self) -> Result<StampClock, FabricError> {
        let mut st = self.shared.lock();
        let Some(rx) = st.qps.get_mut(&self.attr.qpn) else {
            return Err(FabricError::QpError("QP destroyed".into()));
        };
        rx.rq.enable_stamps(StampClock::SimFabric);
        self.sq.enable_stamps(StampClock::SimFabric);
        Ok(StampClock::SimFabric)
    }

    fn drops(&self) -> ProviderDrops {
        let st = self.shared.lock();
        let rx = st.qps.get(&self.attr.qpn);
        let mut d = rx.map(|q| q.rq.drops).unwrap_or_default();
        let port = rx.map_or(self.attr.gid, |q| q.gid);
        d.unknown_qpn = st.port_unknown_qpn.get(&port).copied().unwrap_or(0);
        d.oversize_sent = self.sq.oversize_sent();
        d
    }
}
