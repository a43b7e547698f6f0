//! # quic-rdma
//!
//! QUIC (quinn-proto + rustls + ring) carried in RDMA Unreliable Datagram sends
//! over RoCEv2 instead of UDP sockets.
//!
//! Layers, bottom up (the module tree follows them):
//! - [`fabric`]: the provider-neutral UD queue-pair model and its providers;
//! - [`socket`]: the UDP-socket replacement over one UD queue pair;
//! - [`discovery`]: the TCP service that publishes an endpoint's UD address,
//!   for every provider;
//! - [`quic`]: what both drivers share — routing-key CIDs, the immediate-data
//!   convention, the peer table, fabric-tuned quinn-proto configuration;
//! - [`quinn_adapter`]: `quinn::AsyncUdpSocket` over the socket — the drop-in
//!   (cargo feature `quinn`, on by default);
//! - [`engine`]: a poll-mode, single-threaded driver straight over quinn-proto
//!   (no runtime, no quinn, no tokio: what the C API is built on).
//!
//! Dependencies point down only: `fabric` and `socket` know nothing of QUIC.

pub mod counters;
pub mod discovery;
pub mod engine;
pub mod fabric;
pub mod quic;
#[cfg(feature = "quinn")]
pub mod quinn_adapter;
pub mod socket;
