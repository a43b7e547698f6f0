//! KV sync over the fabric: a generic replication channel (snapshot + ordered
//! log identified by replication id and position, partial resync from a
//! bounded backlog, credit-based flow control) and, on top of it, a relay
//! between a real Redis master and real Redis replicas (`redis`).
//!
//! The channel is an ordinary quinn application: one QUIC connection per
//! replica end, carrying any number of sessions. Each session has a control
//! stream (the replica's hello, the master's answer, acks, heartbeats) and the
//! master's log and snapshot streams, so the live log never waits behind the
//! snapshot. ALPN [`ALPN`] names the protocol and its version.
//!
//! Sans-IO parts (time passed in, no sockets): [`frame`] (the codec),
//! [`backlog`], [`flow`] (credit and chunk sizing), [`master::decide`] (the
//! resync decision), and the Redis parsers in [`redis::resp`] and
//! [`redis::rdb`]. The rest is thin tokio glue around them.

pub mod backlog;
pub mod datasets;
pub mod error;
pub mod flow;
pub mod frame;
pub mod master;
pub mod metrics;
pub mod redis;
pub mod replica;
pub mod snapshot;
pub mod stream;

#[cfg(test)]
mod tests;

/// ALPN of the channel: protocol `qr-kv`, generation 1. It stays `qr-kv/1`
/// across frame versions because access policies name channels by it; the
/// frames' own version byte ([`frame::VERSION`], now 2) refuses a relay of
/// another version, naming both versions in the error.
pub const ALPN: &[u8] = b"qr-kv/1";

pub use datasets::Datasets;
pub use error::ChannelError;
pub use master::{Master, MasterConfig};
pub use metrics::Metrics;
pub use replica::{ReplicaConn, Session, SyncStart};
