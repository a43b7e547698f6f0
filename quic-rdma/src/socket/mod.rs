//! The UD socket: what replaces a UDP socket under QUIC (docs/architecture.md §4).
//!
//! One [`UdSocket`] drives one UD queue pair of any provider:
//! - send: one `post_send` per batch (chained WRs, one doorbell); a GSO-style
//!   datagram with a segment size becomes one WR per segment; selective
//!   signaling; inline for packets at or under min(threshold, granted max_inline);
//!   the MTU enforced with an error (hardware would drop silently);
//! - receive: completions polled in batches, the GRH parsed for the source GID
//!   and ECN, the immediate data handed up as it came, receives reposted in
//!   batches; completions the provider could not have produced dropped and counted;
//! - address handles cached per GID path (an LRU), rebuilt when our own GID
//!   changes, destroyed only after their sends completed; counters for
//!   everything ([`SocketStats`]);
//! - a queue pair that enters the error state (a fatal event, or a work request
//!   completed in error) is recovered with its QPN: every buffer it held comes
//!   back and the receive queue is filled again;
//! - segmentation on fabric MTUs below 2048 ([`segment`]): a datagram larger
//!   than the active MTU goes as 2..=16 parts, reassembled on receive within
//!   bounded memory and a timeout ([`Reassembler`]);
//! - zero-copy transmit buffers ([`UdSocket::take_tx_buf`],
//!   [`UdSocket::send_tx_buf`]): registered `Vec`s lent to quinn-proto's
//!   `poll_transmit`, whose WRs point at what it wrote (the engine's send path;
//!   see `tx_buf`'s docs for the lifecycle and the reallocation fallback).
//!
//! The socket allocates nothing per packet: slots come from registered regions.
//!
//! The socket knows nothing of QUIC: what the immediate data means is its
//! caller's business (the QUIC side's `routing` module decides it).

mod ah_cache;
mod error;
mod pool;
mod reassembly;
mod recv;
pub mod segment;
mod send;
mod send_parts;
mod stats;
mod tx_buf;

use std::collections::VecDeque;
use std::task::Waker;

pub use error::SocketError;
pub use reassembly::{Reassembled, Reassembler, ReassemblyConfig, ReassemblyStats};
pub use recv::Received;
pub use stats::SocketStats;
pub use tx_buf::{TxBuf, TxSendError, TX_BUF_OVERRUN};

use crate::fabric::grh::GrhLayout;
use crate::fabric::memory::REGION_ALIGN;
use crate::fabric::{
    AsyncEvent, Completion, Gid, Memory, Mtu, QpAttr, Qpn, RecvWr, Region, SendWr, UdAddr,
    UdQueuePair,
};
use ah_cache::{AhCache, AhRef};
use pool::{SlotId, SlotPool};
use tx_buf::TxPool;

/// Largest number of WRs in one `post_send` (and quinn's GSO segments per transmit).
pub const MAX_SEND_BATCH: usize = 64;
/// Receive completions polled per `poll_cq` call.
pub const RECV_POLL_BATCH: usize = 32;

/// The smallest UDP payload QUIC accepts (RFC 9000 §14.1). The fabric only
/// states its MTU; this socket, QUIC's datagram carrier, refuses an MTU below
/// it when segmentation is off ([`SocketError::MtuTooSmall`]), since every
/// QUIC Initial would be dropped as oversize.
pub const QUIC_MIN_DATAGRAM: usize = 1200;

/// Tuning of a [`UdSocket`].
#[derive(Clone, Debug)]
pub struct SocketConfig {
    /// Send inline at or under this many bytes (capped by the QP's granted `max_inline`).
    pub inline_threshold: usize,
    /// Signal one send in this many (selective signaling).
    pub signal_every: u32,
    /// Most receives to keep posted (capped by the QP's `max_recv_wr`): the
    /// receive buffers registered.
    pub recv_depth: usize,
    /// Receives posted at first (at most `recv_depth`). The posted window
    /// doubles toward `recv_depth` whenever a poll finds a quarter of it or
    /// less still posted (the receiver fell behind, and a UD packet that
    /// finds no posted receive is lost); it never shrinks. A small window
    /// keeps the buffers a busy receiver cycles through in the CPU's cache,
    /// for a receiver that polls often; one that takes packets in large
    /// batches overflows it (losses) before it grows. Default `usize::MAX`:
    /// all of `recv_depth` posted.
    pub recv_start: usize,
    /// Repost receives once this many are consumed.
    pub repost_batch: usize,
    /// Send slots (payload buffers for non-inline sends in flight).
    pub send_slots: usize,
    /// Size of each registered region (1–4 MiB).
    pub region_bytes: usize,
    /// Address handles kept live before the least recently used is retired.
    pub ah_capacity: usize,
    /// Most zero-copy transmit buffers ([`UdSocket::take_tx_buf`]), each
    /// `max_segments × MTU` bytes (and 2 KiB of room for what quinn-proto
    /// writes and takes back), registered when first needed.
    pub tx_bufs: usize,
    /// Segmentation for small fabric MTUs (docs/architecture.md §6, "Segmented
    /// datagrams"): on an active MTU below 2048, offer datagrams of up to
    /// [`segment::datagram_mtu`] bytes and send a larger one as parts; take
    /// parts apart on receive. Default on. Off: an active MTU below QUIC's
    /// 1200 bytes is refused ([`SocketError::MtuTooSmall`])
    /// and parts are handed up as they came.
    pub segmentation: bool,
    /// Bounds and timeout of the reassembly of parts.
    pub reassembly: ReassemblyConfig,
}

impl SocketConfig {
    /// Size the receive queue from the connection's receive window: enough posted
    /// receives for one window of MTU-sized packets (clamped to 256..=8192), since
    /// a UD packet that finds no posted receive is lost.
    pub fn sized_for(window_bytes: u64, mtu: usize) -> Self {
        let depth = window_bytes.div_ceil(mtu.max(1) as u64).clamp(256, 8192) as usize;
        SocketConfig {
            recv_depth: depth,
            ..SocketConfig::default()
        }
    }
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            inline_threshold: 64,
            signal_every: 16,
            recv_depth: 2048,
            // All of recv_depth, whatever it is set to: a receiver that
            // consumes in big batches (quinn's endpoint driver behind the
            // adapter) overflowed a 512 window under load. The busy-polled
            // engine starts smaller (EngineConfig).
            recv_start: usize::MAX,
            repost_batch: 16,
            send_slots: 1024,
            region_bytes: 2 << 20,
            ah_capacity: 1024,
            // 8 MiB at a 4096-byte MTU; a full-MTU GSO batch each, so 32
            // cover more sends in flight than a send queue of 1024 holds.
            tx_bufs: 32,
            segmentation: true,
            reassembly: ReassemblyConfig::default(),
        }
    }
}

/// A send posted and not yet retired by a completion.
#[derive(Debug)]
struct InflightSend {
    wr_id: u64,
    slot: Option<SlotId>,
    ah: AhRef,
    /// The transmit buffer this WR is the last one of: free once it retires.
    tx_buf: Option<u32>,
}

/// A UDP-socket replacement over one UD queue pair (see the [module docs](self)).
pub struct UdSocket<Q: UdQueuePair = Box<dyn UdQueuePair>> {
    // Declared first so it drops first: the QP (and with it every posted receive
    // the device may still write into) must be gone before the registered memory.
    qp: Q,
    mem: Memory,
    send_pool: SlotPool,
    recv_pool: SlotPool,
    tx_pool: TxPool,
    /// Staging memory for inline sends (copied into the WQE at post time).
    stage_region: u32,
    stage_stride: usize,
    ahs: AhCache,
    inflight: VecDeque<InflightSend>,
    wrs: Vec<SendWr>,
    wr_ahs: Vec<AhRef>,
    wr_slots: Vec<Option<SlotId>>,
    reposts: Vec<RecvWr>,
    /// Completion buffers for [`UdSocket::reap_sends`] and the receive path,
    /// kept rather than built per call: an idle busy poll calls both, and
    /// filling 32 fresh completions each time cost more than the poll.
    send_wcs: Vec<Completion>,
    recv_wcs: Vec<Completion>,
    recv_posted: usize,
    /// Receives to keep posted now: from `recv_start`, doubling toward
    /// `recv_depth` under pressure (see [`SocketConfig::recv_start`]).
    recv_window: usize,
    /// Which receive slots the provider holds: a completion for any other
    /// wr_id (never posted, or already returned) is bogus and dropped.
    recv_slot_posted: Vec<bool>,
    next_wr_id: u64,
    since_signal: u32,
    inline_max: usize,
    /// [`UdSocket::max_segments`], fixed at creation (as the buffers sized by it).
    max_segments: usize,
    /// The largest datagram the caller may send: the active MTU, or above it
    /// with segmentation ([`segment::datagram_mtu`]).
    mtu: usize,
    /// The active MTU: the largest UD message.
    fabric_mtu: usize,
    /// Id of the next segmented datagram sent (24 bits on the wire).
    next_part_id: u32,
    /// Parts of datagrams received, keyed by source (GID, QPN).
    reassembly: Reassembler<(Gid, Qpn)>,
    layout: GrhLayout,
    local: UdAddr,
    cfg: SocketConfig,
    stats: SocketStats,
    /// Set when recovering the QP failed: every send is refused with it.
    failed: Option<String>,
    /// The stamp of the latest send completion reaped, while the QP stamps
    /// completions ([`enable_timestamps`](Self::enable_timestamps)).
    last_send_stamp: Option<crate::fabric::Timestamp>,
}

impl<Q: UdQueuePair> UdSocket<Q> {
    /// Build a socket over `qp`: register its memory and fill the receive queue.
    ///
    /// Fails with [`SocketError::MtuTooSmall`]
    /// (naming jumbo frames as the fix) if the active MTU cannot carry QUIC's
    /// 1200-byte datagrams (RFC 9000 §14) and segmentation is off, and with a
    /// configuration error for nonsense tuning.
    pub fn new(mut qp: Q, cfg: SocketConfig) -> Result<Self, SocketError> {
        let attr = qp.attr().clone();
        let fabric_mtu = attr.active_mtu.bytes();
        let mtu = if cfg.segmentation {
            segment::datagram_mtu(fabric_mtu)
        } else {
            if fabric_mtu < QUIC_MIN_DATAGRAM {
                return Err(SocketError::MtuTooSmall { active: fabric_mtu });
            }
            fabric_mtu
        };
        crate::fabric::check_qkey(attr.qkey)?;
        if cfg.signal_every == 0 || cfg.repost_batch == 0 || cfg.send_slots == 0 || cfg.tx_bufs == 0
        {
            return Err(SocketError::Config(
                "signal_every, repost_batch, send_slots and tx_bufs must be at least 1".into(),
            ));
        }
        if !(1 << 20..=4 << 20).contains(&cfg.region_bytes) {
            return Err(SocketError::Config(format!(
                "region_bytes {} outside 1..4 MiB",
                cfg.region_bytes
            )));
        }
        let recv_depth = cfg.recv_depth.min(attr.max_recv_wr as usize).max(1);
        let mut mem = Memory::new();
        let send_pool = SlotPool::new(
            &mut qp,
            &mut mem,
            fabric_mtu,
            cfg.send_slots,
            cfg.region_bytes,
            cfg.send_slots,
        )?;
        // Receive buffers are registered as the posted window grows to need them.
        let recv_pool = SlotPool::new(
            &mut qp,
            &mut mem,
            fabric_mtu,
            recv_depth,
            cfg.region_bytes,
            cfg.recv_start.clamp(1, recv_depth),
        )?;
        let inline_max = cfg.inline_threshold.min(attr.max_inline as usize);
        let stage_stride = inline_max.div_ceil(REGION_ALIGN).max(1) * REGION_ALIGN;
        let mut stage = Region::new(stage_stride * MAX_SEND_BATCH);
        qp.register(&mut stage)?;
        let stage_region = mem.push(stage);
        // A full-size datagram takes this many WRs (and slots): a transmit of
        // max_segments of them must fit the send queue whole.
        let wrs_per_datagram = segment::parts_for(mtu, fabric_mtu);
        let max_segments = (max_segments(&attr, &send_pool) / wrs_per_datagram).max(1);
        let mut s = UdSocket {
            mem,
            tx_pool: TxPool::new(cfg.tx_bufs, max_segments * mtu + TX_BUF_OVERRUN),
            send_pool,
            recv_pool,
            stage_region,
            stage_stride,
            ahs: AhCache::new(cfg.ah_capacity),
            inflight: VecDeque::with_capacity(attr.max_send_wr as usize),
            wrs: Vec::with_capacity(MAX_SEND_BATCH),
            wr_ahs: Vec::with_capacity(MAX_SEND_BATCH),
            wr_slots: Vec::with_capacity(MAX_SEND_BATCH),
            reposts: Vec::with_capacity(recv_depth),
            send_wcs: vec![Completion::send(0); send::SEND_POLL_BATCH],
            recv_wcs: vec![Completion::send(0); RECV_POLL_BATCH],
            recv_posted: 0,
            recv_window: cfg.recv_start.clamp(1, recv_depth),
            recv_slot_posted: vec![false; recv_depth],
            next_wr_id: 0,
            since_signal: 0,
            inline_max,
            max_segments,
            mtu,
            fabric_mtu,
            next_part_id: 0,
            reassembly: Reassembler::new(cfg.reassembly),
            layout: GrhLayout::for_gid(attr.gid),
            local: UdAddr::new(attr.gid, attr.qpn, attr.qkey),
            cfg: SocketConfig {
                recv_depth,
                repost_batch: cfg.repost_batch.min(recv_depth),
                ..cfg
            },
            stats: SocketStats::default(),
            failed: None,
            last_send_stamp: None,
            qp,
        };
        s.fill_recv_queue()?;
        Ok(s)
    }
}

impl<Q: UdQueuePair> UdSocket<Q> {
    /// Our UD address (GID, QPN, Q_Key).
    pub fn local_addr(&self) -> UdAddr {
        self.local
    }

    /// The largest datagram [`UdSocket::send`] accepts: the active MTU, or
    /// more on a fabric below 2048 with segmentation on (datagrams larger than
    /// the active MTU go as parts; see [`segment::datagram_mtu`]). What QUIC
    /// may send.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The active MTU in bytes: the largest UD message.
    pub fn fabric_mtu(&self) -> usize {
        self.fabric_mtu
    }

    /// Whether datagrams larger than the active MTU are sent as parts.
    pub fn segments(&self) -> bool {
        self.mtu > self.fabric_mtu
    }

    /// The active MTU as the IB enumeration.
    pub fn active_mtu(&self) -> Mtu {
        self.qp.attr().active_mtu
    }

    /// What the queue pair granted.
    pub fn qp_attr(&self) -> &QpAttr {
        self.qp.attr()
    }

    /// The largest datagram sent inline.
    pub fn inline_max(&self) -> usize {
        self.inline_max
    }

    /// Receives the socket keeps posted now: [`SocketConfig::recv_start`] at
    /// first, doubled toward [`SocketConfig::recv_depth`] each time the
    /// receiver fell behind.
    pub fn recv_window(&self) -> usize {
        self.recv_window
    }

    /// The socket's configuration (after capping by what the QP granted).
    pub fn config(&self) -> &SocketConfig {
        &self.cfg
    }

    /// A copy of every counter, the provider's drops included.
    pub fn stats(&self) -> SocketStats {
        let mut s = self.stats;
        s.provider = self.qp.drops();
        let r = self.reassembly.stats();
        s.seg_parts_received = r.parts;
        s.seg_reassembled = r.reassembled;
        s.seg_expired = r.expired;
        s.seg_evicted = r.evicted;
        s.seg_malformed = r.malformed;
        s.seg_duplicates = r.duplicates;
        s
    }

    /// Stamp every later send and receive completion with when it happened
    /// (docs/architecture.md §2, *Completion time stamps*): received datagrams
    /// then carry [`Received::timestamp`], and
    /// [`last_send_timestamp`](Self::last_send_timestamp) tells when the
    /// latest signaled send left. Off by default; returns the clock the stamps
    /// are on, or the provider's refusal (a device with no completion clock).
    pub fn enable_timestamps(&mut self) -> Result<crate::fabric::StampClock, SocketError> {
        Ok(self.qp.enable_timestamps()?)
    }

    /// When the latest send whose completion was reaped left (a signaled
    /// send's completion covers the earlier unsignaled ones: IBA 10.8.3), on
    /// the clock [`enable_timestamps`](Self::enable_timestamps) returned;
    /// `None` until then.
    pub fn last_send_timestamp(&self) -> Option<crate::fabric::Timestamp> {
        self.last_send_stamp
    }

    /// Sends posted and not yet retired by a completion.
    pub fn sends_in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Address handles live in the cache, and retired ones awaiting their last completion.
    pub fn ah_counts(&self) -> (usize, usize) {
        (self.ahs.live(), self.ahs.retired_pending())
    }

    /// The queue pair (for provider-specific controls).
    pub fn queue_pair(&self) -> &Q {
        &self.qp
    }

    /// The provider's readiness descriptor, if it has one (see
    /// [`UdQueuePair::readiness_fd`]).
    pub fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.qp.readiness_fd()
    }

    /// Ask to be woken when a completion (send or receive) or event arrives.
    /// Returns `true` if one may already be waiting: poll again before sleeping.
    pub fn arm(&mut self, waker: &Waker) -> bool {
        self.qp.arm(waker)
    }

    /// Handle the provider's asynchronous events (GID change → rebuild every AH).
    pub fn handle_events(&mut self) {
        while let Some(ev) = self.qp.poll_event() {
            self.stats.async_events += 1;
            match ev {
                AsyncEvent::GidChanged { new } => {
                    tracing::info!(old = %self.local.gid, %new, "local GID changed; rebuilding address handles");
                    self.stats.gid_changes += 1;
                    self.local.gid = new;
                    self.layout = GrhLayout::for_gid(new);
                    self.ahs.retire_all(&mut self.qp, &mut self.stats);
                }
                AsyncEvent::QpFatal => self.recover_qp(),
                other => tracing::warn!(event = ?other, "asynchronous event"),
            }
        }
    }

    /// The QP is in the error state: bring it back (same QPN, so peers and AHs
    /// stay valid) and take back everything it held. Sends that had not
    /// completed are lost, as on any lossy path; QUIC retransmits them.
    pub(super) fn recover_qp(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.qp.recover() {
            tracing::error!(%e, qpn = self.local.qpn, "queue pair could not be recovered");
            self.stats.qp_recovery_failures += 1;
            self.failed = Some(e.to_string());
            return;
        }
        self.stats.qp_recoveries += 1;
        tracing::warn!(
            qpn = self.local.qpn,
            lost_sends = self.inflight.len(),
            "queue pair was in the error state; recovered"
        );
        while let Some(s) = self.inflight.pop_front() {
            self.retire_send(s);
        }
        self.since_signal = 0;
        // Every receive slot is free again (posted ones were discarded with the
        // WRs; those awaiting repost are simply posted anew).
        self.reposts.clear();
        self.recv_pool.release_all();
        self.recv_posted = 0;
        self.recv_slot_posted.fill(false);
        if let Err(e) = self.fill_recv_queue() {
            tracing::error!(%e, "posting receives after recovery failed");
        }
    }
}

/// The most segments one send can take: the send queue's depth and the slot
/// pool bound it (see [`UdSocket::max_segments`]).
fn max_segments(attr: &QpAttr, send_pool: &SlotPool) -> usize {
    MAX_SEND_BATCH
        .min(attr.max_send_wr as usize)
        .min(send_pool.total())
        .max(1)
}

impl<Q: UdQueuePair> Drop for UdSocket<Q> {
    fn drop(&mut self) {
        tracing::debug!(local = %self.local.gid, qpn = self.local.qpn, stats = ?self.stats(), "UD socket closed");
    }
}

impl<Q: UdQueuePair> std::fmt::Debug for UdSocket<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdSocket")
            .field("local", &self.local)
            .field("mtu", &self.mtu)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<T: UdQueuePair + ?Sized> UdQueuePair for Box<T> {
    fn attr(&self) -> &QpAttr {
        (**self).attr()
    }
    fn register(&mut self, region: &mut Region) -> Result<(), crate::fabric::FabricError> {
        (**self).register(region)
    }
    fn deregister(&mut self, region: &mut Region) -> Result<(), crate::fabric::FabricError> {
        (**self).deregister(region)
    }
    fn create_ah(
        &mut self,
        attr: &crate::fabric::AhAttr,
    ) -> Result<crate::fabric::AhId, crate::fabric::FabricError> {
        (**self).create_ah(attr)
    }
    fn destroy_ah(&mut self, ah: crate::fabric::AhId) -> Result<(), crate::fabric::FabricError> {
        (**self).destroy_ah(ah)
    }
    fn post_send(
        &mut self,
        mem: &Memory,
        wrs: &[SendWr],
    ) -> Result<(), (usize, crate::fabric::FabricError)> {
        (**self).post_send(mem, wrs)
    }
    fn post_recv(
        &mut self,
        mem: &mut Memory,
        wrs: &[RecvWr],
    ) -> Result<(), (usize, crate::fabric::FabricError)> {
        (**self).post_recv(mem, wrs)
    }
    fn poll_send_cq(&mut self, out: &mut [crate::fabric::Completion]) -> usize {
        (**self).poll_send_cq(out)
    }
    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [crate::fabric::Completion]) -> usize {
        (**self).poll_recv_cq(mem, out)
    }
    fn arm(&mut self, waker: &Waker) -> bool {
        (**self).arm(waker)
    }
    fn poll_event(&mut self) -> Option<AsyncEvent> {
        (**self).poll_event()
    }
    fn recover(&mut self) -> Result<(), crate::fabric::FabricError> {
        (**self).recover()
    }
    fn drops(&self) -> crate::fabric::ProviderDrops {
        (**self).drops()
    }
    fn enable_timestamps(
        &mut self,
    ) -> Result<crate::fabric::StampClock, crate::fabric::FabricError> {
        (**self).enable_timestamps()
    }
    fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        (**self).readiness_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_queue_sized_from_the_window() {
        assert_eq!(SocketConfig::sized_for(16 << 20, 4096).recv_depth, 4096);
        assert_eq!(SocketConfig::sized_for(1 << 20, 4096).recv_depth, 256);
        assert_eq!(SocketConfig::sized_for(1 << 30, 4096).recv_depth, 8192);
    }
}
