//! The engine's peer table: UD addresses ↔ the `SocketAddr`s quinn-proto sees.
//!
//! [`UdAddr::to_socket_addr`] keeps the QPN in `scope_id` and the Q_Key in
//! `flowinfo`, but quinn-proto's Retry tokens carry only IP and port and are
//! checked with `token_address != remote_address`, so with that mapping every
//! Retry token fails (INVALID_TOKEN). The engine therefore shows quinn-proto a
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
pub(super) struct PeerTable {
    by_ud: HashMap<UdAddr, u16>,
    by_port: Vec<Option<UdAddr>>,
    next: u16,
}

impl PeerTable {
    /// The address quinn-proto sees for `ud` (registering it on first sight).
    pub(super) fn proto_addr(&mut self, ud: UdAddr) -> SocketAddr {
        let port = match self.by_ud.get(&ud) {
            Some(p) => *p,
            None => self.register(ud),
        };
        SocketAddr::V6(SocketAddrV6::new(ud.gid.to_ipv6(), port, 0, 0))
    }

    /// The UD address behind an address quinn-proto gave us.
    pub(super) fn ud_addr(&self, a: SocketAddr) -> Option<UdAddr> {
        let ud = (*self.by_port.get(usize::from(a.port()).checked_sub(1)?)?)?;
        (a.ip() == std::net::IpAddr::V6(ud.gid.to_ipv6())).then_some(ud)
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
}
