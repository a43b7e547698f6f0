//! BTH, DETH and ImmDt of a RoCEv2 UD SEND (IBA §9.2, §9.3): the header fields,
//! their wire layout with payload and pad, and structural decoding. The ICRC that
//! ends every packet is in `icrc.rs`; the [`codec`](super) docs draw the layout.

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
/// The longest header before the payload: BTH + DETH + ImmDt.
pub(super) const HEAD_MAX: usize = BTH_LEN + DETH_LEN + IMMDT_LEN;
/// The 24-bit QPN / PSN mask.
pub const MASK_24: u32 = 0x00FF_FFFF;

/// The transport header version this codec speaks (IBA §9.2: TVer = 0).
const TVER: u8 = 0;
/// UDP header length: the ICRC covers the UDP header (Annex A17.4.5.3).
pub(super) const UDP_HEADER_LEN: usize = 8;
/// IPv4 header length without options: the ICRC covers the IP header.
pub(super) const IPV4_HEADER_LEN: usize = 20;

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
    /// A UD SEND as every sender makes it: no solicited event, MigReq, ECN
    /// or AckReq bits (IBA 9.2, 9.7.7.2: a UD receiver ignores AckReq); PSN
    /// and QPNs cut to their 24 bits.
    pub fn send(
        pkey: u16,
        dest_qp: u32,
        psn: u32,
        qkey: u32,
        src_qp: u32,
        imm: Option<u32>,
    ) -> UdHeader {
        UdHeader {
            solicited: false,
            mig_req: false,
            pkey,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & MASK_24,
            ack_req: false,
            psn: psn & MASK_24,
            qkey,
            src_qp: src_qp & MASK_24,
            imm,
        }
    }

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
pub(super) fn pad_for(len: usize) -> usize {
    (4 - (len % 4)) % 4
}

fn check24(v: u32) -> Result<u32, EncodeError> {
    if v & !MASK_24 == 0 {
        Ok(v)
    } else {
        Err(EncodeError::FieldRange(v))
    }
}
/// Write BTH, DETH and ImmDt of a UD SEND carrying `payload_len` bytes of
/// payload into `out`. Returns the header length.
/// The pad and ICRC that follow the payload are the caller's (see `frame.rs`).
pub(super) fn encode_head(
    header: &UdHeader,
    payload_len: usize,
    out: &mut [u8; HEAD_MAX],
) -> Result<usize, EncodeError> {
    let dest_qp = check24(header.dest_qp)?;
    let psn = check24(header.psn)?;
    let src_qp = check24(header.src_qp)?;
    let pad = pad_for(payload_len);

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
    Ok(at)
}

/// Decode a UD SEND packet (the UDP payload). Checks structure only; the ICRC needs
/// the IP context, see [`verify_icrc`](super::verify_icrc).
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
