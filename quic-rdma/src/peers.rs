//! The peer table: UD addresses ↔ the `SocketAddr`s quinn and quinn-proto see,
//! shared by the engine and the quinn adapter.
//!
//! [`UdAddr::to_socket_addr`] keeps the QPN in `scope_id` and the Q_Key in
//! `flowinfo`, but quinn-proto's Retry tokens carry only IP and port and are
//! checked with `token_address != remote_address`, so with that mapping every
//! Retry token fails (INVALID_TOKEN). Both drivers therefore show quinn-proto a
//! synthetic address per peer — the GID with a port unique to the (GID, QPN,
//! Q_Key) triple, flowinfo and scope 0 — which survives the token's encoding,
//! is stable per peer (so a peer that moves is still a path change) and maps
//! back through this table. Lookups hash; nothing allocates once a peer is known.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV6};

use crate::fabric::UdAddr;

/// Bidirectional map of known peers. Ports 1..=65535 are handed out in turn;
/// after 65535 distinct peers the oldest port is reused (its peer, if still
/// talking, looks like a new path).
#[derive(Debug, Default)]
pub(crate) struct PeerTable {
    by_ud: HashMap<UdAddr, u16>,
    by_port: Vec<Option<UdAddr>>,
    next: u16,
    /// Peers the application named itself by their lossless address
    /// ([`UdAddr::to_socket_addr`]): they keep that address, so a client that
    /// connects to it sees replies from it. Only servers validate Retry tokens,
    /// and a server learns its peers from packets, i.e. by synthetic address.
    adopted: HashMap<SocketAddr, UdAddr>,
    adopted_by_ud: HashMap<UdAddr, SocketAddr>,
}

impl PeerTable {
    /// The address quinn-proto sees for `ud` (registering it on first sight).
    pub(crate) fn proto_addr(&mut self, ud: UdAddr) -> SocketAddr {
        if let Some(a) = self.adopted_by_ud.get(&ud) {
            return *a;
        }
        let port = match self.by_ud.get(&ud) {
            Some(p) => *p,
            None => self.register(ud),
        };
        SocketAddr::V6(SocketAddrV6::new(ud.gid.to_ipv6(), port, 0, 0))
    }

    /// The UD address behind an address quinn-proto gave us.
    pub(crate) fn ud_addr(&self, a: SocketAddr) -> Option<UdAddr> {
        if let Some(ud) = self.adopted.get(&a) {
            return Some(*ud);
        }
        let ud = (*self.by_port.get(usize::from(a.port()).checked_sub(1)?)?)?;
        (a.ip() == std::net::IpAddr::V6(ud.gid.to_ipv6())).then_some(ud)
    }

    /// Resolve an address the application gave: a known one, or a lossless
    /// [`UdAddr::to_socket_addr`] form, adopted as this peer's address from now on.
    pub(crate) fn resolve(&mut self, a: SocketAddr) -> Option<UdAddr> {
        if let Some(ud) = self.ud_addr(a) {
            return Some(ud);
        }
        let ud = UdAddr::from_socket_addr(a).ok()?;
        if !self.by_ud.contains_key(&ud) {
            self.adopted.insert(a, ud);
            self.adopted_by_ud.insert(ud, a);
        }
        Some(ud)
    }

    fn register(&mut self, ud: UdAddr) -> u16 {
        if self.by_port.is_empty() {
            self.by_port.resize(usize::from(u16::MAX), None);
        }
        self.next = self.next.checked_add(1).unwrap_or(1);
        let port = self.next;
        if let Some(old) = self.by_port[usize::from(port) - 1].replace(ud) {
            self.by_ud.remove(&old);
        }
        self.by_ud.insert(ud, port);
        port
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Gid;

    #[test]
    fn round_trips_and_is_stable() {
        let mut t = PeerTable::default();
        let g = Gid::from("fd00::7".parse::<std::net::Ipv6Addr>().unwrap());
        let a = UdAddr::new(g, 0x11, 5);
        let b = UdAddr::new(g, 0x12, 5);
        let (sa, sb) = (t.proto_addr(a), t.proto_addr(b));
        assert_ne!(sa, sb, "same GID, different QPN: different addresses");
        assert_eq!(t.proto_addr(a), sa);
        assert_eq!(t.ud_addr(sa), Some(a));
        assert_eq!(t.ud_addr(sb), Some(b));
        if let SocketAddr::V6(v6) = sa {
            assert_eq!((v6.flowinfo(), v6.scope_id()), (0, 0));
        }
        assert_eq!(t.ud_addr("[fd00::8]:1".parse().unwrap()), None);
    }

    #[test]
    fn lossless_addresses_named_by_the_application_are_kept() {
        let mut t = PeerTable::default();
        let g = Gid::from("fd00::9".parse::<std::net::Ipv6Addr>().unwrap());
        let a = UdAddr::new(g, 0x21, 5);
        let given = a.to_socket_addr();
        assert_eq!(t.resolve(given), Some(a));
        assert_eq!(
            t.proto_addr(a),
            given,
            "replies come from the address dialled"
        );
        assert_eq!(
            t.resolve("[fd00::9]:443".parse().unwrap()),
            None,
            "not the RoCEv2 port: not a UD address"
        );
    }
}
