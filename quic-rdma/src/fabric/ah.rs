//! Address handles: the destination half of a UD send (IBA 10.2.2, `ibv_ah_attr`).

use super::Gid;

/// What an address handle is built from; also the key of the socket's AH cache
/// (docs/architecture.md §3: GID, flow label, traffic class, hop limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (the GRH's DGID).
    pub dgid: Gid,
    /// 20-bit IPv6 flow label; over RoCEv2/IPv4, NICs turn it into the UDP source port
    /// for ECMP entropy.
    pub flow_label: u32,
    /// Traffic class (DSCP + ECN) of the GRH / IP header.
    pub traffic_class: u8,
    /// Hop limit (IPv6) / TTL (IPv4).
    pub hop_limit: u8,
}

impl AhAttr {
    /// Attributes for `dgid` with quic-rdma's defaults (ECT(0) set so the fabric can
    /// mark congestion, hop limit 64).
    pub fn new(dgid: Gid, flow_label: u32) -> Self {
        AhAttr {
            dgid,
            flow_label: flow_label & 0xF_FFFF,
            traffic_class: 0b10, // ECT(0), RFC 3168
            hop_limit: 64,
        }
    }
}

/// A provider's handle to a created address handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AhId(pub u32);
