//! The shared UDP socket of a `soft` port and the receive demultiplexer.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use quinn_udp::{RecvMeta, UdpSocketState};

use super::codec::{self, IcrcContext, IcrcPolicy, IcrcVerdict, IpPair};
use super::kernel_drops::KernelDrops;
use super::qp::SoftQp;
use crate::fabric::{
    check_keys, check_pkey, check_qkey, FabricError, Gid, Grh, GrhLayout, KeyDrop, Mtu, PacketKeys,
    ProviderDrops, QpKeys, Qpn, RecvWr, WcStatus, DEFAULT_PKEY, GRH_LEN, ROCEV2_UDP_PORT,
};

/// Datagram buffers handed to one `recvmmsg` (quinn-udp's batch).
const RX_BATCH: usize = 4;
/// Bytes per receive buffer: a whole UDP GRO super-datagram fits (at most 64 KiB).
const RX_SLOT: usize = 1 << 16;
/// Socket receive calls per `poll_recv_cq`, so one poll cannot spin forever under load.
const MAX_RECV_CALLS: usize = 8;
/// Hop limit written into reconstructed GRHs: a UDP socket does not see the TTL.
pub(crate) const ASSUMED_HOP_LIMIT: u8 = 64;

/// Configuration of a [`SoftPort`].
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Local address to bind. The IP must be a specific unicast address: it is the
    /// port's GID (IPv4-mapped for IPv4) and the source address the ICRC covers.
    /// The UDP port defaults to 4791; use another (or 0) for unprivileged or
    /// several-processes-per-IP setups.
    pub bind: SocketAddr,
    /// UDP destination port for peers without an override
    /// ([`SoftPort::set_peer_port`]); 4791 (kernel rxe and NICs listen there only).
    pub peer_port: u16,
    /// Active MTU reported in `QpAttr::active_mtu` and enforced on send and receive.
    pub mtu: Mtu,
    /// How received ICRCs are checked.
    pub icrc: IcrcPolicy,
    /// P_Key of QPs created on this port (0x0000 and 0x8000 are refused).
    pub pkey: u16,
    /// `max_inline_data` granted to QPs.
    pub max_inline: u32,
    /// Send queue depth of QPs.
    pub max_send_wr: u32,
    /// Receive queue depth of QPs.
    pub max_recv_wr: u32,
    /// QPN of the first QP created (QPNs 0 and 1 are special in IBA, 10.2.5).
    pub first_qpn: Qpn,
    /// Most RoCEv2 packets of one `post_send` to one destination handed to the
    /// kernel in one `sendmsg` with UDP GSO (Linux `UDP_SEGMENT`): the kernel
    /// (or the NIC) cuts them into separate datagrams, so the wire is the same
    /// but the per-datagram syscall cost is paid once per batch. 1 sends every
    /// packet on its own. A capture on the sending host's loopback or veth sees
    /// a batch as one large datagram (it is cut later); capture with 1.
    pub gso_segments: usize,
    /// Receive buffer (`SO_RCVBUF`) asked of the kernel, in bytes (it doubles the
    /// figure for bookkeeping and caps it at `net.core.rmem_max`). Datagrams that
    /// find it full are dropped by the kernel and counted in
    /// [`ProviderDrops::kernel_rx_dropped`].
    pub recv_buffer: usize,
}

impl SoftConfig {
    /// Defaults for a port bound to `ip` on UDP port 4791: MTU 4096, ICRC checked
    /// with IPv4-ID solving, P_Key 0xFFFF.
    pub fn new(ip: IpAddr) -> Self {
        SoftConfig {
            bind: SocketAddr::new(ip, ROCEV2_UDP_PORT),
            peer_port: ROCEV2_UDP_PORT,
            mtu: Mtu::M4096,
            icrc: IcrcPolicy::default(),
            pkey: DEFAULT_PKEY,
            max_inline: 188,
            max_send_wr: 1024,
            max_recv_wr: 1024,
            first_qpn: 0x11,
            gso_segments: 16,
            recv_buffer: 4 << 20,
        }
    }

    /// Bind to `port` instead of 4791 (0 picks a free one).
    pub fn with_port(mut self, port: u16) -> Self {
        self.bind.set_port(port);
        self
    }
}

/// Counters of a `soft` port beyond [`ProviderDrops`] (shared by all its QPs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftStats {
    /// RoCE packets handed to the socket.
    pub tx_packets: u64,
    /// UDP payload bytes handed to the socket.
    pub tx_bytes: u64,
    /// `sendmsg` calls that carried a GSO batch of several packets.
    pub tx_gso_batches: u64,
    /// Sends dropped because the socket buffer stayed full (counted as wire loss).
    pub tx_would_block: u64,
    /// Sends the kernel refused (other than would-block); also wire loss.
    pub tx_errors: u64,
    /// UDP datagrams read from the socket.
    pub rx_datagrams: u64,
    /// Packets that failed [`codec::decode`] (in `ProviderDrops::malformed`).
    pub rx_decode_errors: u64,
    /// Packets whose ICRC did not match (in `ProviderDrops::bad_icrc`).
    pub rx_bad_icrc: u64,
    /// Packets larger than the active MTU (in `ProviderDrops::malformed`).
    pub rx_oversize: u64,
    /// Packets whose ICRC matched only with a non-zero IPv4 ID (kernel rxe
    /// senders; packets of a `soft` sender's GSO batch after its first).
    pub rx_ipv4_id_solved: u64,
    /// Packets placed in a receive buffer.
    pub rx_delivered: u64,
}

/// A received packet already matched to a posted receive, waiting for its QP to
/// poll (only then can it be written into the QP's registered memory).
pub(crate) struct Arrival {
    pub(crate) wr: RecvWr,
    pub(crate) status: WcStatus,
    /// GRH area + payload length.
    pub(crate) byte_len: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) src_qp: Qpn,
    /// Pool buffer holding GRH area + payload (None for error completions).
    pub(crate) data: Option<Box<[u8]>>,
}

/// Receive-side state of one QP, owned by the demultiplexer.
pub(crate) struct RxSlot {
    pub(crate) qkey: u32,
    pub(crate) pkey: u16,
    /// Posted receives, in order.
    pub(crate) rq: VecDeque<RecvWr>,
    /// Matched packets not yet polled.
    pub(crate) inbox: VecDeque<Arrival>,
    pub(crate) drops: ProviderDrops,
    pub(crate) waker: Option<Waker>,
    /// The QP is in the error state: arrivals are dropped, posted receives flushed.
    pub(crate) error: bool,
}

/// Everything the receive path mutates, behind the port's mutex.
pub(crate) struct Table {
    pub(crate) qps: HashMap<Qpn, RxSlot>,
    next_qpn: Qpn,
    /// Recycled packet buffers (GRH area + MTU), so steady state allocates nothing.
    pub(crate) pool: Vec<Box<[u8]>>,
    /// Port-level drops: unknown QPN, runts, malformed and bad ICRC.
    pub(crate) drops: ProviderDrops,
    rx: RxCounters,
}

#[derive(Default)]
struct RxCounters {
    datagrams: u64,
    decode_errors: u64,
    bad_icrc: u64,
    oversize: u64,
    id_solved: u64,
    delivered: u64,
}

pub(crate) struct Demux {
    buf: Box<[u8]>,
    meta: [RecvMeta; RX_BATCH],
    pub(crate) table: Table,
}

/// State shared by a port and its QPs.
pub(crate) struct Shared {
    pub(crate) socket: UdpSocket,
    pub(crate) udp: UdpSocketState,
    pub(crate) local: SocketAddr,
    pub(crate) gid: Gid,
    pub(crate) cfg: SoftConfig,
    pub(crate) demux: Mutex<Demux>,
    pub(crate) peer_ports: Mutex<HashMap<IpAddr, u16>>,
    pub(crate) next_lkey: AtomicU64,
    pub(crate) tx_packets: AtomicU64,
    pub(crate) tx_bytes: AtomicU64,
    /// `sendmsg` calls that carried a GSO batch of more than one packet.
    pub(crate) tx_gso_batches: AtomicU64,
    /// Cleared when the kernel refuses UDP GSO: packets go one by one from then on.
    pub(crate) gso_ok: std::sync::atomic::AtomicBool,
    pub(crate) tx_would_block: AtomicU64,
    pub(crate) tx_errors: AtomicU64,
    /// Where the kernel counts datagrams it dropped for the socket (`None`
    /// without `/proc`: the count reads 0).
    pub(crate) kernel_drops: Option<KernelDrops>,
}

/// A `soft` RoCEv2 port: one UDP socket bound to a local IP, shared by any number
/// of UD QPs that it demultiplexes by destination QPN.
///
/// ```no_run
/// use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
/// use quic_rdma::fabric::{UdQueuePair, DEFAULT_QKEY};
/// let port = SoftPort::open(SoftConfig::new("127.0.0.1".parse().unwrap()))?;
/// let qp = port.create_qp(DEFAULT_QKEY)?;
/// println!("listening as {} QPN {:#x}", port.gid(), qp.attr().qpn);
/// # Ok::<(), quic_rdma::fabric::FabricError>(())
/// ```
///
/// Cloning is cheap and shares the socket.
#[derive(Clone)]
pub struct SoftPort {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for SoftPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPort")
            .field("local", &self.shared.local)
            .field("gid", &self.shared.gid)
            .finish()
    }
}

impl SoftPort {
    /// Bind the port's UDP socket (non-blocking, ECN and destination-address
    /// reporting on, DF set so IPv4 ID is 0 — see `codec` docs).
    pub fn open(cfg: SoftConfig) -> Result<SoftPort, FabricError> {
        let ip = cfg.bind.ip();
        let bad_ip = match ip {
            IpAddr::V4(v4) => v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast(),
            IpAddr::V6(v6) => {
                v6.is_unspecified() || v6.is_multicast() || v6.to_ipv4_mapped().is_some()
            }
        };
        if bad_ip {
            return Err(FabricError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "soft port must bind a specific unicast IP (it is the GID and the \
                     ICRC source address), not {ip}; bind IPv4 addresses as IPv4"
                ),
            )));
        }
        check_pkey(cfg.pkey)?;
        let socket = UdpSocket::bind(cfg.bind)?;
        let udp = UdpSocketState::new((&socket).into())?;
        // Best effort: a deep kernel queue absorbs bursts between polls.
        let _ = udp.set_recv_buffer_size((&socket).into(), cfg.recv_buffer);
        let _ = udp.set_send_buffer_size((&socket).into(), 4 << 20);
        let local = socket.local_addr()?;
        let kernel_drops = KernelDrops::locate(&socket);
        let demux = Demux {
            buf: vec![0u8; RX_BATCH * RX_SLOT].into_boxed_slice(),
            meta: [RecvMeta::default(); RX_BATCH],
            table: Table {
                qps: HashMap::new(),
                next_qpn: cfg.first_qpn.clamp(2, crate::fabric::addr::MAX_QPN),
                pool: Vec::new(),
                drops: ProviderDrops::default(),
                rx: RxCounters::default(),
            },
        };
        Ok(SoftPort {
            shared: Arc::new(Shared {
                socket,
                udp,
                local,
                gid: Gid::from(ip),
                cfg,
                demux: Mutex::new(demux),
                peer_ports: Mutex::new(HashMap::new()),
                next_lkey: AtomicU64::new(0x100),
                tx_packets: AtomicU64::new(0),
                tx_gso_batches: AtomicU64::new(0),
                gso_ok: std::sync::atomic::AtomicBool::new(true),
                tx_bytes: AtomicU64::new(0),
                tx_would_block: AtomicU64::new(0),
                tx_errors: AtomicU64::new(0),
                kernel_drops,
            }),
        })
    }

    /// Create a UD QP on this port accepting `qkey` (must be non-privileged).
    pub fn create_qp(&self, qkey: u32) -> Result<SoftQp, FabricError> {
        check_qkey(qkey)?;
        let cfg = &self.shared.cfg;
        let mut d = self.shared.lock();
        let t = &mut d.table;
        let mut qpn = t.next_qpn;
        while t.qps.contains_key(&qpn) {
            qpn = next_qpn(qpn);
        }
        t.next_qpn = next_qpn(qpn);
        t.qps.insert(
            qpn,
            RxSlot {
                qkey,
                pkey: cfg.pkey,
                rq: VecDeque::with_capacity(cfg.max_recv_wr as usize),
                inbox: VecDeque::with_capacity(cfg.max_recv_wr as usize),
                drops: ProviderDrops::default(),
                waker: None,
                error: false,
            },
        );
        drop(d);
        Ok(SoftQp::new(self.clone(), qpn, qkey))
    }

    /// The port's GID (IPv4-mapped for an IPv4 bind address).
    pub fn gid(&self) -> Gid {
        self.shared.gid
    }

    /// The bound socket address (its port is what peers must send to).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// The active MTU.
    pub fn active_mtu(&self) -> Mtu {
        self.shared.cfg.mtu
    }

    /// Send to UDP port `port` at `gid` instead of the configured `peer_port`
    /// (several `soft` processes sharing one IP). Address handles resolve the port
    /// when created, like hardware resolves the MAC: set this before `create_ah`.
    pub fn set_peer_port(&self, gid: Gid, port: u16) {
        self.shared
            .peer_ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(gid.to_ip(), port);
    }

    /// Port counters.
    pub fn stats(&self) -> SoftStats {
        let s = &self.shared;
        let d = s.lock();
        let rx = &d.table.rx;
        SoftStats {
            tx_packets: s.tx_packets.load(Ordering::Relaxed),
            tx_gso_batches: s.tx_gso_batches.load(Ordering::Relaxed),
            tx_bytes: s.tx_bytes.load(Ordering::Relaxed),
            tx_would_block: s.tx_would_block.load(Ordering::Relaxed),
            tx_errors: s.tx_errors.load(Ordering::Relaxed),
            rx_datagrams: rx.datagrams,
            rx_decode_errors: rx.decode_errors,
            rx_bad_icrc: rx.bad_icrc,
            rx_oversize: rx.oversize,
            rx_ipv4_id_solved: rx.id_solved,
            rx_delivered: rx.delivered,
        }
    }
}

/// The socket's descriptor, for readiness-based wake-ups: wrap a clone of the port
/// in `tokio::io::unix::AsyncFd` and poll the QPs when it turns readable.
impl AsFd for SoftPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.socket.as_fd()
    }
}

impl AsRawFd for SoftPort {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.socket.as_raw_fd()
    }
}

fn next_qpn(q: Qpn) -> Qpn {
    if q >= crate::fabric::addr::MAX_QPN {
        2
    } else {
        q + 1
    }
}

impl Shared {
    /// Lock the demultiplexer; a panic elsewhere must not wedge the port, and the
    /// state stays consistent between statements, so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Demux> {
        self.demux.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn peer_port(&self, ip: IpAddr) -> u16 {
        self.peer_ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ip)
            .copied()
            .unwrap_or(self.cfg.peer_port)
    }

    /// Read datagrams until the socket is empty, `MAX_RECV_CALLS` reads were made,
    /// or QP `me` has `want` arrivals waiting; match each to its QP.
    pub(crate) fn drain(&self, d: &mut Demux, me: Qpn, want: usize) {
        for _ in 0..MAX_RECV_CALLS {
            if d.table.qps.get(&me).is_some_and(|s| s.inbox.len() >= want) {
                return;
            }
            let Demux { buf, meta, table } = d;
            let mut chunks = buf.chunks_mut(RX_SLOT);
            let mut iovs: [IoSliceMut<'_>; RX_BATCH] =
                std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
            let n = match self.udp.recv((&self.socket).into(), &mut iovs, meta) {
                Ok(n) => n,
                // WouldBlock: empty. Anything else (e.g. ICMP errors queued on the
                // socket) is not about a received packet: stop this round.
                Err(_) => return,
            };
            for (i, m) in meta.iter().enumerate().take(n) {
                let start = i * RX_SLOT;
                let data = &buf[start..start + m.len.min(RX_SLOT)];
                if data.is_empty() {
                    // A zero-length datagram: `chunks` would yield nothing, and
                    // it must still be counted (as a runt).
                    table.accept(self, m, data);
                    continue;
                }
                let stride = if m.stride == 0 { data.len() } else { m.stride };
                for pkt in data.chunks(stride.max(1)) {
                    table.accept(self, m, pkt);
                }
            }
        }
    }
}

impl Table {
    /// The receive checks of IBA 9.6 / 10.2.4 / 11.4.1 in hardware order, then
    /// match to a posted receive. Every drop is counted by cause.
    fn accept(&mut self, port: &Shared, m: &RecvMeta, pkt: &[u8]) {
        self.rx.datagrams += 1;
        if pkt.len() < codec::BTH_LEN {
            // Not even a base transport header: not RoCE at all (a probe, a
            // stray zero-length datagram), counted apart from damaged RoCE.
            self.drops.runt += 1;
            return;
        }
        let decoded = match codec::decode(pkt) {
            Ok(d) => d,
            Err(_) => {
                self.rx.decode_errors += 1;
                self.drops.malformed += 1;
                return;
            }
        };
        let dst_ip = m.dst_ip.unwrap_or(port.local.ip());
        let ip = match (m.addr.ip(), dst_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpPair::V4 { src, dst },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpPair::V6 { src, dst },
            _ => {
                self.drops.malformed += 1;
                return;
            }
        };
        let ctx = IcrcContext {
            ip,
            src_port: m.addr.port(),
            dst_port: port.local.port(),
        };
        match codec::verify_icrc(&ctx, pkt, port.cfg.icrc) {
            Ok(IcrcVerdict::Verified { ipv4_id }) if ipv4_id != 0 => self.rx.id_solved += 1,
            Ok(_) => {}
            Err(_) => {
                self.rx.bad_icrc += 1;
                self.drops.bad_icrc += 1;
                return;
            }
        }
        let mtu = port.cfg.mtu.bytes();
        if decoded.payload.len() > mtu {
            self.rx.oversize += 1;
            self.drops.malformed += 1;
            return;
        }
        let h = decoded.header;
        let keys = PacketKeys {
            pkey: h.pkey,
            dest_qp: h.dest_qp,
            qkey: h.qkey,
        };
        let slot = self.qps.get_mut(&h.dest_qp);
        let ours = slot.as_ref().map(|s| QpKeys {
            pkey: s.pkey,
            qkey: s.qkey,
        });
        // The key checks every provider shares; unknown QPN belongs to the port.
        let slot = match (check_keys(keys, ours), slot) {
            (Ok(()), Some(slot)) => slot,
            (Err(cause), Some(slot)) if cause != KeyDrop::UnknownQpn => {
                slot.drops.count(cause);
                return;
            }
            _ => {
                self.drops.count(KeyDrop::UnknownQpn);
                return;
            }
        };
        // A QP in the error state has no usable receive (IBA 10.3.1).
        let Some(wr) = slot.rq.pop_front().filter(|_| !slot.error) else {
            slot.drops.no_recv_posted += 1;
            return;
        };
        let byte_len = GRH_LEN + decoded.payload.len();
        let (status, data) = if (wr.sge.len as usize) < byte_len {
            slot.drops.too_long += 1;
            (WcStatus::LocLenErr, None)
        } else {
            let mut b = self
                .pool
                .pop()
                .unwrap_or_else(|| vec![0u8; GRH_LEN + mtu].into_boxed_slice());
            let grh = Grh {
                sgid: Gid::from(m.addr.ip()),
                dgid: Gid::from(dst_ip),
                // Only the ECN bits are observable (IP_RECVTOS via quinn-udp reports
                // ECN); DSCP is not, so it reads as 0.
                traffic_class: m.ecn.map_or(0, |e| e as u8),
                // Never reaches a UDP socket (and kernel rxe sends 0 anyway).
                flow_label: 0,
                hop_limit: ASSUMED_HOP_LIMIT,
                ip_payload_len: u16::try_from(8 + pkt.len()).unwrap_or(u16::MAX),
            };
            grh.write(&mut b[..GRH_LEN], GrhLayout::for_gid(port.gid));
            b[GRH_LEN..byte_len].copy_from_slice(decoded.payload);
            self.rx.delivered += 1;
            (WcStatus::Success, Some(b))
        };
        slot.inbox.push_back(Arrival {
            wr,
            status,
            byte_len: byte_len as u32,
            imm: h.imm,
            src_qp: h.src_qp,
            data,
        });
        if let Some(w) = &slot.waker {
            w.wake_by_ref();
        }
    }

    /// Return a packet buffer to the pool.
    pub(crate) fn recycle(&mut self, b: Box<[u8]>) {
        self.pool.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_wildcard_bind() {
        assert!(SoftPort::open(SoftConfig::new("0.0.0.0".parse().unwrap())).is_err());
        assert!(SoftPort::open(SoftConfig::new("::ffff:127.0.0.1".parse().unwrap())).is_err());
    }
}
