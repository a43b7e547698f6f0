//! UD peer addresses and their lossless mapping to `SocketAddr` for quinn.

use std::net::{SocketAddr, SocketAddrV6};

use super::{FabricError, Gid};

/// The UDP destination port of RoCEv2 (IANA "roce", RoCEv2 Annex A17.4.5.2).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Q_Keys with the top bit set are privileged (IBA 10.2.4): only the kernel may use them.
pub(crate) const QKEY_PRIVILEGED_BIT: u32 = 0x8000_0000;

/// The Q_Key quic-rdma uses unless configured otherwise (non-privileged).
pub const DEFAULT_QKEY: u32 = 0x1101_1101;

/// A queue pair number: 24 bits on the wire (BTH DestQP, DETH SrcQP).
pub type Qpn = u32;

/// The largest valid QPN (24 bits).
pub const MAX_QPN: Qpn = 0x00FF_FFFF;

/// Check a Q_Key is usable by an application.
pub fn check_qkey(qkey: u32) -> Result<u32, FabricError> {
    if qkey & QKEY_PRIVILEGED_BIT != 0 {
        Err(FabricError::PrivilegedQkey(qkey))
    } else {
        Ok(qkey)
    }
}

/// The address of a UD queue pair: where a send work request goes.
///
/// ## Mapping to `SocketAddr`
/// quinn speaks `SocketAddr`, so a UD address maps losslessly to
/// `SocketAddrV6 { ip: gid, port: 4791, flowinfo: qkey, scope_id: qpn }`.
/// The port is always the RoCEv2 port (quinn-proto refuses port 0), so the
/// mapping is stable per peer and a change of any component is a path change,
/// exactly what QUIC connection migration expects.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct UdAddr {
    /// The port's GID.
    pub gid: Gid,
    /// The destination queue pair number (24 bits).
    pub qpn: Qpn,
    /// The destination Q_Key.
    pub qkey: u32,
}

impl UdAddr {
    /// Build an address; the QPN must fit 24 bits.
    pub fn new(gid: Gid, qpn: Qpn, qkey: u32) -> Self {
        debug_assert!(qpn <= MAX_QPN);
        UdAddr { gid, qpn, qkey }
    }

    /// The `SocketAddr` quinn sees for this peer.
    pub fn to_socket_addr(self) -> SocketAddr {
        SocketAddr::V6(SocketAddrV6::new(
            self.gid.to_ipv6(),
            ROCEV2_UDP_PORT,
            self.qkey,
            self.qpn,
        ))
    }

    /// The inverse of [`UdAddr::to_socket_addr`].
    ///
    /// Fails for IPv4 socket addresses, a port other than 4791, or a QPN above 24 bits:
    /// those did not come from a UD address.
    pub fn from_socket_addr(addr: SocketAddr) -> Result<Self, FabricError> {
        match addr {
            SocketAddr::V6(v6) if v6.port() == ROCEV2_UDP_PORT && v6.scope_id() <= MAX_QPN => {
                Ok(UdAddr {
                    gid: Gid::from(*v6.ip()),
                    qpn: v6.scope_id(),
                    qkey: v6.flowinfo(),
                })
            }
            other => Err(FabricError::NotAUdAddress(other)),
        }
    }
}

impl From<UdAddr> for SocketAddr {
    fn from(a: UdAddr) -> SocketAddr {
        a.to_socket_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn socket_addr_round_trip(gid in any::<[u8; 16]>(), qpn in 0..=MAX_QPN, qkey in any::<u32>()) {
            let a = UdAddr::new(Gid(gid), qpn, qkey);
            prop_assert_eq!(UdAddr::from_socket_addr(a.to_socket_addr()).unwrap(), a);
        }
    }

    #[test]
    fn rejects_foreign_addresses() {
        assert!(UdAddr::from_socket_addr("127.0.0.1:4791".parse().unwrap()).is_err());
        assert!(UdAddr::from_socket_addr("[::1]:443".parse().unwrap()).is_err());
    }

    #[test]
    fn privileged_qkey_refused() {
        assert!(check_qkey(0x8000_0001).is_err());
        assert_eq!(check_qkey(DEFAULT_QKEY).unwrap(), DEFAULT_QKEY);
    }
}
