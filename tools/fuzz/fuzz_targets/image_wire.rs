//! Fuzz the `qr-image/1` frame parser (tools/src/image/wire.rs): no panic on
//! any bytes, and whatever parses encodes back to the same bytes (the format
//! has one encoding per message, so decode ∘ encode is the identity).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma_tools::image::wire::{split_frame, Request, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(Request::decode(&req.encode()).unwrap(), req);
    }
    if let Ok(resp) = Response::decode(data) {
        assert_eq!(resp.encode(), data);
    }
    if let Ok(Some((msg, used))) = split_frame(data) {
        assert_eq!(used, msg.len() + 4);
        assert!(used <= data.len());
    }
});
