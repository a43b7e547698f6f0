//! Fuzz the `soft` bootstrap reply parser: no panic on any line, and what parses
//! prints back to a line that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quic_rdma::discovery::PeerInfo;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(info) = PeerInfo::parse(line) {
        assert_eq!(PeerInfo::parse(&info.to_line()).unwrap(), info);
    }
});
