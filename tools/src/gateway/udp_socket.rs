//! The gateway's UDP sockets: buffers sized for many clients, and the
//! datagrams the kernel dropped before the gateway could read them.
//!
//! A UDP socket's receive buffer defaults to `net.core.rmem_default`
//! (208 KiB on most systems): with tens of clients sending at once, bursts
//! overflow it and the kernel drops datagrams nobody counts (13 % of them with
//! 50 clients in one measured run). The gateway asks for [`RECV_BUFFER`] (with
//! `SO_RCVBUFFORCE` where it has `CAP_NET_ADMIN`, else `SO_RCVBUF`, which the
//! kernel caps at `net.core.rmem_max`), logs what it got when that is less,
//! and reads the socket's drop counter — the one `SO_RXQ_OVFL` reports,
//! `sk_drops` — from `/proc/self/net/udp{,6}` (the last column, matched by
//! the socket's inode), so `qr_gateway_udp_kernel_drops_total` makes "what
//! clients sent = what the gateway read + what the kernel dropped" checkable.
//!
//! Every gateway UDP socket sends with "don't fragment" ([`dont_fragment`]):
//! RFC 9000 §14 forbids QUIC to rely on IP fragmentation, and many networks
//! drop fragments. A datagram above the interface MTU then fails with
//! `EMSGSIZE` and is counted (`drop_udp_too_big`): QUIC's path MTU discovery
//! sees a lost probe and settles below ([`forward`]).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::net::sockopt::{self as so, Ipv4PathMtuDiscovery, Ipv6PathMtuDiscovery};
use tokio::net::UdpSocket;

use super::GatewayStats;

use nix::sys::socket::{getsockopt, setsockopt, sockopt};

/// The receive buffer the listening socket asks for.
pub const RECV_BUFFER: usize = 8 << 20;

/// The send buffer the gateway's sockets ask for.
pub const SEND_BUFFER: usize = 4 << 20;

/// Size `sock`'s buffers: at least `recv` and `send` bytes asked for; the
/// receive size the kernel granted is returned (Linux reports double the
/// request, its bookkeeping included).
pub fn size_buffers(sock: &impl AsFd, recv: usize, send: usize) -> io::Result<usize> {
    let fd = sock.as_fd();
    if setsockopt(&fd, sockopt::RcvBufForce, &recv).is_err() {
        setsockopt(&fd, sockopt::RcvBuf, &recv).map_err(io::Error::from)?;
    }
    if setsockopt(&fd, sockopt::SndBufForce, &send).is_err() {
        setsockopt(&fd, sockopt::SndBuf, &send).map_err(io::Error::from)?;
    }
    let got = getsockopt(&fd, sockopt::RcvBuf).map_err(io::Error::from)?;
    if got < recv {
        tracing::warn!(
            asked = recv,
            got,
            "gateway: the UDP receive buffer is smaller than asked; bursts may be dropped by the \
             kernel (counted in qr_gateway_udp_kernel_drops_total): raise net.core.rmem_max \
             (sysctl -w net.core.rmem_max={recv}) or give the gateway CAP_NET_ADMIN"
        );
    }
    Ok(got)
}

/// Send with "don't fragment" on `sock`, as quinn does on its own UDP sockets (`IP_PMTUDISC_PROBE`, `IPV6_PMTUDISC_PROBE`): the DF
/// bit set, datagrams up to the interface MTU, the kernel's path-MTU cache
/// ignored — the QUIC endpoints discover the path MTU themselves, end to end
/// (RFC 8899 §3); a larger datagram fails with `EMSGSIZE`.
pub fn dont_fragment(sock: &impl AsFd) -> io::Result<()> {
    let fd = sock.as_fd();
    // The option to set follows the socket's own address family.
    if rustix::net::getsockname(fd)?.address_family() == rustix::net::AddressFamily::INET {
        so::set_ip_mtu_discover(fd, Ipv4PathMtuDiscovery::PROBE)?;
    } else {
        so::set_ipv6_mtu_discover(fd, Ipv6PathMtuDiscovery::PROBE)?;
        // IPv4-mapped destinations of a dual-stack socket take the IPv4
        // option; a v6-only socket refuses it, harmlessly.
        let _ = so::set_ip_mtu_discover(fd, Ipv4PathMtuDiscovery::PROBE);
    }
    Ok(())
}

/// Send one forwarded `datagram` on `udp` (to `to`, or to the peer it is
/// connected to) and count it: sent (`udp_tx`), larger than the UDP path
/// carries (`drop_udp_too_big`: `EMSGSIZE` under [`dont_fragment`]) or
/// failed otherwise (`drop_udp_send`).
pub async fn forward(
    udp: &UdpSocket,
    to: Option<SocketAddr>,
    datagram: &[u8],
    stats: &GatewayStats,
) {
    let sent = match to {
        Some(to) => udp.send_to(datagram, to).await,
        None => udp.send(datagram).await,
    };
    match sent {
        Ok(_) => {
            stats.udp_tx.inc();
            stats.udp_tx_bytes.add(datagram.len() as u64);
        }
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MSGSIZE.raw_os_error()) => {
            stats.drop_udp_too_big.inc();
            too_big_hint(datagram);
        }
        Err(e) => {
            tracing::debug!(%e, ?to, "gateway: UDP send failed");
            stats.drop_udp_send.inc();
        }
    }
}

/// Path MTU probes above the UDP path are expected to be lost (they are
/// short-header packets); a handshake (long-header) datagram that is too big
/// means the far endpoint assumed the fabric's MTU for a UDP peer, and no
/// handshake can finish: say so once, with the fix.
fn too_big_hint(datagram: &[u8]) {
    static SAID: AtomicBool = AtomicBool::new(false);
    let long_header = datagram.first().is_some_and(|b| b & 0x80 != 0);
    if long_header && !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            target: "qr::gateway",
            bytes = datagram.len(),
            "gateway: a {}-byte handshake datagram is larger than the UDP path carries \
             (dropped, counted in qr_gateway_drop_udp_too_big_total): the endpoint on \
             the fabric must start this gateway's clients at 1200 bytes; for qr serve \
             give it --udp-gateway with this gateway's --fabric-ip",
            datagram.len()
        );
    }
}

/// The socket's inode (`/proc/self/fd/N` → `socket:[INODE]`).
pub fn inode(sock: &impl std::os::fd::AsRawFd) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", sock.as_raw_fd())).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Datagrams the kernel dropped on the UDP socket with `inode` (its receive
/// buffer full, or a checksum error), from `/proc/self/net/udp` and `udp6`.
pub fn kernel_drops(inode: u64) -> Option<u64> {
    ["/proc/self/net/udp", "/proc/self/net/udp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|table| drops_in(&table, inode))
}

/// The `drops` column of the row of `inode` in a `/proc/net/udp` table
/// (columns: sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref
/// pointer drops).
fn drops_in(table: &str, inode: u64) -> Option<u64> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(9)?.parse::<u64>().ok()? == inode).then(|| f.last()?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_column() {
        let t = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                 1: 0100007F:1F90 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n";
        assert_eq!(drops_in(t, 4242), Some(17));
        assert_eq!(drops_in(t, 1), None);
    }

    #[test]
    fn a_real_socket_is_found_and_sized() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let ino = inode(&s).expect("a socket inode");
        assert_eq!(kernel_drops(ino), Some(0));
        let got = size_buffers(&s, 1 << 20, 1 << 20).unwrap();
        assert!(got > 0);
    }

    #[test]
    fn dont_fragment_follows_the_socket_family() {
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        dont_fragment(&v4).unwrap();
        assert_eq!(
            so::ip_mtu_discover(&v4).unwrap(),
            Ipv4PathMtuDiscovery::PROBE
        );
        // A host without IPv6 cannot bind ::1; the IPv4 case above still ran.
        if let Ok(v6) = std::net::UdpSocket::bind("[::1]:0") {
            dont_fragment(&v6).unwrap();
            assert_eq!(
                so::ipv6_mtu_discover(&v6).unwrap(),
                Ipv6PathMtuDiscovery::PROBE
            );
        }
    }
}
