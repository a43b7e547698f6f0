//! Fuzz `cid::key_of_datagram` (the receiver's routing-key check reads it from
//! every datagram before QUIC decrypts anything).
//!
//! Invariants:
//! - no panic; a key is 20 bits; `None` exactly when the datagram is shorter than
//!   the header claims (RFC 9000 §17.2 long header: 6 bytes + DCID length;
//!   §17.3 short header: 1 + the key's 3 bytes);
//! - round trip: a datagram whose DCID came from `RoutingCidGenerator` yields the
//!   generator's key, whatever the header form, version, CID length and tail;
//!   flipping a bit of the key in the CID changes the key read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma::quic::{key_of_cid, key_of_datagram, RoutingCidGenerator, ROUTING_KEY_MASK};
use quinn_proto::ConnectionIdGenerator;

fuzz_target!(|data: &[u8]| {
    // 1. The bytes as a datagram.
    let key = key_of_datagram(data);
    if let Some(k) = key {
        assert!(k <= ROUTING_KEY_MASK);
    }
    let need = match data.first() {
        None => usize::MAX,
        Some(b) if b & 0x80 != 0 => data.get(5).map_or(usize::MAX, |&l| 6 + l as usize),
        Some(_) => 4,
    };
    assert_eq!(key.is_some(), data.len() >= need, "None iff truncated");

    // 2. The bytes as a recipe for a datagram around a generated CID:
    //    [key: 3][len][form+first][version: 4][flip][tail...].
    let Some((head, tail)) = data.split_first_chunk::<10>() else {
        return;
    };
    let raw_key = u32::from_be_bytes([0, head[0], head[1], head[2]]);
    let mut gen = RoutingCidGenerator::new(raw_key, usize::from(head[3]));
    assert_eq!(gen.key(), raw_key & ROUTING_KEY_MASK);
    let cid = gen.generate_cid();
    assert!(gen.validate(&cid).is_ok());
    let mut d = Vec::with_capacity(32 + tail.len());
    let long = head[4] & 0x80 != 0;
    if long {
        d.push(head[4]);
        d.extend_from_slice(&head[5..9]);
        d.push(cid.len() as u8);
    } else {
        d.push(head[4]);
    }
    let cid_at = d.len();
    d.extend_from_slice(&cid);
    d.extend_from_slice(tail);
    assert_eq!(
        key_of_datagram(&d),
        Some(gen.key()),
        "generated CID's key round trips"
    );
    assert_eq!(key_of_cid(&cid), gen.key());

    // A flipped bit among the key's 20 bits must show in the key read.
    let bit = usize::from(head[9]) % 20;
    d[cid_at + bit / 8] ^= 0x80 >> (bit % 8);
    assert_eq!(
        key_of_datagram(&d),
        Some(gen.key() ^ (1 << (19 - bit))),
        "key bit {bit} flipped"
    );
});
