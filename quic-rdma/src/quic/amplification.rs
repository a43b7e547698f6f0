//! What a peer whose address is not validated may be sent (RFC 9000 §8.1),
//! and what proves its address: one account per unvalidated peer, kept by
//! the peer table ([`super::peers`]) for the endpoints' own sends and by the
//! gateway (`qr gateway`) for what it forwards to its clients.
//!
//! quinn-proto enforces the 3× anti-amplification limit itself, but starts a
//! datagram while any budget is left and fills it to the MTU
//! (quinn-rs/quinn#1082): a 1 200-byte Initial got one 4 096-byte datagram
//! back. The peer table therefore keeps its own account per unvalidated peer
//! and posts only whole datagrams that fit it, on two counts:
//! - QUIC payload bytes at most 3× those received (what RFC 9000 counts);
//! - bytes on the wire at most 3× those received, each datagram charged
//!   [`WIRE_OVERHEAD`] more: its RoCEv2 headers. Several small datagrams in
//!   answer to one large one must not multiply the headers.
//!
//! A datagram sent is charged as its payload padded to 4 bytes (the BTH pad
//! count, IBTA 9.2) plus the 4 bytes of immediate data our sends carry, and a
//! datagram received is credited with its payload only (its sender may pad
//! less and carry no immediate data). Both limits together then hold the ratio
//! for any further per-datagram overhead between 0 and [`WIRE_OVERHEAD`], so
//! at every layer from QUIC to Ethernet. A datagram that does not fit is
//! dropped, counted, and is a lost packet to QUIC.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use crate::quic::cid;

/// Header bytes a RoCEv2 UD datagram carries besides its payload, at most:
/// Ethernet header and FCS (18), IPv6 (40), UDP (8), BTH (12), DETH (8), ICRC (4).
pub(crate) const WIRE_OVERHEAD: u64 = 18 + 40 + 8 + 12 + 8 + 4;

/// The amplification factor RFC 9000 §8.1 allows before an address is validated.
const FACTOR: u64 = 3;

/// What a datagram of `len` payload bytes we send adds beyond the headers
/// [`WIRE_OVERHEAD`] counts: the pad to 4 bytes and the immediate data.
fn sent_cost(len: u64) -> u64 {
    len.next_multiple_of(4) + 4
}

/// Keyed hash of connection IDs: a table remembers what it sent as 8 bytes, and
/// an attacker cannot pick a CID that collides with it.
#[derive(Debug, Default)]
pub struct CidKey(RandomState);

impl CidKey {
    fn hash(&self, cid: &[u8]) -> u64 {
        self.0.hash_one(cid)
    }
}

/// The account of one peer whose address is not validated.
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    /// QUIC payload bytes received from the peer.
    heard: u64,
    /// Datagrams received from the peer.
    heard_datagrams: u64,
    /// Initial packets among them (each may have opened a connection).
    initials: u64,
    /// Bytes sent to the peer, as [`sent_cost`] charges them.
    sent: u64,
    /// Datagrams sent to the peer.
    sent_datagrams: u64,
    /// Bytes QUIC asked to send, the dropped ones included.
    asked: u64,
    /// Keyed hash of the last connection ID this endpoint chose and sent to the
    /// peer (the source CID of a long header: an Initial, Handshake or Retry).
    issued: Option<u64>,
}

impl Budget {
    /// Account for `datagram`, just received from the peer.
    pub fn heard(&mut self, datagram: &[u8]) {
        self.heard += datagram.len() as u64;
        self.heard_datagrams += 1;
        // Version 0 is Version Negotiation, which has no type.
        if matches!(cid::long_header(datagram), Some((v, 0)) if v != 0) {
            self.initials += 1;
        }
    }

    /// Whether `datagram` proves the peer's address: it is addressed to a
    /// connection ID this endpoint chose and sent only to that address, and
    /// only a peer that received it can know it (RFC 9000 §8.1; the CID must
    /// carry 64 bits of entropy besides the `predictable_bits` its issuer
    /// derives from something else: [`cid::ROUTING_KEY_BITS`] for ours,
    /// [`cid::DEFAULT_CID_LEN`]; 0 for a server whose CIDs are random). Long
    /// headers only: a client's second flight, or its Initial after a Retry.
    pub fn proves_address(&self, datagram: &[u8], key: &CidKey, predictable_bits: u32) -> bool {
        match (self.issued, cid::long_header_cids(datagram)) {
            (Some(issued), Some((dcid, _))) => {
                dcid.len() * 8 >= 64 + predictable_bits as usize && key.hash(dcid) == issued
            }
            _ => false,
        }
    }

    /// Remember the connection ID `packet` (about to be sent) names as ours.
    pub fn issue(&mut self, packet: &[u8], key: &CidKey) {
        if let Some((_, scid)) = cid::long_header_cids(packet) {
            if !scid.is_empty() {
                self.issued = Some(key.hash(scid));
            }
        }
    }

    /// Account for a transmit QUIC asks to send: `len` bytes in datagrams of
    /// `segment` bytes (the last may be shorter). Returns how many bytes of it
    /// may go: whole datagrams, in order, while both limits hold.
    pub fn allow(&mut self, len: usize, segment: Option<usize>) -> usize {
        self.asked += len as u64;
        let segment = segment.unwrap_or(len).max(1);
        let mut allowed = 0;
        while allowed < len {
            let d = segment.min(len - allowed);
            let (sent, datagrams) = (self.sent + sent_cost(d as u64), self.sent_datagrams + 1);
            let on_wire = sent + datagrams * WIRE_OVERHEAD;
            let heard_on_wire = self.heard + self.heard_datagrams * WIRE_OVERHEAD;
            if sent > FACTOR * self.heard || on_wire > FACTOR * heard_on_wire {
                break;
            }
            (self.sent, self.sent_datagrams) = (sent, datagrams);
            allowed += d;
        }
        allowed
    }

    /// Whether QUIC has asked for more than its own limit lets it send to an
    /// address it has not validated, so it has validated the address itself
    /// (path validation, RFC 9000 §8.2 and §9.3, which the table cannot see).
    ///
    /// quinn-proto sends at most 3× what a connection received plus one
    /// datagram (`mtu`) per connection; each Initial may open one, and a path
    /// change one more. Stateless answers (Version Negotiation, Retry, a
    /// stateless reset, a refusal) are each smaller than the datagram that
    /// caused them, so they add at most what was heard.
    pub fn validated_by_quic(&self, mtu: usize) -> bool {
        self.asked > (FACTOR + 1) * self.heard + (self.initials + 1) * mtu as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long header with the given DCID and SCID.
    fn long(first: u8, dcid: &[u8], scid: &[u8]) -> Vec<u8> {
        let mut p = vec![first, 0, 0, 0, 1, dcid.len() as u8];
        p.extend_from_slice(dcid);
        p.push(scid.len() as u8);
        p.extend_from_slice(scid);
        p.resize(1200, 0);
        p
    }

    #[test]
    fn sends_whole_datagrams_within_three_times_the_bytes_heard() {
        let mut b = Budget::default();
        b.heard(&long(0xC0, &[1; 8], &[2; 8]));
        // One 1 200-byte Initial: 3 600 bytes, not the 4 096 quinn would send.
        assert_eq!(b.allow(4096, None), 0);
        assert_eq!(b.allow(1500, None), 1500);
        // A batch of 1 000-byte datagrams: two more fit (each charged 1 004).
        assert_eq!(b.allow(3000, Some(1000)), 2000);
        // 88 bytes of payload budget are left, but not a fourth set of headers.
        assert_eq!(b.allow(1, None), 0);
        assert_eq!((b.sent, b.sent_datagrams), (1504 + 2 * 1004, 3));
    }

    #[test]
    fn small_datagrams_cannot_multiply_the_headers() {
        let mut b = Budget::default();
        b.heard(&[0x40; 1200]);
        // 3 600 payload bytes in 100-byte datagrams would put 36 sets of
        // headers on the wire for one.
        let allowed = b.allow(3600, Some(100));
        let wire = allowed as u64 + (allowed as u64 / 100) * WIRE_OVERHEAD;
        assert!(wire <= 3 * (1200 + WIRE_OVERHEAD), "{wire}");
        assert!(allowed >= 1500, "{allowed}");
    }

    #[test]
    fn only_a_connection_id_we_sent_proves_the_address() {
        const R: u32 = cid::ROUTING_KEY_BITS;
        let key = CidKey::default();
        let ours = [7u8; 12];
        let mut b = Budget::default();
        assert!(
            !b.proves_address(&long(0xC0, &ours, &[]), &key, R),
            "nothing sent yet"
        );
        b.issue(&long(0xC0, &[1; 12], &ours), &key);
        assert!(b.proves_address(&long(0xE0, &ours, &[3; 8]), &key, R));
        assert!(!b.proves_address(&long(0xE0, &[8; 12], &[3; 8]), &key, R));
        assert!(
            !b.proves_address(&[0x40; 40], &key, R),
            "short headers do not count"
        );
        // CIDs too short to carry 64 random bits prove nothing (RFC 9000 §8.1).
        let mut short = Budget::default();
        short.issue(&long(0xC0, &[1; 8], &[9; 8]), &key);
        assert!(!short.proves_address(&long(0xE0, &[9; 8], &[]), &key, R));
        // ... unless all 64 of them are random (a foreign server's).
        assert!(short.proves_address(&long(0xE0, &[9; 8], &[]), &key, 0));
    }

    #[test]
    fn asking_past_quics_own_limit_means_quic_validated_the_path() {
        let mut b = Budget::default();
        b.heard(&long(0xC0, &[1; 8], &[2; 8]));
        assert!(!b.validated_by_quic(4096));
        b.allow(4096, None);
        assert!(!b.validated_by_quic(4096), "one overshooting datagram");
        b.allow(4 * 4096, Some(4096));
        assert!(b.validated_by_quic(4096));
    }

    #[test]
    fn truncated_headers_are_not_parsed() {
        let key = CidKey::default();
        let mut b = Budget::default();
        b.issue(&[0xC0, 0, 0, 0, 1, 20, 1, 2], &key);
        assert_eq!(b.issued, None);
        b.heard(&[0xC0, 0, 0]);
        assert_eq!((b.heard, b.initials), (3, 0));
    }
}
