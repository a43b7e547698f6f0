//! A UD queue pair of a `soft` port, and [`SoftPort::create_qp`] that makes one.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::Ordering;
use std::task::Waker;

use super::codec::{Frame, MAX_OVERHEAD};
use super::port::{SoftPort, SoftStats};
use super::tx::{Batch, Sender, GSO_MAX_BYTES, MAX_SEGMENTS};
use crate::fabric::send_queue::SendQueue;
use crate::fabric::{
    check_qkey, send_qkey, AhAttr, AhId, AsyncEvent, Completion, FabricError, Memory,
    ProviderDrops, QpAttr, Qpn, RecvWr, Region, SendWr, StampClock, UdQueuePair,
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
    /// The headers and trailers of one GSO batch, reused for every send (the
    /// payloads stay in registered memory).
    frames: Box<[Frame]>,
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
            .clamp(1, MAX_SEGMENTS)
            .min(GSO_MAX_BYTES / slot)
            .max(1);
        let frames = vec![Frame::default(); max_segments].into_boxed_slice();
        SoftQp {
            sq: SendQueue::new(&attr),
            attr,
            psn: 0,
            frames,
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
        let t = &mut d.table;
        if let Some(mut slot) = t.qps.remove(&self.attr.qpn) {
            slot.reset(|b| t.pool.push(b));
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

    fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.sq.deregister(region)
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
            frames: &mut self.frames,
            max_segments: self.max_segments,
            batch: Batch::default(),
        };
        let mut result = Ok(());
        let mark = self.sq.queued();
        for (i, wr) in wrs.iter().enumerate() {
            let qkey = send_qkey(wr.remote_qkey, tx.attr.qkey);
            let posted = self.sq.post(mem, wr, |ah, d| {
                tx.transmit(ah.dest, ah.traffic_class, qkey, wr, d)
            });
            if self.sq.in_error() {
                // A send that completed in error failed the whole QP (IBA 10.8.3).
                let mut d = self.port.shared.lock();
                if let Some(slot) = d.table.qps.get_mut(&self.attr.qpn) {
                    slot.fail();
                }
            }
            if let Err(e) = posted {
                result = Err((i, e));
                break;
            }
        }
        // The doorbell: what the batch holds goes out now.
        tx.flush();
        if self.sq.stamping() {
            // The post's last send syscall has returned (StampClock::HostMonotonic).
            self.sq.stamp_since(mark, std::time::Instant::now());
        }
        result
    }

    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        let mut d = self.port.shared.lock();
        let Some(slot) = d.table.qps.get_mut(&self.attr.qpn) else {
            return Err((0, FabricError::QpError("QP destroyed".into())));
        };
        slot.post(mem, wrs, |lkey| self.sq.is_registered(lkey))
    }

    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        self.sq.poll(out)
    }

    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        // Borrowed, not cloned: an `Arc` clone per poll is two atomic RMWs.
        let shared = &self.port.shared;
        let mut d = shared.lock();
        shared.drain(&mut d, self.attr.qpn, mem, out.len());
        let t = &mut d.table;
        let Some(slot) = t.qps.get_mut(&self.attr.qpn) else {
            return 0;
        };
        slot.poll(mem, out, |b| t.pool.push(b))
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
        slot.set_waker(waker);
        if slot.ready() || self.sq.has_completions() {
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
        slot.reset(|b| t.pool.push(b));
        self.sq.reset();
        Ok(())
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }

    /// Stamps on the host's monotonic clock, taken in user space: a receive
    /// when the packet is taken from the UDP socket, a send when the post's
    /// last send syscall returns.
    fn enable_timestamps(&mut self) -> Result<StampClock, FabricError> {
        let mut d = self.port.shared.lock();
        let Some(slot) = d.table.qps.get_mut(&self.attr.qpn) else {
            return Err(FabricError::QpError("QP destroyed".into()));
        };
        slot.enable_stamps(StampClock::HostMonotonic);
        self.sq.enable_stamps(StampClock::HostMonotonic);
        Ok(StampClock::HostMonotonic)
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
