//! The socket layer's error type.

use crate::fabric::FabricError;

/// Errors of the UD socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// A datagram is larger than the socket takes: the active MTU, or the
    /// segmented datagram size on a fabric below 2048 ([`UdSocket::mtu`](super::UdSocket::mtu)).
    /// Hardware would drop an oversized UD message silently and report
    /// success, so the socket refuses it instead.
    #[error("datagram of {len} bytes exceeds the socket's limit of {mtu} bytes (the active MTU, or what fits in 2048 bytes of parts below 2048)")]
    Oversize {
        /// The datagram's length.
        len: usize,
        /// The largest datagram the socket takes ([`UdSocket::mtu`](super::UdSocket::mtu)).
        mtu: usize,
    },
    /// With segmentation off, the active MTU cannot carry QUIC's 1200-byte
    /// datagrams ([`QUIC_MIN_DATAGRAM`](super::QUIC_MIN_DATAGRAM)); the
    /// message names the fix, larger frames on the netdev.
    #[error("active MTU {active} is below QUIC's 1200-byte minimum datagram (RFC 9000 §14); enable jumbo frames on the netdev (e.g. `ip link set <if> mtu 9000`, giving RoCE MTU 4096)")]
    MtuTooSmall {
        /// The port's active MTU in bytes.
        active: usize,
    },
    /// No send-queue room or free send slot right now; nothing was posted.
    /// Retry after completions.
    #[error("send queue full; retry after completions")]
    WouldBlock,
    /// A datagram of more segments than the send queue or slot pool can ever
    /// hold at once: it could never be posted whole. Send fewer segments per call.
    #[error("{segments} segments in one send exceed the {max} the send queue can hold; send fewer per call")]
    TooManySegments {
        /// Segments in the datagram.
        segments: usize,
        /// The most one send can post.
        max: usize,
    },
    /// The provider refused a post part way: the first `posted` segments are on
    /// the wire, the rest are not (and must not be sent again as a whole, or the
    /// first ones would be duplicated). To QUIC the rest is lost packets.
    #[error("provider posted {posted} of {segments} segments: {source}")]
    PartiallyPosted {
        /// Segments posted.
        posted: usize,
        /// Segments in the datagram.
        segments: usize,
        /// Why the provider refused the rest.
        source: FabricError,
    },
    /// A datagram to be sent as parts carries immediate data wider than the
    /// 30 bits a part has room for (docs/architecture.md §6).
    #[error("immediate data {0:#010x} is wider than the 30 bits a segmented datagram carries")]
    ImmTooWide(u32),
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
            SocketError::Oversize { .. }
            | SocketError::Config(_)
            | SocketError::ImmTooWide(_)
            | SocketError::TooManySegments { .. } => ErrorKind::InvalidInput,
            // MtuTooSmall: the kind it had as a fabric error before the
            // socket owned the rule.
            SocketError::PartiallyPosted { .. } | SocketError::MtuTooSmall { .. } => {
                ErrorKind::Other
            }
            SocketError::QpFailed(_) => ErrorKind::BrokenPipe,
            SocketError::Fabric(FabricError::Io(io)) => io.kind(),
            SocketError::Fabric(_) => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
