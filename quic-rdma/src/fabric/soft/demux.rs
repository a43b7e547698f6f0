//! The receive demultiplexer of a `soft` port: the port's QPs share one socket,
//! and whichever QP polls reads a batch of datagrams, checks each packet in
//! hardware order (structure, ICRC, MTU, QPN, P_Key, Q_Key, posted receive,
//! length) and parks it, matched to a posted receive, for the QP it is for.
//!
//! Both the port (which owns the demultiplexer) and its QPs (which post receives
//! and collect arrivals) depend on this file; it depends on neither.

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use quinn_udp::{RecvMeta, UdpSocketState};

use super::codec::{self, IcrcContext, IcrcPolicy, IcrcVerdict, IpPair, Ipv4IdGuess};
use crate::fabric::keys::accept;
use crate::fabric::qpn_map::QpnMap;
use crate::fabric::recv_queue::RecvQueue;
use crate::fabric::{
    Gid, Grh, GrhLayout, KeyDrop, Memory, Mtu, PacketKeys, ProviderDrops, QpKeys, Qpn, WcStatus,
    GRH_LEN,
};

/// The receive side of one QP of the port: the receive-queue model every
/// software provider shares, holding pooled packet buffers.
pub(crate) type RxSlot = RecvQueue<Box<[u8]>>;

/// Datagram buffers handed to one `recvmmsg` (quinn-udp's batch).
const RX_BATCH: usize = 4;
/// Bytes per receive buffer: a whole UDP GRO super-datagram fits (at most 64 KiB).
const RX_SLOT: usize = 1 << 16;
/// Socket receive calls per `poll_recv_cq`, so one poll cannot spin forever under load.
const MAX_RECV_CALLS: usize = 8;
/// Hop limit written into reconstructed GRHs: a UDP socket does not see the TTL.
const ASSUMED_HOP_LIMIT: u8 = 64;

/// Everything the receive path mutates, behind the port's mutex.
pub(crate) struct Table {
    pub(crate) qps: QpnMap<RxSlot>,
    next_qpn: Qpn,
    /// Recycled packet buffers (GRH area + MTU), so steady state allocates nothing.
    pub(crate) pool: Vec<Box<[u8]>>,
    /// Port-level drops: unknown QPN, runts, malformed and bad ICRC.
    pub(crate) drops: ProviderDrops,
    pub(crate) rx: RxCounters,
    /// Per-length work of checking a packet's GRO position as its IPv4 ID.
    id_guess: Ipv4IdGuess,
}

/// Receive-path counters behind the port's [`SoftStats`](super::SoftStats).
#[derive(Default)]
pub(crate) struct RxCounters {
    pub(crate) datagrams: u64,
    pub(crate) decode_errors: u64,
    pub(crate) bad_icrc: u64,
    pub(crate) oversize: u64,
    pub(crate) id_solved: u64,
    pub(crate) id_at_position: u64,
    pub(crate) delivered: u64,
}

/// The receive buffers of one `recvmmsg` batch and the per-QP receive state.
pub(crate) struct Demux {
    buf: Box<[u8]>,
    meta: [RecvMeta; RX_BATCH],
    pub(crate) table: Table,
}

/// What the receive path needs of its port: the socket to read, and the
/// addresses and settings the checks use.
pub(crate) struct RxPort<'a> {
    pub(crate) socket: &'a UdpSocket,
    pub(crate) udp: &'a UdpSocketState,
    /// The bound address: destination when the kernel reports none, and the
    /// UDP destination port the ICRC covers.
    pub(crate) local: SocketAddr,
    /// The port's GID (the GRH layout of delivered packets).
    pub(crate) gid: Gid,
    pub(crate) icrc: IcrcPolicy,
    pub(crate) mtu: Mtu,
}

impl Demux {
    /// An empty demultiplexer whose first QP gets `first_qpn` (clamped to a
    /// valid, non-special QPN).
    pub(crate) fn new(first_qpn: Qpn) -> Demux {
        Demux {
            buf: vec![0u8; RX_BATCH * RX_SLOT].into_boxed_slice(),
            meta: [RecvMeta::default(); RX_BATCH],
            table: Table {
                qps: QpnMap::default(),
                next_qpn: first_qpn.clamp(2, crate::fabric::addr::MAX_QPN),
                pool: Vec::new(),
                drops: ProviderDrops::default(),
                rx: RxCounters::default(),
                id_guess: Ipv4IdGuess::default(),
            },
        }
    }

    /// Read datagrams until the socket is empty, `MAX_RECV_CALLS` reads were made,
    /// or QP `me` has `want` arrivals waiting; match each to its QP. `me` is
    /// polling with its registered memory `mem`: its packets are written there
    /// at once (GRH area + payload into the posted receive), the other QPs'
    /// parked in pooled buffers until they poll.
    pub(crate) fn drain(&mut self, port: &RxPort<'_>, me: Qpn, mem: &mut Memory, want: usize) {
        for _ in 0..MAX_RECV_CALLS {
            if self.table.qps.get(&me).is_some_and(|s| s.arrived() >= want) {
                return;
            }
            let Demux { buf, meta, table } = self;
            let mut chunks = buf.chunks_mut(RX_SLOT);
            let mut iovs: [IoSliceMut<'_>; RX_BATCH] =
                std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
            let n = match port.udp.recv(port.socket.into(), &mut iovs, meta) {
                Ok(n) => n,
                // WouldBlock: empty. Anything else (e.g. ICMP errors queued on the
                // socket) is not about a received packet: stop this round.
                Err(_) => return,
            };
            for (i, m) in meta.iter().enumerate().take(n) {
                let start = i * RX_SLOT;
                let data = &buf[start..start + m.len.min(RX_SLOT)];
                let mut dg = Datagram::new(port, m);
                if data.is_empty() {
                    // A zero-length datagram: `chunks` would yield nothing, and
                    // it must still be counted (as a runt).
                    table.accept(port, &mut dg, data, 0, (me, &mut *mem));
                    continue;
                }
                let stride = if m.stride == 0 { data.len() } else { m.stride };
                for (pos, pkt) in data.chunks(stride.max(1)).enumerate() {
                    table.accept(port, &mut dg, pkt, pos, (me, &mut *mem));
                }
            }
        }
    }
}

impl Table {
    /// Add the receive side of a new QP accepting `qkey` and `pkey`, with room for
    /// `depth` receives; returns its QPN, the next one not in use.
    pub(crate) fn add_qp(&mut self, qkey: u32, pkey: u16, depth: usize) -> Qpn {
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) {
            qpn = next_qpn(qpn);
        }
        self.next_qpn = next_qpn(qpn);
        self.qps
            .insert(qpn, RecvQueue::new(QpKeys { pkey, qkey }, depth));
        qpn
    }

    /// The receive checks of IBA 9.6 / 10.2.4 / 11.4.1 in hardware order, then
    /// match to a posted receive. Every drop is counted by cause. `pos` is the
    /// packet's place in its GRO batch `dg` (its likely IPv4 ID); packets for
    /// the polling QP `polling.0` land in its memory `polling.1` at once.
    fn accept(
        &mut self,
        port: &RxPort<'_>,
        dg: &mut Datagram,
        pkt: &[u8],
        pos: usize,
        polling: (Qpn, &mut Memory),
    ) {
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
        let Some(ctx) = dg.icrc else {
            // Source and destination of different IP families.
            self.drops.malformed += 1;
            return;
        };
        // A GRO batch holds at most 64 datagrams, so `pos` fits a u16; 0
        // (tried first anyway) if it somehow did not.
        let likely_id = u16::try_from(pos).unwrap_or(0);
        match codec::verify_icrc_guessing(&ctx, pkt, port.icrc, likely_id, &mut self.id_guess) {
            Ok(IcrcVerdict::Verified { ipv4_id }) if ipv4_id != 0 => {
                self.rx.id_solved += 1;
                self.rx.id_at_position += u64::from(ipv4_id == likely_id);
            }
            Ok(_) => {}
            Err(_) => {
                self.rx.bad_icrc += 1;
                self.drops.bad_icrc += 1;
                return;
            }
        }
        let mtu = port.mtu.bytes();
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
        // The key checks every provider shares; unknown QPN belongs to the port.
        let slot = match accept(keys, self.qps.get_mut(&h.dest_qp)) {
            Ok(slot) => slot,
            Err(KeyDrop::UnknownQpn) => {
                self.drops.count(KeyDrop::UnknownQpn);
                return;
            }
            Err(_) => return,
        };
        let byte_len = GRH_LEN + decoded.payload.len();
        let grh = dg.grh_area(port, pkt.len());
        // The GRH area and payload of a receive buffer (`b` is `byte_len` long).
        let write = |b: &mut [u8]| {
            b[..GRH_LEN].copy_from_slice(grh);
            b[GRH_LEN..byte_len].copy_from_slice(decoded.payload);
        };
        let (me, mem) = polling;
        if slot.stamping() {
            // Taken from the UDP socket just now (StampClock::HostMonotonic).
            slot.set_arrival_time(std::time::Instant::now());
        }
        let placed = if h.dest_qp == me {
            slot.arrive_into(mem, byte_len, h.imm, h.src_qp, write)
        } else {
            let pool = &mut self.pool;
            slot.arrive(byte_len, h.imm, h.src_qp, false, || {
                let mut b = pool
                    .pop()
                    .unwrap_or_else(|| vec![0u8; GRH_LEN + mtu].into_boxed_slice());
                write(&mut b[..byte_len]);
                b
            })
        };
        if placed == Some(WcStatus::Success) {
            self.rx.delivered += 1;
        }
    }
}

/// What the packets of one datagram (one GRO batch) share, worked out once:
/// the ICRC's IP/UDP context and the GRH area, which differs between its
/// packets only by length — all equal but the last.
struct Datagram {
    /// `None` when source and destination are of different IP families.
    icrc: Option<IcrcContext>,
    grh: Grh,
    /// The GRH area as written for packets of `area_for` bytes (0: not yet).
    area: [u8; GRH_LEN],
    area_for: usize,
}

impl Datagram {
    fn new(port: &RxPort<'_>, m: &RecvMeta) -> Datagram {
        let dst_ip = m.dst_ip.unwrap_or(port.local.ip());
        let icrc = match (m.addr.ip(), dst_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Some(IpPair::V4 { src, dst }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Some(IpPair::V6 { src, dst }),
            _ => None,
        }
        .map(|ip| IcrcContext {
            ip,
            src_port: m.addr.port(),
            dst_port: port.local.port(),
        });
        let grh = Grh {
            sgid: Gid::from(m.addr.ip()),
            dgid: Gid::from(dst_ip),
            // Only the ECN bits are observable (IP_RECVTOS via quinn-udp reports
            // ECN); DSCP is not, so it reads as 0.
            traffic_class: m.ecn.map_or(0, |e| e as u8),
            // Never reaches a UDP socket (and kernel rxe sends 0 anyway).
            flow_label: 0,
            hop_limit: ASSUMED_HOP_LIMIT,
            ip_payload_len: 0,
        };
        Datagram {
            icrc,
            grh,
            area: [0; GRH_LEN],
            area_for: 0,
        }
    }

    /// The 40-byte GRH area of a packet of `pkt_len` bytes (the UDP payload).
    fn grh_area(&mut self, port: &RxPort<'_>, pkt_len: usize) -> &[u8; GRH_LEN] {
        if self.area_for != pkt_len {
            self.grh.ip_payload_len = u16::try_from(8 + pkt_len).unwrap_or(u16::MAX);
            self.grh.write(&mut self.area, GrhLayout::for_gid(port.gid));
            self.area_for = pkt_len;
        }
        &self.area
    }
}

fn next_qpn(q: Qpn) -> Qpn {
    if q >= crate::fabric::addr::MAX_QPN {
        2
    } else {
        q + 1
    }
}
