//! # quic-rdma
//!
//! QUIC (quinn-proto + rustls + ring) carried in RDMA Unreliable Datagram sends
//! over RoCEv2 instead of UDP sockets.
//!
//! Layers, bottom up (the module tree follows them):
//! - [`fabric`]: the provider-neutral UD queue-pair model and its providers;
//! - [`socket`]: the UDP-socket replacement over one UD queue pair;
//! - [`cid`]: connection IDs carrying a 20-bit routing key;
//! - [`routing`]: the routing key in the immediate data, both ways;
//! - [`peers`]: the bounded table of UD peers ↔ the addresses QUIC sees;
//! - [`quinn_adapter`]: `quinn::AsyncUdpSocket` over the socket — the drop-in;
//! - [`engine`]: a poll-mode, single-threaded driver straight over quinn-proto.

pub mod cid;
pub mod engine;
pub mod fabric;
pub mod peers;
pub mod quinn_adapter;
pub mod routing;
pub mod socket;
