//! Fuzz the RESP2 reply decoder the upstream relay uses on answers from Redis
//! servers and Sentinels (`ROLE`, `SENTINEL get-master-addr-by-name`): no
//! panic; a decoded reply never claims more bytes than given; every shorter
//! prefix of a decoded reply asks for more bytes instead of deciding
//! otherwise.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma_tools::kv::redis::reply::Reply;

fuzz_target!(|input: (u16, &[u8])| {
    let (cut, data) = input;
    if let Ok(Some((reply, used))) = Reply::decode(data) {
        assert!(used <= data.len());
        let cut = usize::from(cut) % used.max(1);
        assert_eq!(Reply::decode(&data[..cut]).ok(), Some(None), "{reply:?}");
    }
});
