//! The network device under a `soft` port, and the RoCE MTU it allows.
//!
//! Kernel rxe reports as active MTU the largest IB MTU (256..4096) whose
//! RoCEv2 packet fits the netdev's MTU (RoCEv2 Annex A17; [`Mtu::for_netdev`]):
//! 1024 on a standard 1500-byte Ethernet, 4096 on jumbo frames or `lo`. A
//! `soft` port takes its MTU the same way, so a packet it sends is never
//! larger than the link (the kernel would fragment it, RFC 9000 §14 forbids
//! relying on that, and an rxe or NIC peer would drop it).

use std::net::IpAddr;

use crate::fabric::Mtu;

/// The name and MTU of the local interface that holds `ip`, if any (read
/// from the interface list and `/sys/class/net/<name>/mtu`).
pub fn netdev_of(ip: IpAddr) -> Option<(String, usize)> {
    let name = if_addrs::get_if_addrs()
        .ok()?
        .into_iter()
        .find(|i| i.ip() == ip)?
        .name;
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((name, mtu))
}

/// The RoCE MTU kernel rxe would run at on the interface that holds `ip`
/// (256 on a link too small for any: the smallest there is); `None` when no
/// local interface holds it or its MTU cannot be read.
pub fn roce_mtu_of(ip: IpAddr) -> Option<Mtu> {
    Some(Mtu::for_netdev(netdev_of(ip)?.1).unwrap_or(Mtu::M256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_allows_4096() {
        // `lo` has an MTU of 65536 on Linux.
        let (name, mtu) = netdev_of("127.0.0.1".parse().unwrap()).expect("lo holds 127.0.0.1");
        assert_eq!(name, "lo");
        assert!(mtu >= 4096 + 76, "{mtu}");
        assert_eq!(roce_mtu_of("127.0.0.1".parse().unwrap()), Some(Mtu::M4096));
        assert_eq!(
            netdev_of("192.0.2.77".parse().unwrap()),
            None,
            "TEST-NET-1: not ours"
        );
    }
}
