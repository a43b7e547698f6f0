//! RoCEv2 UD packet codec: BTH, DETH, ImmDt, pad and ICRC (pure: no I/O, no allocation).
//!
//! What a RoCEv2 UD SEND looks like inside the UDP payload (IBA Vol. 1 §9.2, §9.3,
//! RoCEv2 Annex A17.4):
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! | OpCode |SE M Pad TVer|   P_Key     |  BTH (12 B), §9.2
//! +--------+--------+--------+--------+
//! |F B resv|        DestQP (24)       |
//! +--------+--------+--------+--------+
//! |A  resv |          PSN (24)        |
//! +--------+--------+--------+--------+
//! |              Q_Key                |  DETH (8 B), §9.3.3
//! +--------+--------+--------+--------+
//! |  resv  |        SrcQP (24)        |
//! +--------+--------+--------+--------+
//! |        ImmDt (0x65 only)          |  §9.3.2 / §9.3.5
//! +--------+--------+--------+--------+
//! | payload ... | pad (PadCnt bytes)  |  payload + pad is a multiple of 4 (§9.2.3)
//! +--------+--------+--------+--------+
//! |        ICRC (LSB first)           |  §7.8.1, Annex A17.4.5.3
//! +--------+--------+--------+--------+
//! ```
//!
//! ## ICRC (IBA §7.8.1; RoCEv2 Annex A17.4.5.3)
//! The invariant CRC is zlib's CRC-32 over: 8 bytes of `0xFF` (they stand for the
//! InfiniBand LRH that RoCE does not have), the IP header, the UDP header, BTH, DETH,
//! ImmDt, payload and pad — with the *variant* fields (which routers may change) set
//! to all ones: IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and
//! hop limit; the UDP checksum; and BTH byte 4 (FECN, BECN, reserved). The result is
//! stored least-significant byte first, exactly as Linux rxe (`rxe_icrc.c`: a native
//! little-endian store of the complemented `crc32_le`) and Wireshark
//! (`packet-infiniband.c`) expect.
//!
//! ## The IPv4 identification problem
//! A plain UDP socket cannot see the sender's IP header, so the receiver rebuilds it
//! (see [`IcrcContext`]): version/IHL, total length (from the datagram length),
//! flags = DF (kernel rxe always sets DF; the `soft` sender sets DF through
//! `IP_PMTUDISC_PROBE`), protocol 17, source and destination addresses. The one
//! field it cannot know is the 16-bit IPv4 **Identification**: Linux gives
//! unconnected DF datagrams ID 0, while kernel rxe sends a hashed/random ID.
//!
//! CRC-32 is affine over GF(2): flipping ID bits changes the CRC by a *linear*
//! function of those 16 bits, shifted by the bytes that follow the ID. So
//! [`verify_icrc`] first tries ID 0 (one CRC pass, the common case between `soft`
//! endpoints) and otherwise solves the 32×16 linear system for the ID
//! ([`solve_ipv4_id`], a few hundred word operations, no second pass over the
//! payload). A packet is accepted iff *some* ID makes the ICRC match. That leaves 16
//! of the 32 check bits for IPv4 with unknown ID — a corrupted packet passes with
//! probability 2⁻¹⁶ — which is acceptable here because every QUIC packet is
//! authenticated by its AEAD anyway; the ICRC is a wire-compatibility and
//! early-drop check, not the integrity guarantee. [`IcrcPolicy::IdZeroOnly`] keeps
//! the full 32 bits for deployments that only talk to `soft` peers, and IPv6 has
//! no unknown fields, so it is always checked at full strength.

use std::net::{Ipv4Addr, Ipv6Addr};

/// BTH opcode of an UD SEND Only (IBA Table 35: transport 011b, op 00100b).
pub const OPCODE_UD_SEND_ONLY: u8 = 0x64;
/// BTH opcode of an UD SEND Only with Immediate (IBA Table 35: 011b, 00101b).
pub const OPCODE_UD_SEND_ONLY_IMM: u8 = 0x65;
/// Base Transport Header length (IBA §9.2).
pub const BTH_LEN: usize = 12;
/// Datagram Extended Transport Header length (IBA §9.3.3).
pub const DETH_LEN: usize = 8;
/// Immediate data length (IBA §9.3.5).
pub const IMMDT_LEN: usize = 4;
/// Invariant CRC length (IBA §7.8.1).
pub const ICRC_LEN: usize = 4;
/// The largest transport overhead of a UD SEND: BTH + DETH + ImmDt + ICRC (plus up
/// to 3 pad bytes, see [`encoded_len`]).
pub const MAX_OVERHEAD: usize = BTH_LEN + DETH_LEN + IMMDT_LEN + ICRC_LEN + 3;
/// The 24-bit QPN / PSN mask.
pub const MASK_24: u32 = 0x00FF_FFFF;

/// The transport header version this codec speaks (IBA §9.2: TVer = 0).
const TVER: u8 = 0;
const UDP_HEADER_LEN: usize = 8;
const IPV4_HEADER_LEN: usize = 20;
const IPPROTO_UDP: u8 = 17;
/// IPv4 flags/fragment offset assumed on the wire: DF, offset 0 (rxe sets DF).
const IPV4_FLAGS_DF: u16 = 0x4000;

/// The header fields of a UD SEND packet (BTH + DETH + ImmDt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdHeader {
    /// Solicited event (BTH.SE).
    pub solicited: bool,
    /// MigReq (BTH.M); meaningless for UD, carried for completeness.
    pub mig_req: bool,
    /// Partition key (BTH.P_Key).
    pub pkey: u16,
    /// Forward ECN (BTH.FECN); variant, excluded from the ICRC.
    pub fecn: bool,
    /// Backward ECN (BTH.BECN); variant, excluded from the ICRC.
    pub becn: bool,
    /// Destination QP, 24 bits (BTH.DestQP).
    pub dest_qp: u32,
    /// AckReq (BTH.A); ignored by UD receivers.
    pub ack_req: bool,
    /// Packet sequence number, 24 bits (BTH.PSN).
    pub psn: u32,
    /// Q_Key (DETH.Q_Key).
    pub qkey: u32,
    /// Source QP, 24 bits (DETH.SrcQP).
    pub src_qp: u32,
    /// Immediate data: present iff the opcode is SEND_ONLY_WITH_IMMEDIATE.
    pub imm: Option<u32>,
}

impl UdHeader {
    /// The BTH opcode for this header.
    pub fn opcode(&self) -> u8 {
        if self.imm.is_some() {
            OPCODE_UD_SEND_ONLY_IMM
        } else {
            OPCODE_UD_SEND_ONLY
        }
    }

    /// Bytes of headers before the payload (BTH + DETH + ImmDt when present).
    pub fn header_len(&self) -> usize {
        BTH_LEN + DETH_LEN + if self.imm.is_some() { IMMDT_LEN } else { 0 }
    }
}

/// A decoded packet: the headers and a borrowed payload (pad excluded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// BTH/DETH/ImmDt fields.
    pub header: UdHeader,
    /// The payload, without pad bytes.
    pub payload: &'a [u8],
    /// The ICRC as carried on the wire.
    pub icrc: u32,
}

/// Why a packet did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Shorter than the headers and ICRC its opcode requires.
    #[error("truncated packet ({len} bytes, need {need})")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes the opcode requires at least.
        need: usize,
    },
    /// Not a UD SEND Only (with or without immediate).
    #[error("opcode {0:#04x} is not UD SEND_ONLY(_WITH_IMMEDIATE)")]
    WrongOpcode(u8),
    /// Transport header version other than 0.
    #[error("unsupported transport header version {0}")]
    BadTver(u8),
    /// Payload + pad is not a multiple of 4, or PadCnt exceeds it.
    #[error("bad pad: PadCnt {pad_cnt} with {padded_len} bytes of payload+pad")]
    BadPad {
        /// BTH.PadCnt.
        pad_cnt: u8,
        /// Payload + pad bytes present.
        padded_len: usize,
    },
    /// The ICRC did not match (for IPv4: for any IP identification, when solving).
    #[error("bad ICRC (carried {carried:#010x})")]
    BadIcrc {
        /// The ICRC carried in the packet.
        carried: u32,
    },
}

/// Why a packet could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is smaller than [`encoded_len`].
    #[error("output buffer of {have} bytes, need {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A 24-bit field (QPN, PSN) had bits above bit 23.
    #[error("24-bit field out of range: {0:#x}")]
    FieldRange(u32),
}

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

/// How a receiver checks the ICRC (see the module docs for why).
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

/// Total encoded length (headers, payload, pad, ICRC) of a packet.
pub fn encoded_len(payload_len: usize, with_imm: bool) -> usize {
    BTH_LEN
        + DETH_LEN
        + if with_imm { IMMDT_LEN } else { 0 }
        + payload_len
        + pad_for(payload_len)
        + ICRC_LEN
}

/// Pad bytes that round `len` up to a multiple of 4 (IBA §9.2.3 PadCnt).
fn pad_for(len: usize) -> usize {
    (4 - (len % 4)) % 4
}

fn check24(v: u32) -> Result<u32, EncodeError> {
    if v & !MASK_24 == 0 {
        Ok(v)
    } else {
        Err(EncodeError::FieldRange(v))
    }
}

/// Encode a UD SEND into `out` and append the ICRC for `ctx` (IPv4 ID assumed 0,
/// flags DF, which is what a Linux unconnected DF UDP socket puts on the wire).
/// Returns the packet length (the UDP payload).
pub fn encode(
    header: &UdHeader,
    payload: &[u8],
    ctx: &IcrcContext,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    encode_with_ipv4_id(header, payload, ctx, 0, out)
}

/// [`encode`] for a packet whose IPv4 header will carry identification
/// `ipv4_id` (the ICRC covers it, RoCEv2 Annex A17.3.3). Linux gives the
/// datagrams it cuts from one UDP GSO send of an unconnected DF socket the
/// IDs 0, 1, 2, … in order, so packet `i` of a batch is encoded with `i`.
/// Ignored for IPv6, which has no identification.
pub fn encode_with_ipv4_id(
    header: &UdHeader,
    payload: &[u8],
    ctx: &IcrcContext,
    ipv4_id: u16,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let with_imm = header.imm.is_some();
    let need = encoded_len(payload.len(), with_imm);
    if out.len() < need {
        return Err(EncodeError::BufferTooSmall {
            have: out.len(),
            need,
        });
    }
    let dest_qp = check24(header.dest_qp)?;
    let psn = check24(header.psn)?;
    let src_qp = check24(header.src_qp)?;
    let pad = pad_for(payload.len());
    let out = &mut out[..need];

    // BTH (IBA §9.2).
    out[0] = header.opcode();
    out[1] = (u8::from(header.solicited) << 7)
        | (u8::from(header.mig_req) << 6)
        | ((pad as u8) << 4)
        | TVER;
    out[2..4].copy_from_slice(&header.pkey.to_be_bytes());
    out[4..8].copy_from_slice(&dest_qp.to_be_bytes());
    out[4] = (u8::from(header.fecn) << 7) | (u8::from(header.becn) << 6);
    out[8..12].copy_from_slice(&psn.to_be_bytes());
    out[8] = u8::from(header.ack_req) << 7;
    // DETH (IBA §9.3.3).
    out[12..16].copy_from_slice(&header.qkey.to_be_bytes());
    out[16..20].copy_from_slice(&src_qp.to_be_bytes());
    out[16] = 0;
    let mut at = BTH_LEN + DETH_LEN;
    if let Some(imm) = header.imm {
        // ImmDt is opaque to the transport; verbs hands it over in network order.
        out[at..at + IMMDT_LEN].copy_from_slice(&imm.to_be_bytes());
        at += IMMDT_LEN;
    }
    out[at..at + payload.len()].copy_from_slice(payload);
    at += payload.len();
    out[at..at + pad].fill(0);
    at += pad;
    let crc = icrc(ctx, ipv4_id, &out[..at]);
    out[at..at + ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(need)
}

/// Decode a UD SEND packet (the UDP payload). Checks structure only; the ICRC needs
/// the IP context, see [`verify_icrc`].
pub fn decode(pkt: &[u8]) -> Result<Decoded<'_>, DecodeError> {
    let min = BTH_LEN + DETH_LEN + ICRC_LEN;
    if pkt.len() < min {
        return Err(DecodeError::Truncated {
            len: pkt.len(),
            need: min,
        });
    }
    let opcode = pkt[0];
    let with_imm = match opcode {
        OPCODE_UD_SEND_ONLY => false,
        OPCODE_UD_SEND_ONLY_IMM => true,
        other => return Err(DecodeError::WrongOpcode(other)),
    };
    let tver = pkt[1] & 0x0F;
    if tver != TVER {
        return Err(DecodeError::BadTver(tver));
    }
    let hdr_len = BTH_LEN + DETH_LEN + if with_imm { IMMDT_LEN } else { 0 };
    if pkt.len() < hdr_len + ICRC_LEN {
        return Err(DecodeError::Truncated {
            len: pkt.len(),
            need: hdr_len + ICRC_LEN,
        });
    }
    let pad_cnt = (pkt[1] >> 4) & 0b11;
    let padded_len = pkt.len() - hdr_len - ICRC_LEN;
    if padded_len % 4 != 0 || usize::from(pad_cnt) > padded_len {
        return Err(DecodeError::BadPad {
            pad_cnt,
            padded_len,
        });
    }
    let be32 = |at: usize| u32::from_be_bytes([pkt[at], pkt[at + 1], pkt[at + 2], pkt[at + 3]]);
    let header = UdHeader {
        solicited: pkt[1] & 0x80 != 0,
        mig_req: pkt[1] & 0x40 != 0,
        pkey: u16::from_be_bytes([pkt[2], pkt[3]]),
        fecn: pkt[4] & 0x80 != 0,
        becn: pkt[4] & 0x40 != 0,
        dest_qp: be32(4) & MASK_24,
        ack_req: pkt[8] & 0x80 != 0,
        psn: be32(8) & MASK_24,
        qkey: be32(12),
        src_qp: be32(16) & MASK_24,
        imm: with_imm.then(|| be32(BTH_LEN + DETH_LEN)),
    };
    let icrc_at = pkt.len() - ICRC_LEN;
    Ok(Decoded {
        header,
        payload: &pkt[hdr_len..icrc_at - usize::from(pad_cnt)],
        icrc: u32::from_le_bytes([
            pkt[icrc_at],
            pkt[icrc_at + 1],
            pkt[icrc_at + 2],
            pkt[icrc_at + 3],
        ]),
    })
}

/// The masked IP + UDP headers that start the ICRC input (after the 8 0xFF bytes).
/// Returns the buffer and how many bytes of it are used (28 for IPv4, 48 for IPv6).
/// `udp_payload_len` is the length of the whole RoCE packet including the ICRC.
fn masked_ip_udp(ctx: &IcrcContext, ipv4_id: u16, udp_payload_len: usize) -> ([u8; 48], usize) {
    let mut h = [0u8; 48];
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
    (h, ip_len + UDP_HEADER_LEN)
}

/// The ICRC of a packet whose bytes *before* the ICRC field are `body` (BTH through
/// pad), as zlib's `crc32` of the masked byte string (IBA §7.8.1, Annex A17.4.5.3).
/// `ipv4_id` is ignored for IPv6.
pub fn icrc(ctx: &IcrcContext, ipv4_id: u16, body: &[u8]) -> u32 {
    let (ipudp, n) = masked_ip_udp(ctx, ipv4_id, body.len() + ICRC_LEN);
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xFF; 8]); // stands in for the (absent) LRH
    h.update(&ipudp[..n]);
    if body.len() >= BTH_LEN {
        let mut bth = [0u8; BTH_LEN];
        bth.copy_from_slice(&body[..BTH_LEN]);
        bth[4] = 0xFF; // FECN/BECN/resv6: variant
        h.update(&bth);
        h.update(&body[BTH_LEN..]);
    } else {
        h.update(body);
    }
    h.finalize()
}

/// Check a packet's ICRC under `policy`. `pkt` is the whole UDP payload.
pub fn verify_icrc(
    ctx: &IcrcContext,
    pkt: &[u8],
    policy: IcrcPolicy,
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
        if let Some(id) = solve_ipv4_id(with_zero ^ carried, pkt.len()) {
            return Ok(IcrcVerdict::Verified { ipv4_id: id });
        }
    }
    Err(DecodeError::BadIcrc { carried })
}

// ---------------------------------------------------------------------------
// GF(2) arithmetic for solving the IPv4 identification.
//
// CRC-32 works on polynomials over GF(2) modulo P (0x04C11DB7, here in zlib's
// bit-reflected form 0xEDB88320, where bit 31 is the coefficient of x^0).
// For two inputs of equal length, crc(a) ^ crc(b) = L(a ^ b), where L is the
// plain polynomial remainder (no pre/post inversion): the inversions cancel. A
// difference confined to the 2 ID bytes followed by T more bytes is therefore
// L(id bytes) · x^(8T) mod P. We build that image for each of the 16 ID bits and
// solve for the observed difference by Gaussian elimination.

const POLY: u32 = 0xEDB8_8320;

/// Multiply by x modulo P (reflected representation).
const fn mul_x(v: u32) -> u32 {
    if v & 1 != 0 {
        (v >> 1) ^ POLY
    } else {
        v >> 1
    }
}

/// a · b modulo P (reflected representation).
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut i = 0;
    while i < 32 {
        if a & (0x8000_0000 >> i) != 0 {
            p ^= b;
        }
        b = mul_x(b);
        i += 1;
    }
    p
}

/// X2K[k] = x^(2^k) mod P.
const X2K: [u32; 32] = {
    let mut t = [0u32; 32];
    t[0] = 0x4000_0000; // x^1
    let mut k = 1;
    while k < 32 {
        t[k] = mul_mod(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// x^(8·n) mod P: the effect of appending n zero bytes.
fn x_pow_8n(n: usize) -> u32 {
    let mut p = 0x8000_0000; // x^0
    let mut n = n as u64;
    let mut k = 3; // 8 = 2^3
    while n != 0 {
        if n & 1 != 0 {
            p = mul_mod(X2K[k % 32], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// L(id) for each single ID bit: the raw CRC register after the two ID bytes
/// (big-endian on the wire) starting from zero.
const ID_BIT_IMAGES: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        let id = 1u16 << i;
        let bytes = id.to_be_bytes();
        let mut s = 0u32;
        let mut b = 0;
        while b < 2 {
            s ^= bytes[b] as u32;
            let mut k = 0;
            while k < 8 {
                s = mul_x(s);
                k += 1;
            }
            b += 1;
        }
        t[i] = s;
        i += 1;
    }
    t
};

/// Find the IPv4 identification that explains `diff` = ICRC(with ID 0) ^ carried
/// ICRC, for a RoCE packet of `pkt_len` bytes (UDP payload incl. ICRC). `None` if
/// no 16-bit ID does (the packet is corrupt, or another field was not as assumed).
pub fn solve_ipv4_id(diff: u32, pkt_len: usize) -> Option<u16> {
    // Bytes after the ID field in the ICRC input: the rest of the IPv4 header (14),
    // the UDP header (8) and the packet without its ICRC.
    let trailing = (IPV4_HEADER_LEN - 6) + UDP_HEADER_LEN + pkt_len.checked_sub(ICRC_LEN)?;
    let shift = x_pow_8n(trailing);
    // Row-echelon basis indexed by pivot bit: (vector, which ID bits compose it).
    let mut basis = [(0u32, 0u16); 32];
    for (i, img) in ID_BIT_IMAGES.iter().enumerate() {
        let (mut v, mut combo) = (mul_mod(*img, shift), 1u16 << i);
        while v != 0 {
            let pivot = 31 - v.leading_zeros() as usize;
            if basis[pivot].0 == 0 {
                basis[pivot] = (v, combo);
                break;
            }
            v ^= basis[pivot].0;
            combo ^= basis[pivot].1;
        }
    }
    let (mut v, mut id) = (diff, 0u16);
    while v != 0 {
        let pivot = 31 - v.leading_zeros() as usize;
        if basis[pivot].0 == 0 {
            return None;
        }
        v ^= basis[pivot].0;
        id ^= basis[pivot].1;
    }
    Some(id)
}

#[cfg(test)]
mod tests;
