//! Fuzz the KV channel's frame decoder: no panic on any bytes, and every frame
//! it accepts encodes back to bytes that decode to the same frame.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quic_rdma_tools::kv::frame::Frame;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(f)) = Frame::decode(&mut buf) {
        let mut again = BytesMut::new();
        f.encode(&mut again);
        let back = Frame::decode(&mut again).unwrap().unwrap();
        assert_eq!(back, f);
        assert!(again.is_empty());
    }
});
