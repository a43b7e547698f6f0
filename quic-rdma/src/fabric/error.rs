//! The fabric layer's error type.

use std::net::SocketAddr;

/// Errors of the fabric layer (providers and the UD model).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// No RDMA device is present (or the kernel has no RDMA support).
    #[error("no RDMA device found ({detail}); use `--provider soft` for userspace RoCEv2 over UDP, `--provider sim` for the in-process fabric, or load rdma_rxe and run `rdma link add rxe0 type rxe netdev <if>`")]
    NoDevice {
        /// What the probe saw.
        detail: String,
    },
    /// A Q_Key with the privileged top bit was configured.
    #[error(
        "Q_Key {0:#010x} is privileged (top bit set, IBA 10.2.4); choose a Q_Key below 0x80000000"
    )]
    PrivilegedQkey(u32),
    /// A P_Key with partition number 0 was configured (invalid, IBA 10.9.1).
    #[error("P_Key {0:#06x} is invalid (partition number 0, IBA 10.9.1); use the default partition 0xffff or a P_Key whose low 15 bits are not zero")]
    InvalidPkey(u16),
    /// The send or receive queue has no room for the work request.
    #[error("work queue full ({0} outstanding); poll completions first")]
    QueueFull(usize),
    /// The address handle does not exist (or was destroyed).
    #[error("unknown address handle {0}")]
    InvalidAh(u32),
    /// An address handle was destroyed while a send using it was still in flight.
    #[error("address handle {0} still has sends in flight")]
    AhBusy(u32),
    /// A memory region could not be registered.
    #[error("memory registration failed: {0}")]
    Registration(String),
    /// A `SocketAddr` that does not map to a UD address.
    #[error("{0} is not a UD address (expected [gid]:4791 with scope id = QPN)")]
    NotAUdAddress(SocketAddr),
    /// The destination GID is not reachable on this fabric.
    #[error("GID {0} is not reachable")]
    Unreachable(crate::fabric::Gid),
    /// The queue pair is in the error state.
    #[error("queue pair in error state: {0}")]
    QpError(String),
    /// Completion time stamps were asked of a device (or provider) that
    /// cannot give them: no completion clock, or one this provider does not
    /// read yet (`detail` says which).
    #[error("RDMA device {device} gives no completion time stamps ({detail}); leave completion time stamps off, or use the sim or soft provider, whose stamps are software")]
    NoCompletionClock {
        /// The device's name.
        device: String,
        /// Why (e.g. the capability the device lacks).
        detail: String,
    },
    /// An I/O error from the provider's underlying OS resources.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
