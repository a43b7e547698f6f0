//! The engine layer's one error type.

use quinn_proto::{ConnectError, ConnectionError};

use crate::socket::SocketError;

/// Errors of the poll-mode [`Engine`](super::Engine).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The connection handle is unknown, or names a connection that has been
    /// drained and freed (handles carry a generation, so a reused slot is caught).
    #[error("unknown or stale connection handle")]
    UnknownConnection,
    /// The incoming-connection id is unknown or was already decided.
    #[error("unknown or already decided incoming connection")]
    UnknownIncoming,
    /// Nothing can be done right now (no stream credit, no data to read, send
    /// buffer full); retry after the next [`Engine::poll`](super::Engine::poll)
    /// reports the matching event.
    #[error("operation would block")]
    WouldBlock,
    /// The stream is not open for this operation (never opened, already
    /// finished, reset, stopped, or of the wrong direction).
    #[error("stream closed or unknown")]
    ClosedStream,
    /// The peer reset the stream (RESET_STREAM) with this application error code.
    #[error("stream reset by peer with code {0}")]
    StreamReset(u64),
    /// The peer asked us to stop sending (STOP_SENDING) with this application error code.
    #[error("stream stopped by peer with code {0}")]
    StreamStopped(u64),
    /// The caller's buffer cannot hold the item (a datagram); nothing was lost,
    /// call again with at least `needed` bytes.
    #[error("buffer too small: {needed} bytes needed")]
    BufferTooSmall {
        /// Bytes the item needs.
        needed: usize,
    },
    /// The datagram is larger than the path allows right now.
    #[error("datagram of {len} bytes exceeds the maximum of {max}")]
    DatagramTooLarge {
        /// The datagram's length.
        len: usize,
        /// The current maximum.
        max: usize,
    },
    /// The peer does not accept datagrams, or they are disabled locally.
    #[error("datagrams not supported on this connection")]
    DatagramsUnsupported,
    /// The connection is closed or lost; the reason is attached.
    #[error("connection closed: {0}")]
    ConnectionLost(ConnectionError),
    /// `connect` without a client configuration in the engine's config.
    #[error("the engine has no client configuration")]
    NoClientConfig,
    /// quinn-proto refused to start the connection (bad address, CIDs exhausted, ...).
    /// The reason is the error's source (not repeated in its message, so a
    /// report that prints the chain says it once).
    #[error("connect failed")]
    Connect(#[from] ConnectError),
    /// An argument is out of range (error code above 2^62, non-UD address, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The TLS configuration could not be built (bad certificate or key).
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The UD socket failed (creation, or a provider error on the data path).
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The spin-then-sleep [`Waiter`](super::Waiter) could not get its wake-up
    /// descriptor (an eventfd): the process is out of file descriptors.
    #[error("waiter eventfd: {0} (raise the open-file limit, ulimit -n)")]
    Wait(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_not_repeated_in_the_message() {
        let e = EngineError::from(ConnectError::InvalidRemoteAddress(
            "[::1]:0".parse().unwrap(),
        ));
        let source = std::error::Error::source(&e).unwrap().to_string();
        assert!(!e.to_string().contains(&source), "{e}: {source}");
    }
}
