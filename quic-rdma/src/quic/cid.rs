//! Connection IDs that carry a 20-bit routing key (docs/architecture.md §3).
//!
//! The key is the top 20 bits of every CID an endpoint issues. The sender of a
//! datagram reads the key of the *destination* CID and puts it both in the
//! address handle's flow label (ECMP entropy; the UDP source port on RoCEv2/IPv4
//! NICs) and in the 32-bit immediate data — the flow label never reaches the
//! receiver over IPv4, and kernel rxe sends it as 0 even over IPv6. The receiver
//! can demultiplex on the immediate data before parsing QUIC, and checks it
//! against the packet's CID.

use std::time::Duration;

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rand::RngCore;

/// Bits of the routing key.
pub const ROUTING_KEY_BITS: u32 = 20;
/// Mask of a routing key.
pub const ROUTING_KEY_MASK: u32 = (1 << ROUTING_KEY_BITS) - 1;
/// The longest CID QUIC v1 allows (RFC 9000 §17.2).
pub(crate) const MAX_CID_LEN: usize = 20;
/// Default length of the CIDs quic-rdma issues: 12 bytes, so 76 bits are
/// random after the routing key. RFC 9000 §8.1 lets an endpoint take a peer's
/// use of a CID it chose as proof of the peer's address only when the CID has
/// at least 64 bits of entropy; the peer table (`quic/peers.rs`) relies on
/// that.
pub const DEFAULT_CID_LEN: usize = 12;

/// A fresh random routing key: what an endpoint should use unless it routes
/// by key itself (e.g. one key per core). A constant shared by every endpoint
/// would make every endpoint's CIDs share 20 bits (RFC 9000 §5.1: CIDs must
/// not be linkable beyond the issuer's routing needs).
pub(crate) fn random_routing_key() -> u32 {
    rand::random::<u32>() & ROUTING_KEY_MASK
}

/// The routing key in the first 20 bits of `cid` (0 for CIDs shorter than 3 bytes).
pub fn key_of_cid(cid: &[u8]) -> u32 {
    match cid {
        [a, b, c, ..] => u32::from(*a) << 12 | u32::from(*b) << 4 | u32::from(*c) >> 4,
        _ => 0,
    }
}

/// A long-header packet's version and its two type bits (RFC 9000 §17.2), or
/// `None` for a short header or a datagram too short to tell. The one place
/// the drivers classify packets before QUIC parses them.
pub(crate) fn long_header(d: &[u8]) -> Option<(u32, u8)> {
    match d {
        [first, v0, v1, v2, v3, ..] if first & 0x80 != 0 => Some((
            u32::from_be_bytes([*v0, *v1, *v2, *v3]),
            (first >> 4) & 0b11,
        )),
        _ => None,
    }
}

/// The destination and source CIDs of a long-header packet (RFC 9000 §17.2:
/// first byte, Version, DCID length and DCID, SCID length and SCID), or `None`
/// for a short header or a datagram too short to hold what it claims.
pub(crate) fn long_header_cids(d: &[u8]) -> Option<(&[u8], &[u8])> {
    if d.first()? & 0x80 == 0 {
        return None;
    }
    let dlen = usize::from(*d.get(5)?);
    let dcid = d.get(6..6 + dlen)?;
    let slen = usize::from(*d.get(6 + dlen)?);
    let scid = d.get(7 + dlen..7 + dlen + slen)?;
    Some((dcid, scid))
}

/// QUIC version 1 (RFC 9000 §15).
pub(crate) const QUIC_V1: u32 = 0x0000_0001;
/// QUIC version 2 (RFC 9369 §3.1), whose Initial packets have type 0b01.
pub(crate) const QUIC_V2: u32 = 0x6b33_43cf;
/// The least a client's Initial datagram carries (RFC 9000 §14.1): the one
/// rule the socket also enforces on the fabric's MTU, so one constant.
pub(crate) const MIN_INITIAL_DATAGRAM: usize = crate::socket::QUIC_MIN_DATAGRAM;

/// Whether `d` can open a connection: a datagram of at least 1 200 bytes
/// (RFC 9000 §14.1) starting with a long header with the fixed bit set
/// (§17.2), a version we know (v1, or v2 of RFC 9369) and the Initial type,
/// a destination CID of 8 to 20 bytes (§7.2) and a source CID of at most 20.
///
/// What a forwarder checks before it keeps any state for a new source: junk,
/// short headers and truncated Initials are not worth a queue pair.
pub fn is_client_initial(d: &[u8]) -> bool {
    if d.len() < MIN_INITIAL_DATAGRAM || d[0] & 0x40 == 0 {
        return false;
    }
    let initial = matches!(
        long_header(d),
        Some((QUIC_V1, 0b00)) | Some((QUIC_V2, 0b01))
    );
    initial
        && matches!(long_header_cids(d),
            Some((dcid, scid)) if (8..=MAX_CID_LEN).contains(&dcid.len()) && scid.len() <= MAX_CID_LEN)
}

/// The routing key of the destination CID of a QUIC datagram, without decrypting.
///
/// RFC 9000 §17.2: a long header (first bit set) has Version (4 bytes), then the
/// DCID length byte and the DCID. §17.3: a short header has the DCID right after
/// the first byte; its length is not on the wire, but the key needs only the first
/// three bytes. All packets coalesced in one datagram share the DCID (§12.2).
/// Returns `None` for a datagram too short to hold the bytes the header claims.
pub fn key_of_datagram(d: &[u8]) -> Option<u32> {
    let first = *d.first()?;
    if first & 0x80 != 0 {
        let len = *d.get(5)? as usize;
        let cid = d.get(6..6 + len)?;
        Some(key_of_cid(cid))
    } else {
        // A short-header packet is at least 1 + DCID + 1-byte PN + 16-byte tag.
        Some(key_of_cid(d.get(1..4)?))
    }
}

/// A quinn-proto `ConnectionIdGenerator` whose CIDs start with a fixed 20-bit key,
/// followed by cryptographically random bits (RFC 9000 §5.1: no linkable data
/// beyond what the issuer's own routing needs).
#[derive(Debug, Clone)]
pub struct RoutingCidGenerator {
    key: u32,
    len: usize,
    lifetime: Option<Duration>,
}

impl RoutingCidGenerator {
    /// CIDs of `len` bytes (4..=20) carrying `key` (masked to 20 bits).
    pub fn new(key: u32, len: usize) -> Self {
        RoutingCidGenerator {
            key: key & ROUTING_KEY_MASK,
            len: len.clamp(4, MAX_CID_LEN),
            lifetime: None,
        }
    }

    /// Retire CIDs after `lifetime`.
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// The routing key.
    pub fn key(&self) -> u32 {
        self.key
    }
}

impl ConnectionIdGenerator for RoutingCidGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut b = [0u8; MAX_CID_LEN];
        rand::thread_rng().fill_bytes(&mut b[..self.len]);
        b[0] = (self.key >> 12) as u8;
        b[1] = (self.key >> 4) as u8;
        b[2] = ((self.key & 0xF) as u8) << 4 | (b[2] & 0x0F);
        ConnectionId::new(&b[..self.len])
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if cid.len() == self.len && key_of_cid(cid) == self.key {
            Ok(())
        } else {
            Err(InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        self.len
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.lifetime
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn generated_cids_carry_the_key(key in 0u32..=ROUTING_KEY_MASK, len in 4usize..=20) {
            let mut g = RoutingCidGenerator::new(key, len);
            let cid = g.generate_cid();
            prop_assert_eq!(cid.len(), len);
            prop_assert_eq!(key_of_cid(&cid), key);
            prop_assert!(g.validate(&cid).is_ok());
            let mut other = cid.to_vec();
            other[0] ^= 0x80;
            prop_assert!(g.validate(&ConnectionId::new(&other)).is_err());
        }

        #[test]
        fn datagram_key_matches_cid(key in 0u32..=ROUTING_KEY_MASK, long in any::<bool>(), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let cid = RoutingCidGenerator::new(key, 8).generate_cid();
            let mut d = Vec::new();
            if long {
                d.extend_from_slice(&[0xC0, 0, 0, 0, 1, cid.len() as u8]);
            } else {
                d.push(0x40);
            }
            d.extend_from_slice(&cid);
            d.extend_from_slice(&tail);
            prop_assert_eq!(key_of_datagram(&d), Some(key));
        }

        #[test]
        fn datagram_parse_never_panics(d in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = key_of_datagram(&d);
        }

        #[test]
        fn initial_check_never_panics(d in proptest::collection::vec(any::<u8>(), 0..1300)) {
            let _ = is_client_initial(&d);
        }
    }

    /// A long header: first byte, version, DCID, SCID, padded to `len`.
    fn long(first: u8, version: u32, dcid: usize, len: usize) -> Vec<u8> {
        let mut d = vec![first];
        d.extend_from_slice(&version.to_be_bytes());
        d.push(dcid as u8);
        d.extend(std::iter::repeat_n(7, dcid));
        d.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8]);
        d.resize(len, 0);
        d
    }

    #[test]
    fn only_full_size_initials_of_known_versions_open_connections() {
        assert!(is_client_initial(&long(0xC3, QUIC_V1, 8, 1200)));
        assert!(is_client_initial(&long(0xD3, QUIC_V2, 20, 1350)));
        for (what, d) in [
            ("1 199 bytes", long(0xC3, QUIC_V1, 8, 1199)),
            ("fixed bit clear", long(0x83, QUIC_V1, 8, 1200)),
            ("v1 Handshake", long(0xE3, QUIC_V1, 8, 1200)),
            ("v2 0-RTT type 0", long(0xC3, QUIC_V2, 8, 1200)),
            ("unknown version", long(0xC3, 0x1a2a_3a4a, 8, 1200)),
            ("version negotiation", long(0xC3, 0, 8, 1200)),
            ("DCID of 7 bytes", long(0xC3, QUIC_V1, 7, 1200)),
            ("DCID of 21 bytes", long(0xC3, QUIC_V1, 21, 1200)),
            ("short header", vec![0x43; 1200]),
            ("junk", vec![0; 1200]),
        ] {
            assert!(!is_client_initial(&d), "{what}");
        }
    }

    #[test]
    fn short_inputs() {
        assert_eq!(key_of_datagram(&[]), None);
        assert_eq!(key_of_datagram(&[0x40, 1]), None);
        // Long header claiming a 20-byte DCID but carrying 2 bytes.
        assert_eq!(key_of_datagram(&[0xC0, 0, 0, 0, 1, 20, 1, 2]), None);
        // Zero-length DCID: key 0.
        assert_eq!(key_of_datagram(&[0xC0, 0, 0, 0, 1, 0]), Some(0));
        assert_eq!(key_of_cid(&[0xAB, 0xCD, 0xEF]), 0xABCDE);
    }
}

#[cfg(test)]
mod random_key_tests {
    use super::*;

    /// Routing keys are per endpoint, not a constant every server or
    /// client shares. Three draws all equal has probability 2^-40.
    #[test]
    fn endpoints_get_their_own_routing_keys() {
        let keys: Vec<u32> = (0..3).map(|_| random_routing_key()).collect();
        assert!(keys.iter().all(|k| k & !ROUTING_KEY_MASK == 0), "{keys:x?}");
        assert!(keys.windows(2).any(|w| w[0] != w[1]), "{keys:x?}");
        let cfgs: Vec<u32> = (0..3)
            .map(|_| crate::engine::EngineConfig::default().routing_key)
            .collect();
        assert!(cfgs.windows(2).any(|w| w[0] != w[1]), "{cfgs:x?}");
    }
}
