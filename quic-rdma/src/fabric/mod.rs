//! The provider-neutral UD model (docs/architecture.md §2) and its providers.
//!
//! A [`UdQueuePair`] is one UD queue pair with its send and receive completion
//! queues, as a verbs application sees it. Every provider — the in-process
//! [`sim`] fabric, userspace RoCEv2 (`soft`) and libibverbs (`verbs`) — honours
//! the hardware's semantics, so the socket above is one piece of code for all:
//!
//! - a message is at most the active MTU; an oversized send is *silently dropped
//!   and completed as success*, so the socket enforces the MTU itself;
//! - receive buffers start with a 40-byte GRH area ([`grh`]); `byte_len` includes it;
//! - a packet arriving with no posted receive is dropped silently (no RNR for UD);
//! - wrong P_Key (IBA 10.9.3 membership rules), wrong Q_Key and unknown destination
//!   QPN are dropped and counted, by one rule for every provider ([`keys`]);
//! - send completions are in order: a signaled completion retires every earlier send;
//! - work requests reference registered [`memory`], checked by lkey; inline sends
//!   are copied at post time.

// The model's modules are private: each public item has one path, its
// re-export below (the GRH parser's, fuzzed, included). `keys` is the
// providers' receive rule, not API.
pub(crate) mod addr;
pub(crate) mod ah;
pub(crate) mod error;
pub(crate) mod gid;
pub(crate) mod grh;
pub(crate) mod keys;
pub(crate) mod memory;
pub(crate) mod port;
mod provider;
pub(crate) mod qpn_map;
mod recv_queue;
mod send_ledger;
mod send_queue;
pub mod sim;
pub mod soft;
mod stamp;
#[cfg(feature = "verbs")]
pub mod verbs;
pub(crate) mod wr;

use std::task::Waker;

pub use addr::{check_qkey, Qpn, UdAddr, DEFAULT_QKEY, MAX_QPN, ROCEV2_UDP_PORT};
pub use ah::{AhAttr, AhId};
pub use error::FabricError;
pub use gid::Gid;
pub use grh::{ipv4_checksum, Grh, GrhError, GrhLayout};
pub use keys::check_pkey;
pub(crate) use keys::{send_qkey, KeyDrop, PacketKeys, QpKeys};
pub use memory::{Memory, Region, RegionKeeper, RegionStorage, Sge};
pub use port::{Mtu, QpAttr, GRH_LEN};
pub use provider::{Provider, UnknownProvider};
pub use stamp::{StampClock, Timestamp};
pub use wr::{Completion, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus};

/// The P_Key of the default partition (full membership), IBA 10.9.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// Packets a provider dropped before any receive buffer saw them, by cause.
///
/// These are the receiver-side checks of IBA 9.6 / 10.2.4 plus the UD rule that
/// a packet finding no posted receive is discarded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProviderDrops {
    /// P_Key not in the QP's partition (IBA 10.9.3 membership rules).
    pub bad_pkey: u64,
    /// Q_Key did not match the QP's Q_Key, or was privileged (IBA 10.2.4).
    pub bad_qkey: u64,
    /// No QP with the destination QPN exists on the port.
    pub unknown_qpn: u64,
    /// No receive was posted when the packet arrived (receive-queue starvation).
    pub no_recv_posted: u64,
    /// The packet was larger than the posted receive buffer.
    pub too_long: u64,
    /// Malformed on the wire (bad header, truncated, bad padding): `soft` only.
    pub malformed: u64,
    /// Datagrams too short to hold a BTH (12 bytes), zero-length ones included:
    /// `soft` only (a UDP socket delivers what any host sends to the port).
    pub runt: u64,
    /// Datagrams the kernel dropped for the `soft` port's UDP socket before they
    /// could be read, mostly because its receive buffer (`SO_RCVBUF`) was full:
    /// the socket's drop counter (`sk_drops`, what `SO_RXQ_OVFL` reports), read
    /// from `/proc/net/udp` or `/proc/net/udp6`. The kernel counts datagrams, so
    /// a dropped GSO super-datagram counts once however many packets it held.
    pub kernel_rx_dropped: u64,
    /// The ICRC did not verify (RoCEv2 Annex A17.3.3): `soft` only; hardware
    /// drops these before software sees them.
    pub bad_icrc: u64,
    /// Sent larger than the path MTU: dropped by the "hardware" while the send
    /// still completed successfully.
    pub oversize_sent: u64,
}

/// Asynchronous events of a port or QP (`ibv_get_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// Our port's GID changed (e.g. the IP address moved): every address handle
    /// must be rebuilt, since AHs carry the source GID index.
    GidChanged {
        /// The new GID.
        new: Gid,
    },
    /// The port went down.
    PortDown,
    /// The port came back.
    PortActive,
    /// The QP entered the error state and must be rebuilt.
    QpFatal,
}

/// One UD queue pair with its completion queues: the provider trait.
///
/// All methods are non-blocking. `post_*` follow `ibv_post_send`/`ibv_post_recv`:
/// a list of work requests is one doorbell; an error names the first WR not posted.
pub trait UdQueuePair: Send + 'static {
    /// What the QP and its port granted.
    fn attr(&self) -> &QpAttr;

    /// Register a region for sends and receives; sets its lkey.
    fn register(&mut self, region: &mut Region) -> Result<(), FabricError>;

    /// Deregister a region registered with this QP (`ibv_dereg_mr`) and clear
    /// its lkey: a work request naming that key afterwards is refused or
    /// completes with a protection error, as on hardware. For a region no
    /// posted work request points into — e.g. one whose memory moved (a lent
    /// `Vec` that reallocated), so that the device's mapping would otherwise
    /// keep pointing at memory the allocator reuses. Its storage still goes to
    /// the keeper (if any) when it drops.
    fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError>;

    /// Create an address handle.
    fn create_ah(&mut self, attr: &AhAttr) -> Result<AhId, FabricError>;

    /// Destroy an address handle. Hardware leaves destroying an AH under an
    /// in-flight send undefined; providers that can tell refuse with `AhBusy`.
    fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError>;

    /// Post a chain of sends with one doorbell. On error, `.0` WRs were posted.
    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)>;

    /// Post a chain of receives. On error, `.0` WRs were posted.
    ///
    /// `mem` is borrowed mutably because from here on a device may write into
    /// the posted buffers: no reference into `mem` may be alive while it does,
    /// and until each receive completes the region accessors refuse its bytes
    /// ([`Region::slice`]).
    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)>;

    /// Poll up to `out.len()` send completions (only signaled sends complete).
    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize;

    /// Poll up to `out.len()` receive completions; the data is in the posted buffers
    /// (providers that cannot DMA write it into `mem` here).
    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize;

    /// Ask to be woken on the next completion of either queue
    /// (`ibv_req_notify_cq`). Returns `true` if completions may already be waiting,
    /// in which case the caller must poll again before sleeping (or lose a wake-up).
    ///
    /// Arming may consume what would have woken an earlier sleeper (`verbs`
    /// takes the completion channel's pending events and polls completions
    /// ahead), and the completions waiting may be of either queue: a caller
    /// with several sleepers on one queue pair wakes them all when this
    /// returns `true` (the quinn adapter's wake hub does).
    fn arm(&mut self, waker: &Waker) -> bool;

    /// Next asynchronous event, if any.
    fn poll_event(&mut self) -> Option<AsyncEvent>;

    /// Bring the QP back from the error state to ready-to-send, keeping its QPN
    /// (IBA 10.3.1: Error → Reset → Init → RTR → RTS), so peers and address
    /// handles stay valid. A QP enters the error state on a fatal event
    /// ([`AsyncEvent::QpFatal`]) or when a work request completes in error
    /// (IBA 10.8.3); from then on every WR is flushed (`WrFlushErr`).
    ///
    /// Afterwards no WR is outstanding and completions not yet polled are
    /// discarded: the caller owns again every receive buffer it had posted and
    /// every send it had not seen complete, and must post receives anew. A
    /// [`AsyncEvent::QpFatal`] still queued describes the QP before the reset
    /// and is dropped (so it cannot reset the recovered QP once more); other
    /// events are kept.
    fn recover(&mut self) -> Result<(), FabricError>;

    /// A file descriptor that becomes readable when [`UdQueuePair::arm`] alone
    /// cannot wake the caller: the UDP socket of `soft`, the completion channel of
    /// `verbs`. Async adapters wait on it (e.g. with tokio's `AsyncFd`) and then
    /// poll; providers that wake the armed waker themselves (`sim`) return `None`.
    fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Provider-level drop counters.
    fn drops(&self) -> ProviderDrops;

    /// Stamp every later send and receive completion with the time it
    /// happened ([`Completion::timestamp`]), on the clock returned. Off until
    /// called: a QP that never enables it reads no clock. A provider whose
    /// device has no completion clock refuses with
    /// [`FabricError::NoCompletionClock`] (the default, for QPs with no
    /// clock of their own: test doubles, wrappers).
    fn enable_timestamps(&mut self) -> Result<StampClock, FabricError> {
        Err(FabricError::NoCompletionClock {
            device: "this queue pair".into(),
            detail: "its provider keeps no completion clock".into(),
        })
    }
}

/// In the `drops` group, next to the socket's own drops (see
/// [`SocketStats`](crate::socket::SocketStats)).
impl crate::counters::Counters for ProviderDrops {
    fn visit(&self, f: &mut dyn FnMut(crate::counters::Metric)) {
        crate::visit_fields!(f, self, Some("drops");
            bad_pkey: Counter, Count, "Provider drops: P_Key not in the partition";
            bad_qkey: Counter, Count, "Provider drops: Q_Key mismatch";
            unknown_qpn: Counter, Count, "Provider drops: unknown destination QPN";
            no_recv_posted: Counter, Count, "Provider drops: no receive posted";
            too_long: Counter, Count, "Provider drops: larger than the receive buffer";
            malformed: Counter, Count, "Provider drops: malformed on the wire";
            runt: Counter, Count, "Provider drops: shorter than a BTH";
            kernel_rx_dropped: Counter, Count, "Provider drops: kernel receive buffer full";
            bad_icrc: Counter, Count, "Provider drops: ICRC did not verify";
            oversize_sent: Counter, Count, "Provider drops: sent above the path MTU";
        );
    }
}
