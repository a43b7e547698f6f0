//! The channel's error type (one per layer: the Redis relay has its own).

use super::frame::{ErrorCode, FrameError};

/// Why a channel session failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The peer sent bytes that are not a valid frame.
    #[error("bad frame from the peer: {0}")]
    Frame(#[from] FrameError),
    /// The peer sent a valid frame the protocol does not allow here.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The peer ended the session with an error frame.
    #[error("the peer ended the session ({code:?}): {message}")]
    Remote {
        /// The peer's code.
        code: ErrorCode,
        /// The peer's message.
        message: String,
    },
    /// The QUIC connection is gone.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// Writing a stream failed.
    #[error("stream write: {0}")]
    Write(#[from] quinn::WriteError),
    /// Reading a stream failed.
    #[error("stream read: {0}")]
    Read(#[from] quinn::ReadError),
    /// A stream ended before the protocol said it would.
    #[error("the peer closed a stream early ({0})")]
    Eof(&'static str),
    /// The snapshot store failed (its file, or the source abandoned it).
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// The replica's position left the master's backlog: it needs a full resync.
    #[error("position {position} fell out of the backlog (which starts at {start}); a full resync follows")]
    BeyondBacklog {
        /// The position the master could not serve.
        position: u64,
        /// The backlog's first position then.
        start: u64,
    },
    /// The master's data started anew (new replication id or epoch).
    #[error("the master's data started anew; resync")]
    Reset,
    /// The history goes on under a new replication id (PSYNC2): the replica
    /// reconnects and continues under it.
    #[error("the master's history goes on under a new replication id; reconnect to continue")]
    Switched,
    /// No answer within the deadline.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The consumer of the session went away.
    #[error("the session's consumer is gone")]
    Closed,
}
