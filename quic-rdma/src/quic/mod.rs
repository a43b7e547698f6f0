//! The QUIC side shared by both drivers (the quinn adapter and the engine):
//! everything that knows QUIC but not how a driver runs — below it the socket
//! knows only UD, above it each driver only how it is driven
//! (docs/architecture.md §1, §3, §5).
//!
//! - `cid`: connection IDs carrying a 20-bit routing key, and the header
//!   fields read before QUIC parses a packet;
//! - `amplification`: what an unvalidated address may be sent (RFC 9000
//!   §8.1) and what validates it;
//! - `routing`: the routing key in the immediate data, both ways;
//! - `peers`: the bounded table of UD peers ↔ the addresses quinn-proto sees;
//! - `retry`: when a server answers an Initial with a stateless Retry;
//! - `config`: endpoint and transport configuration for a fabric (MTU,
//!   timers, windows), in quinn-proto's types, so the engine needs no quinn;
//! - `pin`: certificate pinning (SHA-256 of the server's key) on top of
//!   the usual verification;
//! - `suites`: the TLS 1.3 cipher suites offered and their order;
//! - `tls`: certificates, keys, mutual TLS and ALPN as deployed (PEM/DER),
//!   made into quinn-proto client and server configs.
//!
//! The submodules are private: what the drivers, the tools, the C API and the
//! tests use is re-exported here, and nothing else is public.

pub(crate) mod amplification;
pub(crate) mod cid;
pub(crate) mod config;
pub(crate) mod peers;
pub(crate) mod pin;
pub(crate) mod retry;
pub(crate) mod routing;
pub(crate) mod suites;
pub(crate) mod tls;

/// Address validation (RFC 9000 §8.1): the 3× budget of an unvalidated
/// address, and the keyed hash of the connection IDs that validate it.
pub use amplification::{Budget, CidKey};
/// Connection IDs carrying a routing key, and the header fields read before
/// QUIC parses a datagram.
pub use cid::{
    is_client_initial, key_of_cid, key_of_datagram, RoutingCidGenerator, DEFAULT_CID_LEN,
    ROUTING_KEY_BITS, ROUTING_KEY_MASK,
};
/// Endpoint and transport configuration for a fabric, and the liveness timers.
pub use config::{
    endpoint_config, transport, transport_config, transport_config_with, transport_with,
    udp_path_transport_config, Liveness, LivenessError,
};
/// The peer table's bounds and counters.
pub use peers::{PeerLimits, PeerStats};
/// Certificate pinning by the SHA-256 of the server's SubjectPublicKeyInfo.
pub use pin::{spki_sha256, SpkiPin};
/// When a server answers with a stateless Retry.
pub use retry::{RetryPolicy, UnknownRetryPolicy};
/// The routing key in the immediate data: sending with it, checking it on
/// receipt, and the counters of that check.
pub use routing::{send, RoutingCheck, RoutingStats};
/// The TLS 1.3 cipher suites offered, and which one a connection negotiated.
pub use suites::{
    CipherPreference, SuiteClientConfig, SuiteHandshakeData, UnknownCipherPreference, CIPHERS_ENV,
};
/// Certificates, keys and the one TLS builder.
pub use tls::{parse_certificates, parse_private_key, TlsError, TlsSettings};
