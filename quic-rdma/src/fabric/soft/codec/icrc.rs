//! The invariant CRC of RoCEv2 (IBA §7.8.1, Annex A17.4.5.3): computed over the
//! masked IP/UDP headers a UDP socket lets the receiver rebuild, and verified under
//! an [`IcrcPolicy`]. Why and how an unknown IPv4 identification is solved: see
//! the [`codec`](super) docs and `ipv4_id.rs`.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::header::{DecodeError, BTH_LEN, HEAD_MAX, ICRC_LEN, IPV4_HEADER_LEN, UDP_HEADER_LEN};
use super::ipv4_id::{solve_ipv4_id, Ipv4IdGuess};

/// IP protocol number of UDP (the IP header's protocol field).
const IPPROTO_UDP: u8 = 17;
/// IPv4 flags/fragment offset assumed on the wire: DF, offset 0 (rxe sets DF).
const IPV4_FLAGS_DF: u16 = 0x4000;

/// The IP and UDP header fields a UDP socket knows about a datagram, from which the
/// ICRC's IP/UDP part is rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcrcContext {
    /// Source and destination IP addresses.
    pub ip: IpPair,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791 for RoCEv2).
    pub dst_port: u16,
}

/// The two addresses of an IP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpPair {
    /// RoCEv2 over IPv4.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
    },
    /// RoCEv2 over IPv6.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// How a receiver checks the ICRC (see the [`codec`](super) docs for why).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IcrcPolicy {
    /// Accept if the ICRC matches for IPv4 ID 0 or for some solved ID (kernel rxe
    /// sends random IDs). IPv6 is checked exactly. The default.
    #[default]
    SolveIpv4Id,
    /// Accept only if the ICRC matches with IPv4 ID 0: full 32-bit strength, but
    /// rejects kernel rxe and other senders with non-zero IDs.
    IdZeroOnly,
    /// Do not check (the QUIC AEAD still authenticates every payload byte).
    Skip,
}

/// What [`verify_icrc`] concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcrcVerdict {
    /// The ICRC matched; for IPv4 with this identification (0 for IPv6).
    Verified {
        /// The IPv4 identification that makes the ICRC match.
        ipv4_id: u16,
    },
    /// Not checked ([`IcrcPolicy::Skip`]).
    Skipped,
}
/// Bytes of `0xFF` that stand for the (absent) InfiniBand LRH at the start of
/// the ICRC input (Annex A17.4.5.3).
const LRH_STANDIN: usize = 8;
/// The longest IP + UDP header the ICRC covers (IPv6).
const IP_UDP_MAX: usize = 40 + UDP_HEADER_LEN;
/// The longest ICRC input before the payload: LRH stand-in, IP + UDP, and
/// BTH + DETH + ImmDt.
const PREFIX_MAX: usize = LRH_STANDIN + IP_UDP_MAX + HEAD_MAX;

/// Write the masked IP + UDP headers that follow the LRH stand-in in the ICRC
/// input into `h` (zeroed, at least 48 bytes); returns how many bytes they take
/// (28 for IPv4, 48 for IPv6). `udp_payload_len` is the length of the whole RoCE
/// packet including the ICRC.
fn masked_ip_udp(ctx: &IcrcContext, ipv4_id: u16, udp_payload_len: usize, h: &mut [u8]) -> usize {
    // Lengths above 16 bits cannot come from a UDP socket; saturate rather than panic.
    let udp_len = u16::try_from(UDP_HEADER_LEN + udp_payload_len).unwrap_or(u16::MAX);
    let ip_len = match ctx.ip {
        IpPair::V4 { src, dst } => {
            let total = u16::try_from(IPV4_HEADER_LEN + UDP_HEADER_LEN + udp_payload_len)
                .unwrap_or(u16::MAX);
            h[0] = 0x45;
            h[1] = 0xFF; // TOS: variant
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[4..6].copy_from_slice(&ipv4_id.to_be_bytes());
            h[6..8].copy_from_slice(&IPV4_FLAGS_DF.to_be_bytes());
            h[8] = 0xFF; // TTL: variant
            h[9] = IPPROTO_UDP;
            h[10] = 0xFF; // header checksum: variant
            h[11] = 0xFF;
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
            IPV4_HEADER_LEN
        }
        IpPair::V6 { src, dst } => {
            // Version 6; traffic class and flow label variant (all ones).
            h[0..4].copy_from_slice(&0x6FFF_FFFFu32.to_be_bytes());
            h[4..6].copy_from_slice(&udp_len.to_be_bytes());
            h[6] = IPPROTO_UDP;
            h[7] = 0xFF; // hop limit: variant
            h[8..24].copy_from_slice(&src.octets());
            h[24..40].copy_from_slice(&dst.octets());
            40
        }
    };
    let u = &mut h[ip_len..ip_len + UDP_HEADER_LEN];
    u[0..2].copy_from_slice(&ctx.src_port.to_be_bytes());
    u[2..4].copy_from_slice(&ctx.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6..8].fill(0xFF); // UDP checksum: variant
    ip_len + UDP_HEADER_LEN
}

/// The CRC-32 state after the ICRC input up to the end of `head`, the first
/// bytes (at most [`HEAD_MAX`]) of a packet body of `body_len` bytes (BTH
/// through pad, no ICRC): the LRH stand-in, the masked IP/UDP headers and
/// `head` with BTH byte 4 masked, built contiguously on the stack so they cost
/// one `update` (the rest of the body is the caller's to feed, in order).
pub(super) fn start(
    ctx: &IcrcContext,
    ipv4_id: u16,
    body_len: usize,
    head: &[u8],
) -> crc32fast::Hasher {
    let mut buf = [0u8; PREFIX_MAX];
    buf[..LRH_STANDIN].fill(0xFF);
    let at = LRH_STANDIN
        + masked_ip_udp(
            ctx,
            ipv4_id,
            body_len + ICRC_LEN,
            &mut buf[LRH_STANDIN..LRH_STANDIN + IP_UDP_MAX],
        );
    let head = &head[..head.len().min(HEAD_MAX)];
    buf[at..at + head.len()].copy_from_slice(head);
    if head.len() >= BTH_LEN {
        buf[at + 4] = 0xFF; // FECN/BECN/resv6: variant
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..at + head.len()]);
    h
}

/// The ICRC of a packet whose bytes *before* the ICRC field are `body` (BTH through
/// pad), as zlib's `crc32` of the masked byte string (IBA §7.8.1, Annex A17.4.5.3).
/// `ipv4_id` is ignored for IPv6.
pub fn icrc(ctx: &IcrcContext, ipv4_id: u16, body: &[u8]) -> u32 {
    let (head, rest) = body.split_at(body.len().min(HEAD_MAX));
    let mut h = start(ctx, ipv4_id, body.len(), head);
    h.update(rest);
    h.finalize()
}

/// Check a packet's ICRC under `policy`. `pkt` is the whole UDP payload.
pub fn verify_icrc(
    ctx: &IcrcContext,
    pkt: &[u8],
    policy: IcrcPolicy,
) -> Result<IcrcVerdict, DecodeError> {
    verify_icrc_guessing(ctx, pkt, policy, 0, &mut Ipv4IdGuess::default())
}

/// [`verify_icrc`], trying IPv4 ID `likely_id` right after ID 0 and before
/// solving: packet *i* of a `soft` sender's GSO batch carries ID *i* (the
/// kernel numbers the segments), and it arrives as packet *i* of a GRO batch,
/// so its position there is the likely ID. `guess` caches per-length work
/// across calls. Accepts exactly what [`verify_icrc`] accepts; only the cost
/// differs (one GF(2) multiplication instead of a solve when the guess holds).
pub fn verify_icrc_guessing(
    ctx: &IcrcContext,
    pkt: &[u8],
    policy: IcrcPolicy,
    likely_id: u16,
    guess: &mut Ipv4IdGuess,
) -> Result<IcrcVerdict, DecodeError> {
    if policy == IcrcPolicy::Skip {
        return Ok(IcrcVerdict::Skipped);
    }
    let Some(body_len) = pkt.len().checked_sub(ICRC_LEN) else {
        return Err(DecodeError::Truncated {
            len: pkt.len(),
            need: ICRC_LEN,
        });
    };
    let (body, tail) = pkt.split_at(body_len);
    let carried = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let with_zero = icrc(ctx, 0, body);
    if with_zero == carried {
        return Ok(IcrcVerdict::Verified { ipv4_id: 0 });
    }
    if let (IpPair::V4 { .. }, IcrcPolicy::SolveIpv4Id) = (ctx.ip, policy) {
        let diff = with_zero ^ carried;
        if likely_id != 0 && guess.matches(likely_id, diff, pkt.len()) {
            return Ok(IcrcVerdict::Verified { ipv4_id: likely_id });
        }
        if let Some(id) = solve_ipv4_id(diff, pkt.len()) {
            return Ok(IcrcVerdict::Verified { ipv4_id: id });
        }
    }
    Err(DecodeError::BadIcrc { carried })
}
