//! Port and queue-pair attributes: what the device actually granted.

use super::{Gid, Qpn};

/// Bytes at the start of every receive buffer reserved for the GRH (IBA 11.4.1.2).
pub const GRH_LEN: usize = 40;

/// The IB MTU enumeration (`ibv_mtu`): 256..4096 bytes of payload per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes (RoCE on 1500-byte Ethernet).
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes (RoCE on jumbo frames; rxe on `lo`).
    M4096,
}

impl Mtu {
    /// Payload bytes.
    pub fn bytes(self) -> usize {
        match self {
            Mtu::M256 => 256,
            Mtu::M512 => 512,
            Mtu::M1024 => 1024,
            Mtu::M2048 => 2048,
            Mtu::M4096 => 4096,
        }
    }

    /// The IB MTU for a byte count, if it is one of the five.
    pub fn from_bytes(n: usize) -> Option<Mtu> {
        Some(match n {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return None,
        })
    }

    /// The largest IB MTU whose RoCEv2 packet fits an Ethernet/IP MTU of `netdev_mtu`
    /// (what rxe reports as active MTU: IP + UDP + BTH + DETH + ImmDt + ICRC overhead).
    pub fn for_netdev(netdev_mtu: usize) -> Option<Mtu> {
        // IPv6 (40) + UDP (8) + BTH (12) + DETH (8) + ImmDt (4) + ICRC (4).
        const OVERHEAD: usize = 76;
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512, Mtu::M256]
            .into_iter()
            .find(|m| m.bytes() + OVERHEAD <= netdev_mtu)
    }
}

/// What a UD queue pair was granted, read back from the provider.
#[derive(Clone, Debug)]
pub struct QpAttr {
    /// Our queue pair number.
    pub qpn: Qpn,
    /// The Q_Key the QP accepts.
    pub qkey: u32,
    /// The P_Key of the QP's partition.
    pub pkey: u16,
    /// The port's GID used as source GID.
    pub gid: Gid,
    /// The port's active MTU.
    pub active_mtu: Mtu,
    /// Largest inline send the QP granted (`max_inline_data` after create).
    pub max_inline: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_mtu_mapping_matches_rxe() {
        assert_eq!(Mtu::for_netdev(1500), Some(Mtu::M1024));
        assert_eq!(Mtu::for_netdev(9000), Some(Mtu::M4096));
        assert_eq!(Mtu::for_netdev(65536), Some(Mtu::M4096));
    }
}
