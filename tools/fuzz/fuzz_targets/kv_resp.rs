//! Fuzz the streaming RESP parser of the Redis relay, in both modes (a
//! replication link's RESP arrays only; a client port's inline lines too): no
//! panic; the same bytes fed whole or split at a fuzzer-chosen point give the
//! same commands and the same outcome; command ends never pass the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma_tools::kv::redis::resp::Parser;

fuzz_target!(|input: (u16, bool, &[u8])| {
    let (cut, clients, data) = input;
    let parser = || {
        if clients {
            Parser::for_clients()
        } else {
            Parser::new()
        }
    };
    let mut whole = parser();
    let mut a = Vec::new();
    let ra = whole.feed(data, &mut a);
    let cut = usize::from(cut) % (data.len() + 1);
    let mut split = parser();
    let mut b = Vec::new();
    let rb = split
        .feed(&data[..cut], &mut b)
        .and_then(|()| split.feed(&data[cut..], &mut b));
    assert_eq!(ra.is_ok(), rb.is_ok());
    assert_eq!(a, b);
    for c in &a {
        assert!(c.end <= data.len() as u64);
    }
});
