//! The QUIC side shared by both drivers (the quinn adapter and the engine):
//! everything that knows QUIC but not how a driver runs — below it the socket
//! knows only UD, above it each driver only how it is driven
//! (docs/architecture.md §1, §3, §5).
//!
//! - [`cid`]: connection IDs carrying a 20-bit routing key, and the header
//!   fields read before QUIC parses a packet;
//! - [`amplification`]: what an unvalidated address may be sent (RFC 9000
//!   §8.1) and what validates it;
//! - [`routing`]: the routing key in the immediate data, both ways;
//! - [`peers`]: the bounded table of UD peers ↔ the addresses quinn-proto sees;
//! - [`config`]: endpoint and transport configuration for a fabric (MTU,
//!   timers, windows), in quinn-proto's types, so the engine needs no quinn;
//! - [`suites`]: the TLS 1.3 cipher suites offered and their order;
//! - [`tls`]: certificates, keys, mutual TLS and ALPN as deployed (PEM/DER),
//!   made into quinn-proto client and server configs.

pub mod amplification;
pub mod cid;
pub mod config;
pub mod peers;
pub mod retry;
pub mod routing;
pub mod suites;
pub mod tls;
