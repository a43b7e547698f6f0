//! The transmit path of a `soft` QP: each send is framed (headers, pad and
//! ICRC computed around its payload, which stays where the WR points) and
//! packets to one destination are gathered into a UDP GSO batch, sent with one
//! `sendmsg` — an iovec per header, payload and trailer, so the payload is
//! never copied in user space — carrying the AH's traffic class; a full socket
//! or a refusal is wire loss, counted.

use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;

use super::codec::{self, Frame, IcrcContext, IpPair, UdHeader, MASK_24};
use super::port::{Shared, SoftPort};
use crate::fabric::{QpAttr, SendWr};

/// Retries of a send the socket refused with "would block" before it counts as
/// wire loss. UD is unreliable; a short spin rides out a full socket buffer without
/// a blocking syscall on the caller's busy-poll path.
const SEND_RETRIES: usize = 64;

/// Largest UDP payload of one GSO `sendmsg` (IPv4: 65535 − 20 − 8).
pub(super) const GSO_MAX_BYTES: usize = 65_507;

/// Most packets in one GSO batch (Linux's `UDP_MAX_SEGMENTS` is 64 too).
pub(super) const MAX_SEGMENTS: usize = 64;

/// iovecs per packet: header, payload, pad + ICRC.
const IOV_PER_PACKET: usize = 3;

/// What a packet needs from its QP besides the WR: the sender's identity, the
/// frames of the batch being assembled, and the batch itself. `'m` is the
/// registered memory of the `post_send`, which the batch's payloads borrow
/// until it is flushed.
pub(super) struct Sender<'a, 'm> {
    pub(super) port: &'a SoftPort,
    pub(super) attr: &'a QpAttr,
    pub(super) psn: &'a mut u32,
    /// One frame per packet of the batch (at least `max_segments`).
    pub(super) frames: &'a mut [Frame],
    pub(super) max_segments: usize,
    pub(super) batch: Batch<'m>,
}

/// Packets of one `post_send` to one destination: frames `[..count]` of the
/// sender and their payloads, `len` bytes on the wire in all, every packet
/// `seg` bytes long but the last, which may be shorter (and then closes the
/// batch) — the layout UDP GSO cuts into datagrams.
pub(super) struct Batch<'m> {
    dest: Option<(SocketAddr, u8)>,
    len: usize,
    count: usize,
    seg: usize,
    payloads: [&'m [u8]; MAX_SEGMENTS],
}

impl Default for Batch<'_> {
    fn default() -> Self {
        Batch {
            dest: None,
            len: 0,
            count: 0,
            seg: 0,
            payloads: [&[]; MAX_SEGMENTS],
        }
    }
}

impl Batch<'_> {
    /// The last packet is shorter than the segments: nothing may follow it.
    fn closed(&self) -> bool {
        self.len < self.count * self.seg
    }
}

/// The iovecs of `frames` around `payloads`, in wire order, into `iov`; returns
/// how many (empty parts are left out). `iov` holds [`IOV_PER_PACKET`] per frame.
fn gather<'b>(frames: &'b [Frame], payloads: &[&'b [u8]], iov: &mut [IoSlice<'b>]) -> usize {
    let mut n = 0;
    for (f, p) in frames.iter().zip(payloads) {
        for part in [f.head(), p, f.tail()] {
            if !part.is_empty() {
                iov[n] = IoSlice::new(part);
                n += 1;
            }
        }
    }
    n
}

impl<'m> Sender<'_, 'm> {
    /// Frame and queue one packet; errors are wire loss (counted), as on a NIC.
    pub(super) fn transmit(
        &mut self,
        dest: SocketAddr,
        tc: u8,
        qkey: u32,
        wr: &SendWr,
        payload: &'m [u8],
    ) {
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
        let header = UdHeader::send(
            self.attr.pkey,
            wr.remote_qpn,
            *self.psn,
            qkey,
            self.attr.qpn,
            wr.imm,
        );
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
        let index = self.batch.count;
        // The kernel numbers the datagrams of a GSO send 0, 1, 2, … (IPv4 ID).
        match codec::encode_frame(&header, payload, &ctx, index as u16) {
            Ok(f) => self.frames[index] = f,
            Err(_) => {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let b = &mut self.batch;
        b.payloads[index] = payload;
        if b.count == 0 {
            b.dest = key;
            b.len = n;
            b.count = 1;
            b.seg = n;
        } else {
            b.len += n;
            b.count += 1;
        }
    }

    /// Send the batch (one `sendmsg`; with GSO when it holds several packets)
    /// and empty it.
    pub(super) fn flush(&mut self) {
        let b = &mut self.batch;
        let (dest, len, count, seg) = (b.dest.take(), b.len, b.count, b.seg);
        b.len = 0;
        b.count = 0;
        let Some((dest, tc)) = dest else {
            return;
        };
        let s = &self.port.shared;
        let frames = &self.frames[..count];
        let payloads = &self.batch.payloads[..count];
        let mut iov = [IoSlice::new(&[]); IOV_PER_PACKET * MAX_SEGMENTS];
        if count > 1 {
            let n = gather(frames, payloads, &mut iov);
            let sent = send_retrying(s, dest, tc, &iov[..n], Some(seg));
            if sent.is_ok() {
                s.tx_gso_batches.fetch_add(1, Ordering::Relaxed);
            }
            match count_send(s, sent, count, len) {
                None => return,
                Some(e) => {
                    // The kernel or device refuses UDP GSO: one by one from now on.
                    tracing::info!(%e, "UDP GSO refused; sending RoCEv2 packets one per sendmsg");
                    s.gso_ok.store(false, Ordering::Relaxed);
                }
            }
        }
        for i in 0..count {
            let n = gather(&frames[i..=i], &payloads[i..=i], &mut iov);
            let bytes = iov[..n].iter().map(|v| v.len()).sum();
            let sent = send_retrying(s, dest, tc, &iov[..n], None);
            if count_send(s, sent, 1, bytes).is_some() {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Count one `sendmsg` of `packets` packets and `bytes` bytes by its outcome:
/// sent, or lost to a full socket buffer. Any other error is handed back
/// uncounted, for the caller to decide.
fn count_send(s: &Shared, sent: io::Result<()>, packets: usize, bytes: usize) -> Option<io::Error> {
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
    s: &Shared,
    dest: SocketAddr,
    tc: u8,
    bufs: &[IoSlice<'_>],
    segment: Option<usize>,
) -> io::Result<()> {
    let mut attempt = 0;
    loop {
        match send_datagram(s, dest, tc, bufs, segment) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && attempt < SEND_RETRIES => {
                attempt += 1;
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// One `sendmsg` of the bytes of `bufs`, in order, carrying the AH's whole
/// traffic class (DSCP + ECN) as an `IP_TOS` / `IPV6_TCLASS` control message
/// and, for a GSO batch, the segment size as `UDP_SEGMENT` (the kernel cuts
/// the bytes into datagrams of that size, whatever the iovec boundaries).
///
/// The control messages are built byte by byte in safe code for Linux's 64-bit
/// `struct cmsghdr` layout (`size_t cmsg_len; int cmsg_level; int cmsg_type;`,
/// then the data padded to 8: `CMSG_SPACE` of an `int` or a `u16` is 24 bytes).
/// The kernel copies the control buffer before parsing it, so its alignment
/// does not matter.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn send_datagram(
    s: &Shared,
    dest: SocketAddr,
    tc: u8,
    bufs: &[IoSlice<'_>],
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
    let msg = MsgHdr::new()
        .with_addr(&addr)
        .with_buffers(bufs)
        .with_control(&cmsg[..control]);
    SockRef::from(&s.socket).sendmsg(&msg, 0).map(|_| ())
}

/// Elsewhere: quinn-udp's portable path, which carries only the ECN bits and
/// wants the bytes contiguous.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn send_datagram(
    s: &Shared,
    dest: SocketAddr,
    tc: u8,
    bufs: &[IoSlice<'_>],
    segment: Option<usize>,
) -> io::Result<()> {
    let contents: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
    let contents = &contents[..];
    let transmit = quinn_udp::Transmit {
        destination: dest,
        ecn: quinn_udp::EcnCodepoint::from_bits(tc & 0b11),
        contents,
        segment_size: segment,
        src_ip: None,
    };
    s.udp.try_send((&s.socket).into(), &transmit)
}
