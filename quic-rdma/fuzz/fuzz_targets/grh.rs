//! Fuzz the GRH-area parser (`Grh::parse`) in both layouts with arbitrary bytes.
//!
//! Invariants, besides "no panic":
//! - fewer than 40 bytes is `Truncated`, whatever the layout;
//! - an error names the byte it objects to (version nibble, IHL, next header);
//! - IPv6 (IBA 11.4.1.2): what parses writes back to the very same 40 bytes;
//! - IPv4 (RoCEv2 Annex A17.4.5.1): bytes 0..20 do not matter, and what parses
//!   writes back to a header with the same TOS, length, TTL and addresses, a
//!   valid checksum, and that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma::fabric::{ipv4_checksum, Grh, GrhError, GrhLayout, GRH_LEN};

fuzz_target!(|data: &[u8]| {
    for layout in [GrhLayout::Ipv6, GrhLayout::Ipv4] {
        let parsed = Grh::parse(data, layout);
        if data.len() < GRH_LEN {
            assert_eq!(parsed, Err(GrhError::Truncated));
            continue;
        }
        // The IP header's first byte: 0 for IPv6, 20 for IPv4.
        let ip = if layout == GrhLayout::Ipv6 { 0 } else { 20 };
        let g = match parsed {
            Err(GrhError::Truncated) => panic!("40 bytes reported truncated"),
            Err(GrhError::BadVersion(v)) => {
                assert_eq!(v, data[ip] >> 4);
                assert_ne!(v, if ip == 0 { 6 } else { 4 });
                continue;
            }
            Err(GrhError::BadIhl(ihl)) => {
                assert_eq!(layout, GrhLayout::Ipv4);
                assert_eq!((data[20] >> 4, data[20] & 0xF), (4, ihl));
                assert_ne!(ihl, 5);
                continue;
            }
            Err(GrhError::NotUdp(p)) => {
                assert_eq!(p, data[if ip == 0 { 6 } else { 29 }]);
                assert_ne!(p, 17);
                continue;
            }
            Err(e) => panic!("unexpected error {e:?}"),
            Ok(g) => g,
        };
        assert_eq!(g.ecn(), g.traffic_class & 3);
        let mut out = [0u8; GRH_LEN];
        g.write(&mut out, layout);
        assert_eq!(Grh::parse(&out, layout), Ok(g), "written GRH parses back");
        match layout {
            GrhLayout::Ipv6 => assert_eq!(&out[..], &data[..GRH_LEN]),
            GrhLayout::Ipv4 => {
                let (h, o) = (&data[20..40], &out[20..40]);
                assert_eq!(o[..2], h[..2], "version/IHL and TOS");
                let total = u16::from_be_bytes([h[2], h[3]]);
                assert_eq!(u16::from_be_bytes([o[2], o[3]]), total.max(20));
                assert_eq!(o[8..10], h[8..10], "TTL and protocol");
                assert_eq!(o[12..20], h[12..20], "addresses");
                assert_eq!(ipv4_checksum(o), 0);
                // The undefined first 20 bytes cannot change the result.
                let mut other = [0u8; GRH_LEN];
                other[20..].copy_from_slice(h);
                assert_eq!(Grh::parse(&other, layout), Ok(g));
            }
        }
    }
});
