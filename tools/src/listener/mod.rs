//! Every TCP listener of `qr` (the node agent's OCI API, each `/metrics`
//! endpoint, the KV relay's Redis port) accepts through this module, so each
//! gets the same defences from one place:
//!
//! - a connection cap, with room made by evicting the connection idle longest
//!   ([`slots`]): idle floods cannot lock out a real client;
//! - a request timeout (the protocol's: for HTTP, hyper's header read timeout
//!   from the first byte and between keep-alive requests) and a stall timeout
//!   on writes ([`stall`]): a client that stops reading is dropped;
//! - an accept loop that survives errors ([`accept`]): it counts them, logs
//!   them without flooding, backs off, and on EMFILE evicts an idle connection
//!   to get a descriptor back.

mod accept;
mod slots;
mod stall;
mod stats;

pub use accept::{serve, Ended};
pub use slots::{Admitted, Busy, Refused, Slot, Slots};
pub use stall::StallTimeout;
pub use stats::ListenerStats;

use std::time::Duration;

/// The limits of one TCP listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most; past it a new connection takes the slot of
    /// the one idle longest, or is closed if all are in a request.
    pub max_connections: usize,
    /// A connection must send a complete request head within this, from its
    /// first byte or from its previous response.
    pub request_timeout: Duration,
    /// A connection whose peer takes no bytes of a response for this long is
    /// dropped.
    pub stall_timeout: Duration,
}

impl Limits {
    /// 512 connections, 10 s for a request head, 30 s of write stall: a
    /// scraper or an OCI client is never near them, and 512 descriptors fit
    /// the common soft limit of 1024 with room for the fabric and the cache.
    pub const DEFAULT: Self = Self {
        max_connections: 512,
        request_timeout: Duration::from_secs(10),
        stall_timeout: Duration::from_secs(30),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}
