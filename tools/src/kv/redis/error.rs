//! The relay's error type.

use super::rdb::RdbError;
use super::resp::RespError;
use crate::kv::error::ChannelError;

/// Why a relay link (to a Redis master, a Redis replica, or across the
/// fabric) failed. Each closes only its own link.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The TCP link failed.
    #[error("redis link: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent malformed RESP.
    #[error("malformed RESP from the peer: {0}")]
    Resp(#[from] RespError),
    /// The master's snapshot framing is malformed.
    #[error("malformed RDB framing from the master: {0}")]
    Rdb(#[from] RdbError),
    /// The peer answered the replication handshake unexpectedly.
    #[error("replication handshake: {0}")]
    Handshake(String),
    /// The peer asked for something this relay does not do.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The channel across the fabric failed.
    #[error("channel: {0}")]
    Channel(#[from] ChannelError),
    /// Reaching the other relay failed.
    #[error("dialing the upstream relay: {0}")]
    Dial(String),
    /// A replica asked to sync without authenticating, or with a wrong
    /// password (its link is closed).
    #[error("replica not authenticated: {0}")]
    Unauthenticated(&'static str),
    /// The server followed is no longer the master (a failover); the relay
    /// links to the new one.
    #[error("{0} is no longer the master")]
    MasterMoved(String),
    /// The peer said nothing for too long.
    #[error("timed out: {0}")]
    Timeout(&'static str),
}

impl RelayError {
    /// Whether the peer sent bytes that are not the protocol (counted as malformed).
    pub fn is_malformed(&self) -> bool {
        matches!(
            self,
            RelayError::Resp(_) | RelayError::Rdb(_) | RelayError::Handshake(_)
        )
    }
}
