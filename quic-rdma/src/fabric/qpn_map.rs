//! A QPN-keyed table, hashed for its use: a lookup per packet sent or
//! received (the `soft` port's receive queues, the `sim` fabric's QPs).
//!
//! std's default SipHash costs tens of nanoseconds per lookup, keyed against
//! hash flooding by inserted keys. Here only the provider inserts keys (its
//! own QPNs, allocated sequentially); a peer only looks up, so a crafted
//! DestQP can at worst probe past the provider's few QPs. A multiplicative
//! (Fibonacci) hash of the 24-bit QPN spreads sequential QPNs over both the
//! bucket index (low bits) and the control byte (top 7 bits) of the table.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::fabric::Qpn;

/// A map from QPN to `V` with [`QpnHasher`].
pub(crate) type QpnMap<V> = HashMap<Qpn, V, BuildHasherDefault<QpnHasher>>;

/// Hashes a QPN (a `u32`) by one multiplication.
#[derive(Default)]
pub(crate) struct QpnHasher(u64);

/// 2⁶⁴ / φ, odd: multiplying by it is a bijection that mixes into the high bits.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for QpnHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not used for `u32` keys; correct for any other input all the same.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(FIBONACCI);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_qpns_spread_over_index_and_tag() {
        let mut m: QpnMap<u32> = QpnMap::default();
        for q in 2..1000 {
            m.insert(q, q * 3);
        }
        for q in 2..1000 {
            assert_eq!(m.get(&q), Some(&(q * 3)));
        }
        assert_eq!(m.get(&1000), None);
        let tag = |q: u32| {
            let mut h = QpnHasher::default();
            h.write_u32(q);
            h.finish() >> 57
        };
        let tags: std::collections::HashSet<u64> = (2..200).map(tag).collect();
        assert!(tags.len() > 64, "{} distinct tags", tags.len());
    }
}
