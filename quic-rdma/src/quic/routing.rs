//! The routing-key convention on the wire, QUIC side (docs/architecture.md,
//! "Addressing"): what a sender puts in the immediate data and flow label, and
//! what a receiver makes of the immediate data it finds.
//!
//! The socket below knows nothing of QUIC: it carries whatever immediate value
//! its caller gives and hands up whatever arrived. The drivers (quinn adapter,
//! engine) use this module on both paths:
//! - send: the destination CID's routing key ([`cid::key_of_datagram`]) goes in
//!   the immediate data and the flow label;
//! - receive: a SEND **without** immediate data is legal IBA and is accepted (an
//!   independent RoCEv2 peer need not know our convention; the key, if anyone
//!   needs it, comes from the DCID); a SEND **with** immediate data that does
//!   not match its packet's CID is dropped when the check is on — it was not
//!   built by a sender following the convention, or was altered on the way.

use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::cid;
use crate::socket::{SocketError, UdSocket};

/// The immediate value to send with `datagram` (its destination CID's routing key).
pub fn imm_for(datagram: &[u8]) -> Option<u32> {
    cid::key_of_datagram(datagram)
}

/// Send a QUIC datagram (GSO-style when `segment_size` is set) the way both
/// drivers do: every segment a SEND with immediate carrying the routing key of
/// the destination CID (segments of one transmit share it, RFC 9000 §12.2).
pub fn send<Q: UdQueuePair>(
    socket: &mut UdSocket<Q>,
    dest: UdAddr,
    ecn: u8,
    datagram: &[u8],
    segment_size: Option<usize>,
) -> Result<(), SocketError> {
    socket.send_with_imm(dest, ecn, imm_for(datagram), datagram, segment_size)
}

/// What the receive path does with the immediate data of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingCheck {
    /// Drop datagrams whose immediate data is present and does not match the
    /// routing key of their destination CID.
    pub enabled: bool,
}

impl Default for RoutingCheck {
    fn default() -> Self {
        RoutingCheck { enabled: true }
    }
}

/// Counters of the routing check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutingStats {
    /// Datagrams that arrived as plain SENDs (no immediate data): accepted.
    pub without_imm: u64,
    /// Datagrams dropped because their immediate data did not match their CID.
    pub imm_mismatch: u64,
}

impl RoutingCheck {
    /// Whether to hand `data` (which arrived with immediate `imm`) to QUIC;
    /// counts what it decides in `stats`.
    pub fn accept(&self, imm: Option<u32>, data: &[u8], stats: &mut RoutingStats) -> bool {
        let Some(imm) = imm else {
            stats.without_imm += 1;
            return true;
        };
        if !self.enabled || cid::key_of_datagram(data) == Some(imm) {
            return true;
        }
        stats.imm_mismatch += 1;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short-header datagram whose DCID starts 11 22 33: routing key 0x11223.
    const D: [u8; 24] = [
        0x40, 0x11, 0x22, 0x33, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
        22, 23,
    ];

    #[test]
    fn plain_sends_are_accepted_and_mismatches_dropped() {
        let mut s = RoutingStats::default();
        let on = RoutingCheck::default();
        assert!(on.accept(Some(0x11223), &D, &mut s));
        assert!(on.accept(None, &D, &mut s), "a plain SEND is legal IBA");
        assert!(!on.accept(Some(0x12345), &D, &mut s));
        assert!(!on.accept(Some(0), &[], &mut s), "no CID to match");
        assert_eq!((s.without_imm, s.imm_mismatch), (1, 2));
        let off = RoutingCheck { enabled: false };
        assert!(off.accept(Some(0x12345), &D, &mut s));
        assert_eq!(s.imm_mismatch, 2);
    }

    #[test]
    fn the_sender_puts_the_destination_key() {
        assert_eq!(imm_for(&D), Some(0x11223));
        assert_eq!(imm_for(&[]), None);
    }
}
