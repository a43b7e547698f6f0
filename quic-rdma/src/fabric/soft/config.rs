//! Configuration of a `soft` port.

use std::net::{IpAddr, SocketAddr};

use super::codec::IcrcPolicy;
#[cfg(doc)]
use crate::fabric::{soft::SoftPort, ProviderDrops};
use crate::fabric::{Mtu, Qpn, DEFAULT_PKEY, ROCEV2_UDP_PORT};

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
    /// Active MTU reported in `QpAttr::active_mtu` and enforced on send and
    /// receive. [`SoftConfig::new`] takes it from the netdev holding the bound
    /// IP as kernel rxe does ([`netdev::roce_mtu_of`](super::netdev::roce_mtu_of):
    /// 1024 on 1500-byte Ethernet, 4096 on jumbo frames and `lo`); assign it
    /// to override (tests, or a path narrower than the local link).
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
    /// Defaults for a port bound to `ip` on UDP port 4791: the RoCE MTU of
    /// `ip`'s netdev (4096 if no local interface holds `ip`: opening the port
    /// fails then anyway), ICRC checked with IPv4-ID solving, P_Key 0xFFFF.
    pub fn new(ip: IpAddr) -> Self {
        SoftConfig {
            bind: SocketAddr::new(ip, ROCEV2_UDP_PORT),
            peer_port: ROCEV2_UDP_PORT,
            mtu: super::netdev::roce_mtu_of(ip).unwrap_or(Mtu::M4096),
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
