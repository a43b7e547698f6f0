//! Solving for the IPv4 identification that makes an ICRC match (the
//! [`codec`](super) docs explain why a receiver must): GF(2) arithmetic modulo
//! the CRC-32 polynomial, and a 32×16 linear system solved by Gaussian elimination.
//!
//! CRC-32 works on polynomials over GF(2) modulo P (0x04C11DB7, here in zlib's
//! bit-reflected form 0xEDB88320, where bit 31 is the coefficient of x^0).
//! For two inputs of equal length, crc(a) ^ crc(b) = L(a ^ b), where L is the
//! plain polynomial remainder (no pre/post inversion): the inversions cancel. A
//! difference confined to the 2 ID bytes followed by T more bytes is therefore
//! L(id bytes) · x^(8T) mod P. We build that image for each of the 16 ID bits and
//! solve for the observed difference by Gaussian elimination.

use super::header::{ICRC_LEN, IPV4_HEADER_LEN, UDP_HEADER_LEN};

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

/// `X2K[k]` = x^(2^k) mod P.
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

/// The ICRC difference that IPv4 identification `id` makes against ID 0, for
/// packets of one length: `diff(id) = L(id) · x^(8T)`, linear in the ID bits,
/// so the 16 single-bit differences are computed once per length (every
/// packet of a GRO batch but the last shares one, and so do most batches) and
/// checking a guessed ID is an XOR of a few of them, not a solve.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ipv4IdGuess {
    /// The packet length (UDP payload incl. ICRC) `bit_diffs` are for (0, never
    /// a valid length: none yet).
    len: usize,
    /// `bit_diffs[i]` = diff(1 << i) for packets of `len` bytes.
    bit_diffs: [u32; 16],
}

impl Ipv4IdGuess {
    /// Whether ID `id` explains `diff` = ICRC(with ID 0) ^ carried ICRC for a
    /// packet of `pkt_len` bytes. Exactly as strong as [`solve_ipv4_id`]
    /// finding `id` (the map from ID to difference is injective).
    pub fn matches(&mut self, id: u16, diff: u32, pkt_len: usize) -> bool {
        let Some(body) = pkt_len.checked_sub(ICRC_LEN) else {
            return false;
        };
        if self.len != pkt_len {
            let shift = x_pow_8n((IPV4_HEADER_LEN - 6) + UDP_HEADER_LEN + body);
            for (d, img) in self.bit_diffs.iter_mut().zip(ID_BIT_IMAGES) {
                *d = mul_mod(img, shift);
            }
            self.len = pkt_len;
        }
        let mut bits = id;
        let mut acc = 0;
        while bits != 0 {
            acc ^= self.bit_diffs[bits.trailing_zeros() as usize];
            bits &= bits - 1;
        }
        acc == diff
    }
}

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
mod tests {
    use super::*;

    #[test]
    fn guess_agrees_with_the_solver() {
        let mut g = Ipv4IdGuess::default();
        for len in [40usize, 1200, 4140] {
            for id in [1u16, 2, 7, 63, 0xBEEF] {
                let trailing = (IPV4_HEADER_LEN - 6) + UDP_HEADER_LEN + len - ICRC_LEN;
                let image = (0..16)
                    .filter(|i| id & (1 << i) != 0)
                    .fold(0, |a, i| a ^ ID_BIT_IMAGES[i]);
                let diff = mul_mod(image, x_pow_8n(trailing));
                assert_eq!(solve_ipv4_id(diff, len), Some(id));
                assert!(g.matches(id, diff, len), "len {len} id {id}");
                assert!(!g.matches(id ^ 1, diff, len), "len {len} id {id}");
            }
        }
    }

    #[test]
    fn x_pow_matches_zero_bytes() {
        // Appending n zero bytes to a raw register multiplies by x^(8n).
        for n in [0usize, 1, 2, 7, 100, 4200] {
            let mut s: u32 = 0x1234_5678;
            let want = mul_mod(s, x_pow_8n(n));
            for _ in 0..n * 8 {
                s = mul_x(s);
            }
            assert_eq!(s, want, "n = {n}");
        }
    }
}
