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
//!   built by a sender following the convention, or was altered on the way;
//! - receive, on a shard of an [`EngineGroup`](crate::engine::EngineGroup):
//!   a datagram whose key is another shard's landed on the wrong core
//!   ([`RoutingCheck::shard_key`]): counted and dropped before QUIC sees it.

use std::collections::HashSet;

use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::cid;
use crate::socket::{Received, SocketError, TxBuf, TxSendError, UdSocket};

/// The immediate value to send with `datagram` (its destination CID's routing key).
pub(crate) fn imm_for(datagram: &[u8]) -> Option<u32> {
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

/// [`send`] of the first `len` bytes of a lent transmit buffer, without
/// copying them (see [`UdSocket::send_tx_buf`]).
pub(crate) fn send_tx_buf<Q: UdQueuePair>(
    socket: &mut UdSocket<Q>,
    buf: TxBuf,
    dest: UdAddr,
    ecn: u8,
    len: usize,
    segment_size: Option<usize>,
) -> Result<(), TxSendError> {
    let imm = imm_for(socket.tx_bytes(&buf).get(..len).unwrap_or_default());
    socket.send_tx_buf(buf, dest, ecn, imm, len, segment_size)
}

/// What the receive path does with the immediate data of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingCheck {
    /// Drop datagrams whose immediate data is present and does not match the
    /// routing key of their destination CID.
    pub enabled: bool,
    /// On a shard of an engine group: the shard's own routing key. A datagram
    /// whose key (the immediate data, else the destination CID's) is another
    /// is a *wrong-core* arrival: counted in [`RoutingStats::wrong_shard`] and
    /// dropped. Dropped, not forwarded: the shard that owns the connection
    /// answers from its own QPN, which is not the address the peer sent to, so
    /// the peer's QUIC would discard the answer (a client accepts packets only
    /// from its server's address, RFC 9000 §9); and it must not reach this
    /// shard's quinn-proto, which knows no such CID and would answer with a
    /// stateless reset (RFC 9000 §10.3). Initial and 0-RTT packets are exempt:
    /// their DCID is the client's random choice (RFC 9000 §7.2), and the shard
    /// whose QPN the client chose is the one that accepts the connection.
    pub shard_key: Option<u32>,
}

impl Default for RoutingCheck {
    fn default() -> Self {
        RoutingCheck {
            enabled: true,
            shard_key: None,
        }
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
    /// Datagrams dropped because they carried another shard's routing key
    /// (see [`RoutingCheck::shard_key`]): 0 while every peer sends each
    /// connection's packets to the QPN it connected to.
    pub wrong_shard: u64,
}

/// The mismatches are drops (group `drops`, beside the socket's); datagrams
/// without immediate data are accepted, so they are not.
impl crate::counters::Counters for RoutingStats {
    fn visit(&self, f: &mut dyn FnMut(crate::counters::Metric)) {
        crate::visit_fields!(f, self, None;
            without_imm: Counter, Count, "Datagrams that arrived without immediate data (accepted)";
        );
        crate::visit_fields!(f, self, Some("drops");
            imm_mismatch: Counter, Count, "Datagrams whose immediate data did not match their CID";
            wrong_shard: Counter, Count, "Datagrams carrying another shard's routing key";
        );
    }
}

/// Most peers [`RoutingLog`] names; past them, mismatches are only counted.
const MAX_TOLD: usize = 256;

/// What the routing check decided: its counters, and the peers already told
/// in the log why their datagrams are dropped. A sender that puts something
/// else in the immediate data loses every datagram, and its handshake only
/// times out: the first drop from each peer is logged with the reason (at
/// most [`MAX_TOLD`] peers, so a flood cannot grow the set or the log).
#[derive(Debug, Default)]
pub(crate) struct RoutingLog {
    /// The counters.
    pub(crate) stats: RoutingStats,
    told: HashSet<UdAddr>,
}

impl RoutingLog {
    fn mismatch(&mut self, src: UdAddr, imm: u32, data: &[u8]) {
        self.stats.imm_mismatch += 1;
        if self.told.len() >= MAX_TOLD || !self.told.insert(src) {
            return;
        }
        tracing::warn!(
            "dropping datagrams from {src:?}: immediate data {imm:#x} is not the routing key \
             of the destination CID ({:?}); a sender puts that key in the immediate data or \
             sends without immediate data (docs/architecture.md, \"Addressing\"); further drops \
             from this peer are only counted (drops.imm_mismatch){}",
            cid::key_of_datagram(data).map(|k| format!("{k:#x}")),
            if self.told.len() == MAX_TOLD {
                "; no further peers are named"
            } else {
                ""
            }
        );
    }
}

impl RoutingCheck {
    /// Whether to hand the datagram `r` to QUIC; counts what it decides in
    /// `log` (and logs the first mismatch of each peer).
    pub(crate) fn accept(&self, r: &Received<'_>, log: &mut RoutingLog) -> bool {
        let (imm, data) = (r.imm, r.data);
        let stats = &mut log.stats;
        match imm {
            None => stats.without_imm += 1,
            Some(imm) if self.enabled && cid::key_of_datagram(data) != Some(imm) => {
                log.mismatch(r.src, imm, data);
                return false;
            }
            Some(_) => {}
        }
        let Some(own) = self.shard_key else {
            return true;
        };
        // Steer on the immediate data as a receiver would before parsing QUIC;
        // a plain SEND carries its key only in the DCID.
        if opens_connection(data) || imm.or_else(|| cid::key_of_datagram(data)) == Some(own) {
            return true;
        }
        stats.wrong_shard += 1;
        false
    }
}

/// Whether `d` is a QUIC v1 Initial or 0-RTT packet (RFC 9000 §17.2: long
/// header, version 1, type bits 0b00 or 0b01), whose DCID the client chose.
fn opens_connection(d: &[u8]) -> bool {
    matches!(cid::long_header(d), Some((1, 0 | 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `data` with immediate `imm` from peer `n`.
    fn rx(n: u8, imm: Option<u32>, data: &[u8]) -> Received<'_> {
        let gid = crate::fabric::Gid::from(std::net::Ipv4Addr::new(10, 0, 0, n));
        Received {
            src: UdAddr::new(gid, 0x11, 5),
            ecn: 0,
            imm,
            data,
            timestamp: None,
        }
    }

    /// A short-header datagram whose DCID starts 11 22 33: routing key 0x11223.
    const D: [u8; 24] = [
        0x40, 0x11, 0x22, 0x33, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
        22, 23,
    ];

    #[test]
    fn plain_sends_are_accepted_and_mismatches_dropped() {
        let mut s = RoutingLog::default();
        let on = RoutingCheck::default();
        assert!(on.accept(&rx(1, Some(0x11223), &D), &mut s));
        assert!(
            on.accept(&rx(1, None, &D), &mut s),
            "a plain SEND is legal IBA"
        );
        assert!(!on.accept(&rx(1, Some(0x12345), &D), &mut s));
        assert!(!on.accept(&rx(1, Some(0), &[]), &mut s), "no CID to match");
        assert_eq!((s.stats.without_imm, s.stats.imm_mismatch), (1, 2));
        let off = RoutingCheck {
            enabled: false,
            ..RoutingCheck::default()
        };
        assert!(off.accept(&rx(1, Some(0x12345), &D), &mut s));
        assert_eq!(s.stats.imm_mismatch, 2);
        assert_eq!(s.stats.wrong_shard, 0, "no shard key, no shard check");
    }

    #[test]
    fn a_shard_drops_other_shards_keys_but_takes_initials() {
        let mut s = RoutingLog::default();
        let mine = RoutingCheck {
            shard_key: Some(0x11223),
            ..RoutingCheck::default()
        };
        assert!(mine.accept(&rx(1, Some(0x11223), &D), &mut s));
        assert!(mine.accept(&rx(1, None, &D), &mut s), "key from the DCID");
        let other = RoutingCheck {
            shard_key: Some(0x44444),
            ..RoutingCheck::default()
        };
        assert!(!other.accept(&rx(1, Some(0x11223), &D), &mut s));
        assert!(!other.accept(&rx(1, None, &D), &mut s));
        assert_eq!(s.stats.wrong_shard, 2);
        // A v1 Initial (type 0) and 0-RTT (type 1) with the client's random
        // DCID land wherever the client sent them; a Handshake (type 2) does not.
        let long = |ty: u8| {
            let mut d = vec![0xC0 | ty << 4, 0, 0, 0, 1, 8];
            d.extend_from_slice(&D[1..9]);
            d
        };
        assert!(other.accept(&rx(1, Some(0x11223), &long(0)), &mut s));
        assert!(other.accept(&rx(1, Some(0x11223), &long(1)), &mut s));
        assert!(!other.accept(&rx(1, Some(0x11223), &long(2)), &mut s));
        assert_eq!(s.stats.wrong_shard, 3);
        assert!(!opens_connection(&[]));
        assert!(
            !opens_connection(&[0xC0, 0, 0, 0, 0, 0]),
            "version negotiation"
        );
    }

    #[test]
    fn each_peer_is_told_once_and_the_told_set_is_bounded() {
        let mut s = RoutingLog::default();
        let on = RoutingCheck::default();
        for _ in 0..3 {
            assert!(!on.accept(&rx(1, Some(0x12345), &D), &mut s));
        }
        assert_eq!((s.stats.imm_mismatch, s.told.len()), (3, 1));
        for n in 0..=255u8 {
            for k in 0..2u32 {
                let gid = crate::fabric::Gid::from(std::net::Ipv4Addr::new(10, 1, k as u8, n));
                let r = Received {
                    src: UdAddr::new(gid, 0x11, 5),
                    ..rx(0, Some(0x12345), &D)
                };
                assert!(!on.accept(&r, &mut s));
            }
        }
        assert_eq!(s.stats.imm_mismatch, 3 + 512);
        assert_eq!(
            s.told.len(),
            MAX_TOLD,
            "no more peers remembered than named"
        );
    }

    #[test]
    fn the_sender_puts_the_destination_key() {
        assert_eq!(imm_for(&D), Some(0x11223));
        assert_eq!(imm_for(&[]), None);
    }
}
