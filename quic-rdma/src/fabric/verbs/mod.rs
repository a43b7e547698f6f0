//! `verbs`: the libibverbs provider (rdma-sys), for RoCE NICs and kernel soft-RoCE
//! (`rdma_rxe`). Cargo feature `verbs`.
//!
//! One [`VerbsQp`] is one UD queue pair on one port, with its own protection
//! domain, completion channel and send/receive CQs. It follows the provider
//! semantics of [`crate::fabric`] with real hardware doing the work:
//! - memory: [`UdQueuePair::register`] is `ibv_reg_mr` on the region's address
//!   and registered length (a `Vec`-backed region's whole capacity), and
//!   [`UdQueuePair::deregister`] is `ibv_dereg_mr`; WRs point at
//!   `region.addr() + offset` (inline sends are copied by the library), and only
//!   into a region still [`intact`](crate::fabric::Region::intact);
//! - limits are read from the device: active MTU (`ibv_query_port`), the granted
//!   `max_inline_data`, send/receive queue depths (`ibv_query_qp`);
//! - the GID is chosen from the port's table: RoCE v2 only, IPv4-mapped first;
//! - selective signaling and in-order retirement: every AH reference held by an
//!   unsignaled send is released by the next completion, so `destroy_ah` refuses
//!   (`AhBusy`) while a send that used the AH is in flight — destroying it would be
//!   undefined behaviour on hardware. The accounting is the
//!   `SendLedger` (`fabric/send_ledger.rs`) that `sim` and `soft` keep too;
//! - wake-ups through the completion channel: see [`notify`] and [`VerbsNotifier`];
//! - async events (`ibv_get_async_event`): port up/down, GID change, QP fatal.
//!
//! Every `unsafe` block of the crate lives under this module.
//!
//! **Memory the device writes into.** The kernel may DMA into posted receive
//! buffers until the QP is destroyed. Registration therefore gives each region
//! a keeper ([`crate::fabric::RegionKeeper`]): a region dropped while still
//! registered — even under posted receives — hands its storage to the QP,
//! which frees it only after `ibv_destroy_qp` succeeded. So the safe API stays
//! sound whatever the caller drops first; the cost is that such storage lives
//! as long as the QP. If `ibv_destroy_qp` fails the device may go on writing:
//! the QP's MRs stay registered and its memory is leaked, never freed (logged
//! at error level). The keeper also records every receive buffer from its post
//! until its completion is polled (or the QP is reset or destroyed), and the
//! region accessors ([`crate::fabric::Region::slice`], `Memory::resolve`, …)
//! refuse those bytes: safe code never holds a reference to memory the device
//! is writing. A buffer posted again while still posted is refused.

mod ah;
mod cq;
mod describe;
mod device;
mod events;
mod gid;
mod mr;
pub(crate) mod notify;
mod post;
mod qp;
mod register;

use std::task::Waker;

pub use describe::{describe_devices, DeviceReport, PortReport};
pub use device::{list_devices, DeviceInfo, GidEntry, GidKind};
pub use gid::select_gid;
pub use notify::VerbsNotifier;
pub use qp::{VerbsOptions, VerbsQp};

use super::{
    AhAttr, AhId, AsyncEvent, Completion, FabricError, Memory, ProviderDrops, QpAttr, RecvWr,
    Region, SendWr, StampClock, UdQueuePair,
};

/// The provider trait, each method implemented in the file of its concept.
impl UdQueuePair for VerbsQp {
    fn attr(&self) -> &QpAttr {
        &self.attr
    }

    fn register(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.register_region(region)
    }

    fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.deregister_region(region)
    }

    fn create_ah(&mut self, attr: &AhAttr) -> Result<AhId, FabricError> {
        self.create_address_handle(attr)
    }

    fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError> {
        self.destroy_address_handle(ah)
    }

    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        self.post_send_chain(mem, wrs)
    }

    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        self.post_recv_chain(mem, wrs)
    }

    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        let n = self.cq.poll_send(&self.dev, out);
        for c in &out[..n] {
            self.sends.retire(c.wr_id);
        }
        n
    }

    fn poll_recv_cq(&mut self, _mem: &mut Memory, out: &mut [Completion]) -> usize {
        let n = self.cq.poll_recv(&self.dev, out);
        self.recv_posted -= n.min(self.recv_posted);
        // The device is done with these buffers: they are the caller's again.
        self.kept.completed(out[..n].iter().map(|c| c.wr_id));
        n
    }

    fn arm(&mut self, waker: &Waker) -> bool {
        // Consume the events that made the channel readable before re-arming
        // (IBA's get-event, ack, re-arm, poll order): otherwise the descriptor
        // stays readable and a watcher of `readiness_fd` spins.
        self.dev.drain_channel();
        self.notify.store(waker);
        self.cq.arm(&self.dev)
    }

    /// An epoll set of the completion channel and the async-event fd: a
    /// sleeper wakes for completions (after [`arm`](UdQueuePair::arm)) and for
    /// port/GID/QP events alike, which the socket's next poll handles.
    fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.dev.readiness_fd())
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        if let Some(ev) = self.events.pop_front() {
            return Some(ev);
        }
        self.read_async_event()
    }

    fn recover(&mut self) -> Result<(), FabricError> {
        self.recover_from_error()
    }

    /// Refused either way, the default path unchanged: a device without a
    /// completion clock (`completion_timestamp_mask` 0, as rxe) cannot stamp;
    /// one with a clock would need the extended CQ (`ibv_create_cq_ex` with
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, then
    /// `ibv_wc_read_completion_ts`), which this provider does not create yet.
    fn enable_timestamps(&mut self) -> Result<StampClock, FabricError> {
        let mask = self.dev.completion_timestamp_mask()?;
        let detail = if mask == 0 {
            "it has no completion clock: completion_timestamp_mask is 0".to_string()
        } else {
            format!(
                "it has a completion clock (completion_timestamp_mask {mask:#x}), but the \
                 verbs provider does not read it yet (no extended CQ with \
                 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)"
            )
        };
        Err(FabricError::NoCompletionClock {
            device: self.dev.name.clone(),
            detail,
        })
    }

    fn drops(&self) -> ProviderDrops {
        let mut d = ProviderDrops {
            oversize_sent: self.oversize_sent,
            ..ProviderDrops::default()
        };
        // Port-wide counters (every QP of the port), as deltas since open.
        if let Ok(p) = self.dev.query_port(self.port) {
            d.bad_pkey = u64::from(p.bad_pkey_cntr.wrapping_sub(self.baseline.bad_pkey));
            d.bad_qkey = u64::from(p.qkey_viol_cntr.wrapping_sub(self.baseline.qkey_viol));
        }
        d
    }
}
