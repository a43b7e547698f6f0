//! A UD queue pair of a `soft` port, and [`SoftPort::create_qp`] that makes one.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::Ordering;
use std::task::Waker;

use super::codec::{self, IcrcContext, IpPair, UdHeader, MASK_24, MAX_OVERHEAD};
use super::port::{SoftPort, SoftStats};
use crate::fabric::send_queue::SendQueue;
use crate::fabric::{
    check_qkey, send_qkey, AhAttr, AhId, AsyncEvent, Completion, FabricError, Memory,
    ProviderDrops, QpAttr, Qpn, RecvWr, Region, SendWr, UdQueuePair, WcOpcode, WcStatus, GRH_LEN,
};

/// Retries of a send the socket refused with "would block" before it counts as
/// wire loss. UD is unreliable; a short spin rides out a full socket buffer without
/// a blocking syscall on the caller's busy-poll path.
const SEND_RETRIES: usize = 64;

/// Largest UDP payload of one GSO `sendmsg` (IPv4: 65535 − 20 − 8).
const GSO_MAX_BYTES: usize = 65_507;

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

/// What a packet needs from its QP besides the WR: the sender's identity and
/// scratch, and the GSO batch being assembled in it.
struct Sender<'a> {
    port: &'a SoftPort,
    attr: &'a QpAttr,
    psn: &'a mut u32,
    tx_buf: &'a mut [u8],
    slot: usize,
    max_segments: usize,
    batch: Batch,
}

/// Packets of one `post_send` to one destination waiting in `tx_buf[..len]`:
/// all `seg` bytes long but the last, which may be shorter (and then closes the
/// batch) — the layout UDP GSO cuts into datagrams.
#[derive(Default)]
struct Batch {
    dest: Option<(SocketAddr, u8)>,
    len: usize,
    count: usize,
    seg: usize,
}

impl Batch {
    /// The last packet is shorter than the segments: nothing may follow it.
    fn closed(&self) -> bool {
        self.len < self.count * self.seg
    }
}

impl Sender<'_> {
    /// Encode and transmit one packet; errors are wire loss (counted), as on a NIC.
    fn transmit(&mut self, dest: SocketAddr, tc: u8, qkey: u32, wr: &SendWr, payload: &[u8]) {
        let s = &self.port.shared;
        let ip = match (s.local.ip(), dest.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpPair::V4 { src, dst },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpPair::V6 { src, dst },
            // create_ah refuses a family mismatch, so this is unreachable in practice.
            _ => {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let ctx = IcrcContext {
            ip,
            src_port: s.local.port(),
            dst_port: dest.port(),
        };
        let header = UdHeader {
            solicited: false,
            mig_req: false,
            pkey: self.attr.pkey,
            fecn: false,
            becn: false,
            dest_qp: wr.remote_qpn & MASK_24,
            ack_req: false,
            psn: *self.psn,
            qkey,
            src_qp: self.attr.qpn,
            imm: wr.imm,
        };
        *self.psn = (*self.psn + 1) & MASK_24;
        let key = Some((dest, tc));
        let n = codec::encoded_len(payload.len(), wr.imm.is_some());
        let gso = self.max_segments > 1 && s.gso_ok.load(Ordering::Relaxed);
        let b = &self.batch;
        // GSO cuts a batch into equal segments, the last possibly shorter.
        let joins = gso
            && b.count > 0
            && b.dest == key
            && !b.closed()
            && b.count < self.max_segments
            && n <= b.seg;
        if b.count > 0 && !joins {
            self.flush();
        }
        let (start, index) = (self.batch.len, self.batch.count);
        // The kernel numbers the datagrams of a GSO send 0, 1, 2, … (IPv4 ID).
        match codec::encode_with_ipv4_id(
            &header,
            payload,
            &ctx,
            index as u16,
            &mut self.tx_buf[start..start + self.slot],
        ) {
            Ok(_) => {}
            Err(_) => {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let b = &mut self.batch;
        if b.count == 0 {
            *b = Batch {
                dest: key,
                len: n,
                count: 1,
                seg: n,
            };
        } else {
            b.len += n;
            b.count += 1;
        }
    }

    /// Send the batch (one `sendmsg`; with GSO when it holds several packets)
    /// and empty it.
    fn flush(&mut self) {
        let b = std::mem::take(&mut self.batch);
        let len = b.len;
        let Some((dest, tc)) = b.dest else {
            return;
        };
        let s = &self.port.shared;
        let contents = &self.tx_buf[..len];
        if b.count > 1 {
            let sent = send_retrying(s, dest, tc, contents, Some(b.seg));
            if sent.is_ok() {
                s.tx_gso_batches.fetch_add(1, Ordering::Relaxed);
            }
            match count_send(s, sent, b.count, len) {
                None => return,
                Some(e) => {
                    // The kernel or device refuses UDP GSO: one by one from now on.
                    tracing::info!(%e, "UDP GSO refused; sending RoCEv2 packets one per sendmsg");
                    s.gso_ok.store(false, Ordering::Relaxed);
                }
            }
        }
        for pkt in contents.chunks(b.seg.max(1)) {
            let sent = send_retrying(s, dest, tc, pkt, None);
            if count_send(s, sent, 1, pkt.len()).is_some() {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Count one `sendmsg` of `packets` packets and `bytes` bytes by its outcome:
/// sent, or lost to a full socket buffer. Any other error is handed back
/// uncounted, for the caller to decide.
fn count_send(
    s: &super::port::Shared,
    sent: io::Result<()>,
    packets: usize,
    bytes: usize,
) -> Option<io::Error> {
    match sent {
        Ok(()) => {
            s.tx_packets.fetch_add(packets as u64, Ordering::Relaxed);
            s.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            None
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            s.tx_would_block
                .fetch_add(packets as u64, Ordering::Relaxed);
            None
        }
        Err(e) => Some(e),
    }
}

/// [`send_datagram`], riding out a full socket buffer with a short spin; the
/// last error otherwise (would-block and refusals alike are wire loss to UD).
fn send_retrying(
    s: &super::port::Shared,
    dest: SocketAddr,
    tc: u8,
    contents: &[u8],
    segment: Option<usize>,
) -> io::Result<()> {
    let mut attempt = 0;
    loop {
        match send_datagram(s, dest, tc, contents, segment) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && attempt < SEND_RETRIES => {
                attempt += 1;
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// One `sendmsg` carrying the AH's whole traffic class (DSCP + ECN) as an
/// `IP_TOS` / `IPV6_TCLASS` control message and, for a GSO batch, the segment
/// size as `UDP_SEGMENT` (the kernel cuts `contents` into datagrams of that size).
///
/// The control messages are built byte by byte in safe code for Linux's 64-bit
/// `struct cmsghdr` layout (`size_t cmsg_len; int cmsg_level; int cmsg_type;`,
/// then the data padded to 8: `CMSG_SPACE` of an `int` or a `u16` is 24 bytes).
/// The kernel copies the control buffer before parsing it, so its alignment
/// does not matter.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn send_datagram(
    s: &super::port::Shared,
    dest: SocketAddr,
    tc: u8,
    contents: &[u8],
    segment: Option<usize>,
) -> io::Result<()> {
    use socket2::{MsgHdr, SockAddr, SockRef};
    // <netinet/in.h>: IPPROTO_IP 0 / IP_TOS 1; IPPROTO_IPV6 41 / IPV6_TCLASS 67.
    let (level, kind): (i32, i32) = if dest.is_ipv4() { (0, 1) } else { (41, 67) };
    let mut cmsg = [0u8; 48];
    cmsg[0..8].copy_from_slice(&20u64.to_ne_bytes()); // CMSG_LEN(sizeof(int))
    cmsg[8..12].copy_from_slice(&level.to_ne_bytes());
    cmsg[12..16].copy_from_slice(&kind.to_ne_bytes());
    cmsg[16..20].copy_from_slice(&i32::from(tc).to_ne_bytes());
    let mut control = 24;
    if let Some(seg) = segment {
        // <linux/udp.h>: SOL_UDP 17, UDP_SEGMENT 103, a u16 segment size.
        let seg = u16::try_from(seg).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        cmsg[24..32].copy_from_slice(&18u64.to_ne_bytes()); // CMSG_LEN(sizeof(u16))
        cmsg[32..36].copy_from_slice(&17i32.to_ne_bytes());
        cmsg[36..40].copy_from_slice(&103i32.to_ne_bytes());
        cmsg[40..42].copy_from_slice(&seg.to_ne_bytes());
        control = 48;
    }
    let addr = SockAddr::from(dest);
    let bufs = [io::IoSlice::new(contents)];
    let msg = MsgHdr::new()
        .with_addr(&addr)
        .with_buffers(&bufs)
        .with_control(&cmsg[..control]);
    SockRef::from(&s.socket).sendmsg(&msg, 0).map(|_| ())
}

/// Elsewhere: quinn-udp's portable path, which carries only the ECN bits.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn send_datagram(
    s: &super::port::Shared,
    dest: SocketAddr,
    tc: u8,
    contents: &[u8],
    segment: Option<usize>,
) -> io::Result<()> {
    let transmit = quinn_udp::Transmit {
        destination: dest,
        ecn: quinn_udp::EcnCodepoint::from_bits(tc & 0b11),
        contents,
        segment_size: segment,
        src_ip: None,
    };
    s.udp.try_send((&s.socket).into(), &transmit)
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
