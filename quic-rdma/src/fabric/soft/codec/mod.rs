//! RoCEv2 UD packet codec: BTH, DETH, ImmDt, pad and ICRC (pure: no I/O, no allocation).
//!
//! Headers are in `header.rs`, the ICRC in `icrc.rs`, the IPv4-identification
//! solver in `ipv4_id.rs`; [`encode_frame`] joins the first two into the bytes
//! around a payload, [`encode`] into a whole packet.
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
//! payload). A receiver that knows a likely ID — the packet's position in its
//! GRO batch, which is its position in the sender's GSO batch and so its ID —
//! checks that one first ([`verify_icrc_guessing`]: one multiplication). A
//! packet is accepted iff *some* ID makes the ICRC match. That leaves 16 of the
//! 32 check bits for IPv4 with unknown ID — a corrupted packet passes with
//! probability 2⁻¹⁶ — which is acceptable here because every QUIC packet is
//! authenticated by its AEAD anyway; the ICRC is a wire-compatibility and
//! early-drop check, not the integrity guarantee. [`IcrcPolicy::IdZeroOnly`] keeps
//! the full 32 bits for deployments that only talk to `soft` peers, and IPv6 has
//! no unknown fields, so it is always checked at full strength.

mod frame;
mod header;
mod icrc;
mod ipv4_id;

pub use frame::{encode_frame, Frame};
pub use header::{
    decode, encoded_len, DecodeError, Decoded, EncodeError, UdHeader, BTH_LEN, DETH_LEN, ICRC_LEN,
    IMMDT_LEN, MASK_24, MAX_OVERHEAD, OPCODE_UD_SEND_ONLY, OPCODE_UD_SEND_ONLY_IMM,
};
pub use icrc::{
    icrc, verify_icrc, verify_icrc_guessing, IcrcContext, IcrcPolicy, IcrcVerdict, IpPair,
};
pub use ipv4_id::{solve_ipv4_id, Ipv4IdGuess};

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
    let need = encoded_len(payload.len(), header.imm.is_some());
    if out.len() < need {
        return Err(EncodeError::BufferTooSmall {
            have: out.len(),
            need,
        });
    }
    let frame = encode_frame(header, payload, ctx, ipv4_id)?;
    let (head, tail) = (frame.head(), frame.tail());
    let (h, rest) = out[..need].split_at_mut(head.len());
    let (p, t) = rest.split_at_mut(payload.len());
    h.copy_from_slice(head);
    p.copy_from_slice(payload);
    t.copy_from_slice(tail);
    Ok(need)
}

#[cfg(test)]
mod tests;
