//! A `soft` port: the UDP socket its QPs share, its counters, and the state the
//! QPs reach through it. Receive matching is in `demux.rs`; QPs (and
//! [`SoftPort::create_qp`]) in `qp.rs`, which depends on this file, not the
//! other way round.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use quinn_udp::UdpSocketState;

use super::config::SoftConfig;
use super::demux::{Demux, RxPort};
use super::kernel_drops::KernelDrops;
#[cfg(doc)]
use crate::fabric::ProviderDrops;
use crate::fabric::{check_pkey, FabricError, Gid, Memory, Mtu, Qpn};

/// Counters of a `soft` port beyond [`ProviderDrops`] (shared by all its QPs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Packets that failed [`codec::decode`](super::codec::decode) (in `ProviderDrops::malformed`).
    pub rx_decode_errors: u64,
    /// Packets whose ICRC did not match (in `ProviderDrops::bad_icrc`).
    pub rx_bad_icrc: u64,
    /// Packets larger than the active MTU (in `ProviderDrops::malformed`).
    pub rx_oversize: u64,
    /// Packets whose ICRC matched only with a non-zero IPv4 ID (kernel rxe
    /// senders; packets of a `soft` sender's GSO batch after its first).
    pub rx_ipv4_id_solved: u64,
    /// Of those, packets whose ID was their position in the GRO batch (a
    /// `soft` sender's GSO batch arriving whole): checked with one
    /// multiplication instead of solved.
    pub rx_ipv4_id_at_position: u64,
    /// Packets placed in a receive buffer.
    pub rx_delivered: u64,
}

impl crate::counters::Counters for SoftStats {
    fn visit(&self, f: &mut dyn FnMut(crate::counters::Metric)) {
        crate::visit_fields!(f, self, None;
            tx_packets: Counter, Count, "RoCE packets handed to the UDP socket";
            tx_bytes: Counter, Bytes, "UDP payload bytes handed to the socket";
            tx_gso_batches: Counter, Count, "sendmsg calls carrying a GSO batch";
            tx_would_block: Counter, Count, "Sends lost because the socket buffer stayed full";
            tx_errors: Counter, Count, "Sends the kernel refused";
            rx_datagrams: Counter, Count, "UDP datagrams read";
            rx_decode_errors: Counter, Count, "Packets that did not decode as RoCEv2 UD";
            rx_bad_icrc: Counter, Count, "Packets whose ICRC did not verify";
            rx_oversize: Counter, Count, "Packets above the active MTU";
            rx_ipv4_id_solved: Counter, Count, "Packets whose ICRC matched only with a non-zero IPv4 ID";
            rx_ipv4_id_at_position: Counter, Count, "Of those, packets whose IPv4 ID was their batch position";
            rx_delivered: Counter, Count, "Packets placed in a receive buffer";
        );
    }
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
        let demux = Demux::new(cfg.first_qpn);
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
            rx_ipv4_id_at_position: rx.id_at_position,
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

impl Shared {
    /// Lock the demultiplexer; a panic elsewhere must not wedge the port, and the
    /// state stays consistent between statements, so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Demux> {
        self.demux.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The UDP port to send to at `ip`: its override, else the configured one.
    pub(crate) fn peer_port(&self, ip: IpAddr) -> u16 {
        self.peer_ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ip)
            .copied()
            .unwrap_or(self.cfg.peer_port)
    }

    /// Read datagrams until the socket is empty, a bounded number of reads were
    /// made, or QP `me` has `want` arrivals waiting; match each to its QP (`me`'s
    /// straight into its registered memory `mem`).
    pub(crate) fn drain(&self, d: &mut Demux, me: Qpn, mem: &mut Memory, want: usize) {
        let port = RxPort {
            socket: &self.socket,
            udp: &self.udp,
            local: self.local,
            gid: self.gid,
            icrc: self.cfg.icrc,
            mtu: self.cfg.mtu,
        };
        d.drain(&port, me, mem, want);
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
