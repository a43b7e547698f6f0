//! Global identifiers (GIDs): the 128-bit port addresses of RoCEv2.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit RoCEv2 GID.
///
/// RoCEv2 GIDs are IPv6 addresses; a port addressed over IPv4 has an
/// IPv4-mapped GID (`::ffff:a.b.c.d`), as in the kernel's GID table
/// (IBTA RoCEv2 Annex A17.4.5.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (unassigned table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The GID as an IPv6 address.
    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address if this GID is IPv4-mapped (RoCEv2 over IPv4).
    pub fn to_ipv4_mapped(self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// Whether this GID addresses an IPv4 port.
    pub fn is_ipv4(self) -> bool {
        self.to_ipv4_mapped().is_some()
    }

    /// The IP address this GID stands for: IPv4 for mapped GIDs, IPv6 otherwise.
    pub fn to_ip(self) -> IpAddr {
        match self.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(self.to_ipv6()),
        }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Self {
        Gid(a.octets())
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(a: Ipv4Addr) -> Self {
        Gid(a.to_ipv6_mapped().octets())
    }
}

impl From<IpAddr> for Gid {
    fn from(a: IpAddr) -> Self {
        match a {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_round_trip() {
        let g = Gid::from(Ipv4Addr::new(127, 0, 0, 2));
        assert!(g.is_ipv4());
        assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(g.to_string(), "::ffff:127.0.0.2");
    }

    #[test]
    fn ipv6_is_not_mapped() {
        let g = Gid::from("fe80::1".parse::<Ipv6Addr>().unwrap());
        assert!(!g.is_ipv4());
        assert_eq!(g.to_ip(), "fe80::1".parse::<IpAddr>().unwrap());
    }
}
