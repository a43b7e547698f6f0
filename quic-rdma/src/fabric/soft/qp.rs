//! A UD queue pair of a `soft` port, and [`SoftPort::create_qp`] that makes one.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::Ordering;
use std::task::Waker;

use super::codec::MAX_OVERHEAD;
use super::port::{SoftPort, SoftStats};
use super::tx::{Batch, Sender, GSO_MAX_BYTES};
use crate::fabric::send_queue::SendQueue;
use crate::fabric::{
    check_qkey, send_qkey, AhAttr, AhId, AsyncEvent, Completion, FabricError, Memory,
    ProviderDrops, QpAttr, Qpn, RecvWr, Region, SendWr, UdQueuePair, WcOpcode, WcStatus, GRH_LEN,
};

/// What an address handle resolves to on a UDP socket.
struct AhEntry {
    dest: SocketAddr,
    traffic_class: u8,
}

/// One UD queue pair on a [`SoftPort`]; implements [`UdQueuePair`].
///
/// Sends go out on the port's socket inside `post_send` (a "NIC" with no queue of
/// its own); receives are matched to this QP's posted buffers by whichever QP of
/// the port polls, and written into registered memory by `poll_recv_cq`.
pub struct SoftQp {
    port: SoftPort,
    attr: QpAttr,
    sq: SendQueue<AhEntry>,
    psn: u32,
    /// Encoding scratch: room for one GSO batch of packets, reused for every send.
    tx_buf: Box<[u8]>,
    /// Room for one encoded packet.
    slot: usize,
    /// Packets per GSO batch (1: no GSO).
    max_segments: usize,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQp").field("attr", &self.attr).finish()
    }
}

impl SoftPort {
    /// Create a UD QP on this port accepting `qkey` (must be non-privileged).
    pub fn create_qp(&self, qkey: u32) -> Result<SoftQp, FabricError> {
        check_qkey(qkey)?;
        let cfg = &self.shared.cfg;
        let qpn = self
            .shared
            .lock()
            .table
            .add_qp(qkey, cfg.pkey, cfg.max_recv_wr as usize);
        Ok(SoftQp::new(self.clone(), qpn, qkey))
    }
}

impl SoftQp {
    fn new(port: SoftPort, qpn: Qpn, qkey: u32) -> Self {
        let cfg = &port.shared.cfg;
        let attr = QpAttr {
            qpn,
            qkey,
            pkey: cfg.pkey,
            gid: port.shared.gid,
            active_mtu: cfg.mtu,
            max_inline: cfg.max_inline,
            max_send_wr: cfg.max_send_wr,
            max_recv_wr: cfg.max_recv_wr,
        };
        let slot = cfg.mtu.bytes() + MAX_OVERHEAD;
        let max_segments = cfg
            .gso_segments
            .clamp(1, 64)
            .min(GSO_MAX_BYTES / slot)
            .max(1);
        let tx_buf = vec![0u8; slot * max_segments].into_boxed_slice();
        SoftQp {
            sq: SendQueue::new(&attr),
            attr,
            psn: 0,
            tx_buf,
            slot,
            max_segments,
            port,
        }
    }

    /// The port this QP lives on.
    pub fn port(&self) -> &SoftPort {
        &self.port
    }

    /// Port counters (shared by every QP of the port).
    pub fn stats(&self) -> SoftStats {
        self.port.stats()
    }

    /// Sends posted and not yet retired by a polled completion.
    pub fn sends_outstanding(&self) -> usize {
        self.sq.outstanding()
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut d = self.port.shared.lock();
        if let Some(slot) = d.table.qps.remove(&self.attr.qpn) {
            for a in slot.inbox {
                if let Some(b) = a.data {
                    d.table.recycle(b);
                }
            }
        }
    }
}

impl AsFd for SoftQp {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.port.as_fd()
    }
}

impl AsRawFd for SoftQp {
    fn as_raw_fd(&self) -> RawFd {
        self.port.as_raw_fd()
    }
}

impl UdQueuePair for SoftQp {
    fn attr(&self) -> &QpAttr {
        &self.attr
    }

    fn register(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let lkey = self.port.shared.next_lkey.fetch_add(1, Ordering::Relaxed) as u32;
        self.sq.register(region, lkey);
        Ok(())
    }

    fn create_ah(&mut self, attr: &AhAttr) -> Result<AhId, FabricError> {
        let ip = attr.dgid.to_ip();
        if ip.is_ipv4() != self.port.shared.local.is_ipv4() {
            // An IPv4 port cannot reach an IPv6 GID and vice versa.
            return Err(FabricError::Unreachable(attr.dgid));
        }
        let dest = SocketAddr::new(ip, self.port.shared.peer_port(ip));
        Ok(self.sq.create_ah(AhEntry {
            dest,
            traffic_class: attr.traffic_class,
        }))
    }

    fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError> {
        self.sq.destroy_ah(ah)
    }

    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        let mut tx = Sender {
            port: &self.port,
            attr: &self.attr,
            psn: &mut self.psn,
            tx_buf: &mut self.tx_buf,
            slot: self.slot,
            max_segments: self.max_segments,
            batch: Batch::default(),
        };
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let qkey = send_qkey(wr.remote_qkey, tx.attr.qkey);
            let posted = self.sq.post(mem, wr, |ah, d| {
                tx.transmit(ah.dest, ah.traffic_class, qkey, wr, d)
            });
            if self.sq.in_error() {
                // A send that completed in error failed the whole QP (IBA 10.8.3).
                let mut d = self.port.shared.lock();
                if let Some(slot) = d.table.qps.get_mut(&self.attr.qpn) {
                    slot.error = true;
                }
            }
            if let Err(e) = posted {
                result = Err((i, e));
                break;
            }
        }
        // The doorbell: what the batch holds goes out now.
        tx.flush();
        result
    }

    fn post_recv(&mut self, mem: &Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        let mut d = self.port.shared.lock();
        let Some(slot) = d.table.qps.get_mut(&self.attr.qpn) else {
            return Err((0, FabricError::QpError("QP destroyed".into())));
        };
        for (i, wr) in wrs.iter().enumerate() {
            if slot.rq.len() >= self.attr.max_recv_wr as usize {
                return Err((i, FabricError::QueueFull(slot.rq.len())));
            }
            if mem.resolve(&wr.sge).is_none()
                || !self.sq.is_registered(wr.sge.lkey)
                || (wr.sge.len as usize) < GRH_LEN
            {
                return Err((
                    i,
                    FabricError::QpError(format!(
                        "receive buffer {:?} not registered or shorter than the GRH",
                        wr.sge
                    )),
                ));
            }
            slot.rq.push_back(*wr);
        }
        Ok(())
    }

    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        self.sq.poll(out)
    }

    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        let shared = self.port.shared.clone();
        let mut d = shared.lock();
        shared.drain(&mut d, self.attr.qpn, out.len());
        let t = &mut d.table;
        let mut n = 0;
        while n < out.len() {
            let Some(a) = t
                .qps
                .get_mut(&self.attr.qpn)
                .and_then(|s| s.inbox.pop_front())
            else {
                // In the error state every receive still posted completes flushed.
                let Some(wr) = t
                    .qps
                    .get_mut(&self.attr.qpn)
                    .filter(|s| s.error)
                    .and_then(|s| s.rq.pop_front())
                else {
                    break;
                };
                out[n] = Completion::recv_flushed(wr.wr_id);
                n += 1;
                continue;
            };
            let mut status = a.status;
            if let Some(data) = a.data {
                let len = a.byte_len as usize;
                match mem.resolve_mut(&a.wr.sge) {
                    Some(buf) if buf.len() >= len => buf[..len].copy_from_slice(&data[..len]),
                    // The region was swapped out since post_recv.
                    _ => status = WcStatus::LocProtErr,
                }
                t.recycle(data);
            }
            out[n] = Completion {
                wr_id: a.wr.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: a.byte_len,
                imm: a.imm,
                src_qp: a.src_qp,
            };
            n += 1;
        }
        n
    }

    /// Stores the waker (woken when another QP of the port matches a packet to this
    /// one) and reports whether anything may be ready, including unread datagrams
    /// on the socket (peeked). Wake-ups for new datagrams come from the socket's
    /// readiness: register [`SoftPort`]'s fd with the reactor (`AsyncFd`).
    fn arm(&mut self, waker: &Waker) -> bool {
        let shared = self.port.shared.clone();
        let mut d = shared.lock();
        let Some(slot) = d.table.qps.get_mut(&self.attr.qpn) else {
            return true;
        };
        match &slot.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => slot.waker = Some(waker.clone()),
        }
        if !slot.inbox.is_empty()
            || self.sq.has_completions()
            || (slot.error && !slot.rq.is_empty())
        {
            return true;
        }
        let mut probe = [0u8; 1];
        match shared.socket.peek_from(&mut probe) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// The bound address never changes under a `soft` port, so there are no
    /// GID-change or port events.
    fn poll_event(&mut self) -> Option<AsyncEvent> {
        None
    }

    fn recover(&mut self) -> Result<(), FabricError> {
        let shared = self.port.shared.clone();
        let mut d = shared.lock();
        let t = &mut d.table;
        let Some(slot) = t.qps.get_mut(&self.attr.qpn) else {
            return Err(FabricError::QpError("QP destroyed".into()));
        };
        slot.error = false;
        slot.rq.clear();
        let stale: Vec<Box<[u8]>> = slot.inbox.drain(..).filter_map(|a| a.data).collect();
        for b in stale {
            t.recycle(b);
        }
        self.sq.reset();
        Ok(())
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }

    /// This QP's drops plus the port-wide `unknown_qpn`, `runt`, `malformed`,
    /// `bad_icrc` and `kernel_rx_dropped` counters (a packet for no QP, or
    /// unparseable, belongs to no QP). Reading the kernel's counter scans
    /// `/proc/net/udp`: call this for statistics, not per packet.
    fn drops(&self) -> ProviderDrops {
        // Read before taking the port's lock: it scans a /proc file.
        let kernel = self
            .port
            .shared
            .kernel_drops
            .as_ref()
            .map_or(0, |k| k.read());
        let d = self.port.shared.lock();
        let mut out = d
            .table
            .qps
            .get(&self.attr.qpn)
            .map(|s| s.drops)
            .unwrap_or_default();
        out.unknown_qpn = d.table.drops.unknown_qpn;
        out.malformed = d.table.drops.malformed;
        out.runt = d.table.drops.runt;
        out.kernel_rx_dropped = kernel;
        out.bad_icrc = d.table.drops.bad_icrc;
        out.oversize_sent = self.sq.oversize_sent();
        out
    }
}
