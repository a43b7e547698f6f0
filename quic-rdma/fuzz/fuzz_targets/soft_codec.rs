//! Fuzz the `soft` RoCEv2 decoder and ICRC check with arbitrary datagrams.
//!
//! Invariants: no panic on any input; whatever decodes re-encodes to a packet that
//! decodes to the same header and payload and passes its own ICRC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma::fabric::soft::codec::{
    decode, encode, encoded_len, verify_icrc, IcrcContext, IcrcPolicy, IpPair,
};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the IP family and policy; the rest is the datagram.
    let Some((&sel, pkt)) = data.split_first() else {
        return;
    };
    let ctx = IcrcContext {
        ip: if sel & 1 == 0 {
            IpPair::V4 {
                src: [10, 0, 0, 1].into(),
                dst: [10, 0, 0, 2].into(),
            }
        } else {
            IpPair::V6 {
                src: "fd00::1".parse().unwrap(),
                dst: "fd00::2".parse().unwrap(),
            }
        },
        src_port: 49152,
        dst_port: 4791,
    };
    let policy = match (sel >> 1) % 3 {
        0 => IcrcPolicy::SolveIpv4Id,
        1 => IcrcPolicy::IdZeroOnly,
        _ => IcrcPolicy::Skip,
    };
    let _ = verify_icrc(&ctx, pkt, policy);
    if let Ok(d) = decode(pkt) {
        let mut out = vec![0u8; encoded_len(d.payload.len(), d.header.imm.is_some())];
        let n = encode(&d.header, d.payload, &ctx, &mut out).expect("decoded fields re-encode");
        let again = decode(&out[..n]).expect("re-encoded packet decodes");
        assert_eq!(again.header, d.header);
        assert_eq!(again.payload, d.payload);
        assert!(verify_icrc(&ctx, &out[..n], IcrcPolicy::IdZeroOnly).is_ok());
    }
});
