//! The socket layer's error type.

use crate::fabric::FabricError;

/// Errors of the UD socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// A datagram is larger than the active MTU. Hardware would drop it silently
    /// and report success, so the socket refuses it instead.
    #[error("datagram of {len} bytes exceeds the active MTU of {mtu} bytes")]
    Oversize {
        /// The datagram's length.
        len: usize,
        /// The active MTU.
        mtu: usize,
    },
    /// No send-queue room or free send slot right now; retry after completions.
    #[error("send queue full; retry after completions")]
    WouldBlock,
    /// A misconfiguration of the socket.
    #[error("invalid socket configuration: {0}")]
    Config(String),
    /// The queue pair entered the error state and could not be brought back;
    /// the socket can neither send nor receive. Open a new queue pair.
    #[error("queue pair failed and could not be recovered ({0}); open a new queue pair")]
    QpFailed(String),
    /// The provider failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

impl From<SocketError> for std::io::Error {
    fn from(e: SocketError) -> Self {
        use std::io::ErrorKind;
        let kind = match &e {
            SocketError::WouldBlock => ErrorKind::WouldBlock,
            SocketError::Oversize { .. } | SocketError::Config(_) => ErrorKind::InvalidInput,
            SocketError::QpFailed(_) => ErrorKind::BrokenPipe,
            SocketError::Fabric(FabricError::Io(io)) => io.kind(),
            SocketError::Fabric(_) => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
