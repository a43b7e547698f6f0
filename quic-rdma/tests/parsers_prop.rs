//! Property tests of the parsers of untrusted bytes that have fuzz targets
//! (`fuzz/fuzz_targets/grh.rs`, `cid_key.rs`): the same invariants, so a machine
//! without nightly (CI's fallback) still checks them. Public API only.

use proptest::prelude::*;
use quic_rdma::fabric::{ipv4_checksum, Grh, GrhError, GrhLayout, GRH_LEN};
use quic_rdma::quic::{key_of_cid, key_of_datagram, RoutingCidGenerator, ROUTING_KEY_MASK};
use quinn_proto::ConnectionIdGenerator;

/// The GRH invariants of the fuzz target, for one input in both layouts.
fn check_grh(data: &[u8]) -> Result<(), TestCaseError> {
    for layout in [GrhLayout::Ipv6, GrhLayout::Ipv4] {
        let parsed = Grh::parse(data, layout);
        if data.len() < GRH_LEN {
            prop_assert_eq!(parsed, Err(GrhError::Truncated));
            continue;
        }
        let ip = if layout == GrhLayout::Ipv6 { 0 } else { 20 };
        let g = match parsed {
            Ok(g) => g,
            Err(GrhError::BadVersion(v)) => {
                prop_assert_eq!(v, data[ip] >> 4);
                prop_assert_ne!(v, if ip == 0 { 6 } else { 4 });
                continue;
            }
            Err(GrhError::BadIhl(ihl)) => {
                prop_assert_eq!(layout, GrhLayout::Ipv4);
                prop_assert_eq!((data[20] >> 4, data[20] & 0xF), (4, ihl));
                prop_assert_ne!(ihl, 5);
                continue;
            }
            Err(GrhError::NotUdp(p)) => {
                prop_assert_eq!(p, data[if ip == 0 { 6 } else { 29 }]);
                prop_assert_ne!(p, 17);
                continue;
            }
            Err(e) => return Err(TestCaseError::fail(format!("unexpected {e:?}"))),
        };
        let mut out = [0u8; GRH_LEN];
        g.write(&mut out, layout);
        prop_assert_eq!(Grh::parse(&out, layout), Ok(g));
        if layout == GrhLayout::Ipv6 {
            // Every IPv6 field is kept: the header writes back bit for bit.
            prop_assert_eq!(&out[..], &data[..GRH_LEN]);
        } else {
            let (h, o) = (&data[20..40], &out[20..40]);
            prop_assert_eq!(&o[..2], &h[..2]);
            let total = u16::from_be_bytes([h[2], h[3]]);
            prop_assert_eq!(u16::from_be_bytes([o[2], o[3]]), total.max(20));
            prop_assert_eq!(&o[8..10], &h[8..10]);
            prop_assert_eq!(&o[12..20], &h[12..20]);
            prop_assert_eq!(ipv4_checksum(o), 0);
            let mut other = [0u8; GRH_LEN];
            other[20..].copy_from_slice(h);
            prop_assert_eq!(Grh::parse(&other, layout), Ok(g));
        }
    }
    Ok(())
}

/// Bytes that often look like a GRH: random, with the version nibble, IHL and
/// next-header bytes of either layout set to valid values with probability 3/4,
/// and half the time a length field below 256 (IPv4 totals under 20 included).
fn grh_like() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), 0..64),
        any::<[bool; 5]>(),
    )
        .prop_map(|(mut d, fix)| {
            if d.len() >= GRH_LEN && !(fix[0] && fix[1]) {
                if fix[2] {
                    d[0] = 0x60 | (d[0] & 0xF);
                    d[6] = 17;
                } else {
                    d[20] = 0x45;
                    d[29] = 17;
                }
                if fix[4] {
                    d[4] = 0;
                    d[22] = 0;
                }
                if fix[3] {
                    // One of the checked bytes wrong again.
                    let at = [0, 6, 20, 29][usize::from(d[1] % 4)];
                    d[at] ^= 1 << (d[2] % 8);
                }
            }
            d
        })
}

/// The `key_of_datagram` invariants of the fuzz target for arbitrary bytes.
fn check_key_of_datagram(d: &[u8]) -> Result<(), TestCaseError> {
    let key = key_of_datagram(d);
    if let Some(k) = key {
        prop_assert!(k <= ROUTING_KEY_MASK);
    }
    let need = match d.first() {
        None => usize::MAX,
        Some(b) if b & 0x80 != 0 => d.get(5).map_or(usize::MAX, |&l| 6 + l as usize),
        Some(_) => 4,
    };
    prop_assert_eq!(key.is_some(), d.len() >= need);
    Ok(())
}

proptest! {
    #[test]
    fn grh_parse_invariants(d in grh_like()) {
        check_grh(&d)?;
    }

    #[test]
    fn key_of_arbitrary_datagram(d in proptest::collection::vec(any::<u8>(), 0..48)) {
        check_key_of_datagram(&d)?;
    }

    /// RFC 9000 §17.2/§17.3: a datagram whose DCID came from
    /// `RoutingCidGenerator` yields its key, for either header form, any first
    /// byte, version, CID length (the generator clamps to 4..=20) and tail.
    #[test]
    fn generated_cid_key_round_trips(
        raw_key in any::<u32>(),
        len in 0usize..32,
        first in any::<u8>(),
        long in any::<bool>(),
        version in any::<[u8; 4]>(),
        bit in 0usize..20,
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut gen = RoutingCidGenerator::new(raw_key, len);
        prop_assert_eq!(gen.key(), raw_key & ROUTING_KEY_MASK);
        let cid = gen.generate_cid();
        prop_assert_eq!(cid.len(), len.clamp(4, 20));
        prop_assert!(gen.validate(&cid).is_ok());
        prop_assert_eq!(key_of_cid(&cid), gen.key());
        let mut d = Vec::new();
        if long {
            d.push(first | 0x80);
            d.extend_from_slice(&version);
            d.push(cid.len() as u8);
        } else {
            d.push(first & 0x7F);
        }
        let at = d.len();
        d.extend_from_slice(&cid);
        d.extend_from_slice(&tail);
        check_key_of_datagram(&d)?;
        prop_assert_eq!(key_of_datagram(&d), Some(gen.key()));
        d[at + bit / 8] ^= 0x80 >> (bit % 8);
        prop_assert_eq!(key_of_datagram(&d), Some(gen.key() ^ (1 << (19 - bit))));
    }
}
