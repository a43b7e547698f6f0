//! Segmentation for small fabric MTUs: the wire format of a *part* (one UD
//! SEND carrying a piece of a datagram larger than the active MTU), sans-IO
//! (docs/architecture.md §6, "Segmented datagrams").
//!
//! RoCE's active MTU on a 1500-byte Ethernet link is 1024 (the largest IB MTU
//! whose RoCEv2 packet fits, RoCEv2 Annex A17), below the 1200 bytes QUIC
//! requires of a path (RFC 9000 §14). A socket on such a fabric offers its
//! caller datagrams of up to [`datagram_mtu`] bytes and sends one larger than
//! the fabric MTU as 2..=16 parts:
//!
//! - **The immediate data says "part".** Bit 31 ([`PART_IMM`]) set marks a
//!   part. Bit 30 ([`PART_IMM_HAS_VALUE`]) says whether the datagram had
//!   immediate data of its own, carried in bits 29..0 (the QUIC drivers' 20-bit
//!   routing key fits). A whole datagram is a plain SEND or carries immediate
//!   data with bit 31 clear (IBA 9.4.1 / RoCEv2: SEND_ONLY_WITH_IMMEDIATE).
//! - **A 4-byte part header** starts each part's payload: a 24-bit datagram id
//!   (big-endian), then one byte of part index (high nibble) and part count
//!   minus one (low nibble). The id is the sender queue pair's counter of
//!   segmented datagrams, so a receiver keys reassembly on (source GID, source
//!   QPN, id); it wraps after 2^24 datagrams, far longer than a reassembly
//!   lives.
//! - **Sizes.** Every part but the last carries the same number of datagram
//!   bytes; the last carries 1..= that many. Parts are in index order in the
//!   datagram, so part *i* starts at *i* × (the first parts' size).
//!
//! Only datagrams larger than the fabric MTU are cut; a datagram that fits is
//! sent whole, exactly as without segmentation.

/// Immediate-data bit 31: this SEND is a part of a segmented datagram.
pub const PART_IMM: u32 = 1 << 31;
/// Immediate-data bit 30 of a part: the datagram had immediate data of its own,
/// in bits 29..0.
pub const PART_IMM_HAS_VALUE: u32 = 1 << 30;
/// The bits of a part's immediate data that carry the datagram's own value.
pub const PART_IMM_VALUE: u32 = PART_IMM_HAS_VALUE - 1;
/// Bytes of the part header at the start of every part's payload.
pub const PART_HEADER_LEN: usize = 4;
/// Most parts one datagram is cut into (the count's 4-bit field).
pub const MAX_PARTS: usize = 16;
/// Datagram ids are 24 bits.
pub const ID_MASK: u32 = (1 << 24) - 1;
/// What a segmenting socket offers above a fabric MTU below this (and the
/// largest datagram a receiver reassembles): an active MTU of 2048 or more
/// needs no segmentation.
pub const SEGMENTED_MAX: usize = 2048;

/// The largest datagram a socket on a fabric of `fabric_mtu` bytes offers its
/// caller: the fabric MTU itself from 2048 up, else as many full parts as fit
/// in [`SEGMENTED_MAX`] (1024: 2 × 1020 = 2040; 512: 4 × 508; 256: 8 × 252).
pub fn datagram_mtu(fabric_mtu: usize) -> usize {
    if fabric_mtu >= SEGMENTED_MAX || fabric_mtu <= PART_HEADER_LEN {
        return fabric_mtu;
    }
    let per_part = fabric_mtu - PART_HEADER_LEN;
    (SEGMENTED_MAX / fabric_mtu).min(MAX_PARTS) * per_part
}

/// How many parts a `len`-byte datagram is cut into on a fabric of
/// `fabric_mtu` bytes: 1 (sent whole) when it fits.
pub fn parts_for(len: usize, fabric_mtu: usize) -> usize {
    if len <= fabric_mtu {
        1
    } else {
        len.div_ceil(fabric_mtu.saturating_sub(PART_HEADER_LEN).max(1))
    }
}

/// The parts of a `len`-byte datagram with id `id` on a fabric of
/// `fabric_mtu` bytes: each part's header and the range of datagram bytes it
/// carries after it. Every part but the last carries `fabric_mtu − 4` bytes.
/// Callers cut only datagrams larger than the fabric MTU into at most
/// [`MAX_PARTS`] parts (`parts_for`); outside that, the result is empty.
pub fn split(
    id: u32,
    len: usize,
    fabric_mtu: usize,
) -> impl Iterator<Item = (PartHeader, std::ops::Range<usize>)> {
    let count = parts_for(len, fabric_mtu);
    let per_part = fabric_mtu.saturating_sub(PART_HEADER_LEN).max(1);
    let count = if (2..=MAX_PARTS).contains(&count) {
        count
    } else {
        0
    };
    (0..count).map(move |i| {
        let h = PartHeader {
            id: id & ID_MASK,
            index: i as u8,
            count: count as u8,
        };
        (h, i * per_part..len.min((i + 1) * per_part))
    })
}

/// The immediate data of every part of a datagram whose own immediate data is
/// `imm`; `None` if that value does not fit in 30 bits (such a datagram cannot
/// be segmented).
pub fn part_imm(imm: Option<u32>) -> Option<u32> {
    match imm {
        None => Some(PART_IMM),
        Some(v) if v <= PART_IMM_VALUE => Some(PART_IMM | PART_IMM_HAS_VALUE | v),
        Some(_) => None,
    }
}

/// Whether immediate data `imm` marks a part.
pub fn is_part(imm: Option<u32>) -> bool {
    imm.is_some_and(|v| v & PART_IMM != 0)
}

/// The datagram's own immediate data, from a part's.
pub fn datagram_imm(part_imm: u32) -> Option<u32> {
    (part_imm & PART_IMM_HAS_VALUE != 0).then_some(part_imm & PART_IMM_VALUE)
}

/// A part's header: which datagram, which part, of how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartHeader {
    /// The datagram's id (24 bits), unique per sending queue pair.
    pub id: u32,
    /// This part's index, `0..count`.
    pub index: u8,
    /// Parts of the datagram, `2..=16`.
    pub count: u8,
}

/// Why a part's header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartError {
    /// Fewer than [`PART_HEADER_LEN`] bytes, or no datagram bytes after them.
    Truncated,
    /// A count of 1: a datagram that fits is sent whole, never as one part.
    SinglePart,
    /// The index is not below the count.
    IndexOutOfRange,
}

impl PartHeader {
    /// The 4 bytes on the wire.
    pub fn encode(self) -> [u8; PART_HEADER_LEN] {
        debug_assert!((2..=MAX_PARTS as u8).contains(&self.count) && self.index < self.count);
        let id = (self.id & ID_MASK).to_be_bytes();
        [id[1], id[2], id[3], (self.index << 4) | (self.count - 1)]
    }

    /// Parse a part's payload into its header and datagram bytes.
    pub fn decode(payload: &[u8]) -> Result<(PartHeader, &[u8]), PartError> {
        let (h, rest) = match payload.split_first_chunk::<PART_HEADER_LEN>() {
            Some((h, rest)) if !rest.is_empty() => (h, rest),
            _ => return Err(PartError::Truncated),
        };
        let header = PartHeader {
            id: u32::from_be_bytes([0, h[0], h[1], h[2]]),
            index: h[3] >> 4,
            count: (h[3] & 0xF) + 1,
        };
        if header.count < 2 {
            return Err(PartError::SinglePart);
        }
        if header.index >= header.count {
            return Err(PartError::IndexOutOfRange);
        }
        Ok((header, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_mtu_reaches_quic_minimum_below_2048() {
        // RFC 9000 §14: a QUIC path carries at least 1200-byte datagrams.
        assert_eq!(datagram_mtu(1024), 2040);
        assert_eq!(datagram_mtu(512), 2032);
        assert_eq!(datagram_mtu(256), 2016);
        for m in [256, 512, 1024] {
            assert!(datagram_mtu(m) >= 1200);
            assert!(datagram_mtu(m) <= SEGMENTED_MAX);
            assert!(parts_for(datagram_mtu(m), m) <= MAX_PARTS);
        }
        assert_eq!(datagram_mtu(2048), 2048, "no segmentation at 2048");
        assert_eq!(datagram_mtu(4096), 4096);
        assert_eq!(parts_for(1024, 1024), 1, "fits: sent whole");
        assert_eq!(parts_for(1025, 1024), 2);
        assert_eq!(parts_for(2040, 1024), 2);
        assert_eq!(parts_for(2041, 1024), 3);
    }

    #[test]
    fn header_round_trips_and_refuses_nonsense() {
        let h = PartHeader {
            id: 0xAB_CDEF,
            index: 3,
            count: 16,
        };
        let mut wire = h.encode().to_vec();
        assert_eq!(wire, [0xAB, 0xCD, 0xEF, 0x3F]);
        wire.push(7);
        assert_eq!(PartHeader::decode(&wire), Ok((h, &[7u8][..])));
        assert_eq!(PartHeader::decode(&wire[..4]), Err(PartError::Truncated));
        assert_eq!(
            PartHeader::decode(&[0, 0, 0, 0x00, 1]),
            Err(PartError::SinglePart)
        );
        assert_eq!(
            PartHeader::decode(&[0, 0, 0, 0x21, 1]),
            Err(PartError::IndexOutOfRange)
        );
    }

    #[test]
    fn split_covers_the_datagram_in_order() {
        let parts: Vec<_> = split(0x1_000_005, 2040, 1024).collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0].0,
            PartHeader {
                id: 5,
                index: 0,
                count: 2
            }
        );
        assert_eq!(
            (parts[0].1.clone(), parts[1].1.clone()),
            (0..1020, 1020..2040)
        );
        let parts: Vec<_> = split(1, 1300, 256).collect();
        assert_eq!(parts.len(), 6);
        assert_eq!(parts[5].1, 1260..1300);
        assert_eq!(split(1, 1000, 1024).count(), 0, "fits: not cut");
        assert_eq!(split(1, 17 * 252 + 1, 256).count(), 0, "more than 16 parts");
    }

    #[test]
    fn immediate_data_of_parts() {
        assert_eq!(part_imm(None), Some(PART_IMM));
        assert_eq!(part_imm(Some(0x1_2345)), Some(0xC001_2345));
        assert_eq!(part_imm(Some(PART_IMM_HAS_VALUE)), None, "too wide");
        assert!(is_part(Some(0x8000_0000)));
        assert!(!is_part(Some(0x000F_FFFF)) && !is_part(None));
        assert_eq!(datagram_imm(0xC001_2345), Some(0x1_2345));
        assert_eq!(datagram_imm(PART_IMM), None);
    }
}
