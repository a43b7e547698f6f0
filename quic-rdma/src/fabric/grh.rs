//! The 40-byte GRH area at the start of every UD receive buffer.
//!
//! IBA 11.4.1.2 and RoCEv2 Annex A17.4.5.1 (and rdma-core's `ibv_wc`/GRH handling):
//! - RoCEv2 over IPv6: the whole 40 bytes are the IPv6 header.
//! - RoCEv2 over IPv4: bytes 0..20 are undefined, the IPv4 header is in bytes 20..40.
//!
//! The receiver learns the sender's GID and the ECN bits (RFC 3168) from it.
//! This module is pure (no I/O) so it can be fuzzed and shared by every provider.

use std::net::Ipv4Addr;

use super::Gid;

/// Bytes of the GRH area.
pub(crate) const GRH_LEN: usize = super::port::GRH_LEN;

/// IP protocol number of UDP, which carries RoCEv2.
const IPPROTO_UDP: u8 = 17;

/// The fields of a GRH that a receiver uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    /// Source GID (IPv4-mapped for the IPv4 layout).
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
    /// Traffic class / TOS: DSCP in the top 6 bits, ECN in the low 2.
    pub traffic_class: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// IPv6 payload length / IPv4 total length minus the IPv4 header.
    pub ip_payload_len: u16,
}

/// Which header the GRH area holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrhLayout {
    /// IPv6 header in bytes 0..40.
    Ipv6,
    /// IPv4 header in bytes 20..40.
    Ipv4,
}

impl GrhLayout {
    /// The layout of packets arriving at a port with GID `local` (an IPv4-mapped
    /// GID receives RoCEv2 over IPv4), as rdma-core decides from the GID type.
    pub fn for_gid(local: Gid) -> Self {
        if local.is_ipv4() {
            GrhLayout::Ipv4
        } else {
            GrhLayout::Ipv6
        }
    }
}

/// Why a GRH area did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrhError {
    /// Fewer than 40 bytes.
    #[error("GRH area shorter than 40 bytes")]
    Truncated,
    /// The IP version nibble does not match the layout.
    #[error("IP version {0} does not match the GRH layout")]
    BadVersion(u8),
    /// The IPv4 header length is not 20 bytes (options cannot fit the GRH area).
    #[error("IPv4 header length {0} is not 20")]
    BadIhl(u8),
    /// The next header is not UDP.
    #[error("next header {0} is not UDP")]
    NotUdp(u8),
}

impl Grh {
    /// The ECN codepoint (low two bits of the traffic class).
    pub fn ecn(&self) -> u8 {
        self.traffic_class & 0b11
    }

    /// Parse the GRH area of a receive buffer.
    pub fn parse(area: &[u8], layout: GrhLayout) -> Result<Grh, GrhError> {
        let area: &[u8; GRH_LEN] = area
            .get(..GRH_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(GrhError::Truncated)?;
        match layout {
            GrhLayout::Ipv6 => {
                let version = area[0] >> 4;
                if version != 6 {
                    return Err(GrhError::BadVersion(version));
                }
                if area[6] != IPPROTO_UDP {
                    return Err(GrhError::NotUdp(area[6]));
                }
                let w = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&area[8..24]);
                d.copy_from_slice(&area[24..40]);
                Ok(Grh {
                    traffic_class: ((w >> 20) & 0xFF) as u8,
                    flow_label: w & 0xF_FFFF,
                    ip_payload_len: u16::from_be_bytes([area[4], area[5]]),
                    hop_limit: area[7],
                    sgid: Gid(s),
                    dgid: Gid(d),
                })
            }
            GrhLayout::Ipv4 => {
                let h = &area[20..40];
                let version = h[0] >> 4;
                if version != 4 {
                    return Err(GrhError::BadVersion(version));
                }
                let ihl = h[0] & 0xF;
                if ihl != 5 {
                    return Err(GrhError::BadIhl(ihl));
                }
                if h[9] != IPPROTO_UDP {
                    return Err(GrhError::NotUdp(h[9]));
                }
                let total = u16::from_be_bytes([h[2], h[3]]);
                Ok(Grh {
                    traffic_class: h[1],
                    flow_label: 0,
                    ip_payload_len: total.saturating_sub(20),
                    hop_limit: h[8],
                    sgid: Gid::from(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
                    dgid: Gid::from(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
                })
            }
        }
    }

    /// Write this GRH into a 40-byte area in `layout`. For IPv4 the undefined
    /// bytes 0..20 are zeroed, the IP ID is 0 and the header checksum is valid.
    /// Panics only if `area` is shorter than 40 bytes (a caller bug, not input).
    pub fn write(&self, area: &mut [u8], layout: GrhLayout) {
        let area = &mut area[..GRH_LEN];
        match layout {
            GrhLayout::Ipv6 => {
                let w = (6u32 << 28)
                    | (u32::from(self.traffic_class) << 20)
                    | (self.flow_label & 0xF_FFFF);
                area[0..4].copy_from_slice(&w.to_be_bytes());
                area[4..6].copy_from_slice(&self.ip_payload_len.to_be_bytes());
                area[6] = IPPROTO_UDP;
                area[7] = self.hop_limit;
                area[8..24].copy_from_slice(&self.sgid.0);
                area[24..40].copy_from_slice(&self.dgid.0);
            }
            GrhLayout::Ipv4 => {
                area[..20].fill(0);
                let src = self.sgid.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED);
                let dst = self.dgid.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED);
                let h = &mut area[20..40];
                h[0] = 0x45;
                h[1] = self.traffic_class;
                h[2..4].copy_from_slice(&self.ip_payload_len.saturating_add(20).to_be_bytes());
                h[4..6].fill(0); // IP ID
                h[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
                h[8] = self.hop_limit;
                h[9] = IPPROTO_UDP;
                h[10..12].fill(0);
                h[12..16].copy_from_slice(&src.octets());
                h[16..20].copy_from_slice(&dst.octets());
                let csum = ipv4_checksum(h);
                h[10..12].copy_from_slice(&csum.to_be_bytes());
            }
        }
    }
}

/// The RFC 791 header checksum of a 20-byte IPv4 header (checksum field as given).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_grh(ipv4: bool) -> impl Strategy<Value = Grh> {
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            0u32..=0xF_FFFF,
            any::<u8>(),
            0u16..=(u16::MAX - 20),
        )
            .prop_map(move |(s6, d6, s4, d4, tc, fl, hl, len)| {
                if ipv4 {
                    Grh {
                        sgid: Ipv4Addr::from(s4).into(),
                        dgid: Ipv4Addr::from(d4).into(),
                        traffic_class: tc,
                        flow_label: 0,
                        hop_limit: hl,
                        ip_payload_len: len,
                    }
                } else {
                    Grh {
                        sgid: Gid(s6),
                        dgid: Gid(d6),
                        traffic_class: tc,
                        flow_label: fl,
                        hop_limit: hl,
                        ip_payload_len: len,
                    }
                }
            })
    }

    proptest! {
        #[test]
        fn ipv6_round_trip(g in arb_grh(false)) {
            let mut a = [0u8; 40];
            g.write(&mut a, GrhLayout::Ipv6);
            prop_assert_eq!(Grh::parse(&a, GrhLayout::Ipv6).unwrap(), g);
        }

        #[test]
        fn ipv4_round_trip(g in arb_grh(true), junk in any::<[u8; 20]>()) {
            let mut a = [0u8; 40];
            g.write(&mut a, GrhLayout::Ipv4);
            // Bytes 0..20 are undefined for IPv4: whatever is there must not matter.
            a[..20].copy_from_slice(&junk);
            prop_assert_eq!(Grh::parse(&a, GrhLayout::Ipv4).unwrap(), g);
            prop_assert_eq!(ipv4_checksum(&a[20..40]), 0);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Grh::parse(&bytes, GrhLayout::Ipv6);
            let _ = Grh::parse(&bytes, GrhLayout::Ipv4);
        }
    }

    #[test]
    fn ipv4_known_header() {
        // 127.0.0.1 -> 127.0.0.2, TOS 0x02 (ECT(0)), TTL 64, UDP length 1092;
        // checksum 0x3890 computed independently (Python, RFC 1071 sum).
        let g = Grh {
            sgid: Ipv4Addr::new(127, 0, 0, 1).into(),
            dgid: Ipv4Addr::new(127, 0, 0, 2).into(),
            traffic_class: 2,
            flow_label: 0,
            hop_limit: 64,
            ip_payload_len: 1092,
        };
        let mut a = [0xAAu8; 40];
        g.write(&mut a, GrhLayout::Ipv4);
        assert_eq!(
            &a[20..40],
            &[
                0x45, 0x02, 0x04, 0x58, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x38, 0x90, 127, 0, 0,
                1, 127, 0, 0, 2
            ]
        );
        assert_eq!(Grh::parse(&a, GrhLayout::Ipv4).unwrap().ecn(), 2);
    }

    #[test]
    fn rejects_wrong_version_and_protocol() {
        let mut a = [0u8; 40];
        assert_eq!(
            Grh::parse(&a, GrhLayout::Ipv6),
            Err(GrhError::BadVersion(0))
        );
        a[0] = 0x60;
        assert_eq!(Grh::parse(&a, GrhLayout::Ipv6), Err(GrhError::NotUdp(0)));
        assert_eq!(
            Grh::parse(&a[..39], GrhLayout::Ipv6),
            Err(GrhError::Truncated)
        );
    }
}
