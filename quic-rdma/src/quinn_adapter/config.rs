//! quinn configuration for a UD fabric (docs/architecture.md §5).

use std::sync::Arc;
use std::time::Duration;

use quinn::{EndpointConfig, TransportConfig, VarInt};

use crate::cid::{RoutingCidGenerator, DEFAULT_CID_LEN};

/// An `EndpointConfig` whose `max_udp_payload_size` is the fabric MTU (quinn
/// otherwise caps datagrams at 1472) and whose CIDs carry `routing_key`.
pub fn endpoint_config(mtu: usize, routing_key: u32) -> EndpointConfig {
    let mut c = EndpointConfig::default();
    c.max_udp_payload_size(mtu.min(u16::MAX as usize) as u16)
        .expect("MTU at least 1200 (checked by the socket)");
    c.cid_generator(move || Box::new(RoutingCidGenerator::new(routing_key, DEFAULT_CID_LEN)));
    c
}

/// A `TransportConfig` tuned for a microsecond fabric with a known MTU:
/// every packet is MTU-sized from the start and no MTU probing goes above it
/// (the path cannot carry more), small initial RTT, windows for high bandwidth.
pub fn transport_config(mtu: usize) -> TransportConfig {
    let mtu = mtu.min(u16::MAX as usize) as u16;
    let mut t = TransportConfig::default();
    t.initial_mtu(mtu)
        .min_mtu(mtu)
        .mtu_discovery_config(None)
        .initial_rtt(Duration::from_millis(2))
        .stream_receive_window(VarInt::from_u32(16 << 20))
        .receive_window(VarInt::from_u32(64 << 20))
        .send_window(64 << 20)
        .datagram_receive_buffer_size(Some(4 << 20))
        .keep_alive_interval(Some(Duration::from_secs(5)));
    t
}

/// [`transport_config`] behind an `Arc`, ready for client and server configs.
pub fn transport(mtu: usize) -> Arc<TransportConfig> {
    Arc::new(transport_config(mtu))
}
