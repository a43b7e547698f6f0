//! Fuzz the reassembly of segmented datagrams (`socket::Reassembler`, the
//! part header `socket::segment::PartHeader`) with arbitrary parts.
//!
//! The input is a script of parts: each a peer (1 byte), a time step (1 byte,
//! in ms), an immediate value (1 byte, low bits), a length (1 byte) and that
//! many payload bytes, the part header first. Invariants, besides "no panic":
//! - memory stays within its bounds (datagrams in progress, buffer bytes);
//! - every part is counted once: taken, malformed or duplicate;
//! - a completed datagram is never larger than the reassembly buffer, and
//!   only a part that decodes can complete one.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use quic_rdma::socket::segment::{PartHeader, PART_IMM, SEGMENTED_MAX};
use quic_rdma::socket::{Reassembler, ReassemblyConfig};

fuzz_target!(|data: &[u8]| {
    let cfg = ReassemblyConfig {
        max_datagrams: 8,
        per_peer: 3,
        timeout: Duration::from_millis(50),
    };
    let mut r = Reassembler::<u8>::new(cfg);
    let t0 = Instant::now();
    let mut now = t0;
    let mut parts = 0u64;
    let mut rest = data;
    while let [peer, dt, imm, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (payload, next) = tail.split_at(n);
        rest = next;
        now += Duration::from_millis(u64::from(*dt));
        parts += 1;
        let decodes = PartHeader::decode(payload).is_ok();
        if let Some(d) = r.accept(now, peer & 3, PART_IMM | u32::from(imm & 3), 0, payload) {
            assert!(decodes, "a part that does not decode completed a datagram");
            assert!(d.data.len() <= SEGMENTED_MAX);
        }
        assert!(r.in_progress() <= cfg.max_datagrams);
        assert!(r.buffer_bytes() <= cfg.max_datagrams * SEGMENTED_MAX);
        let s = r.stats();
        assert_eq!(s.parts + s.malformed + s.duplicates, parts, "{s:?}");
    }
});
