//! `verbs`: the libibverbs provider (rdma-sys), for RoCE NICs and kernel soft-RoCE
//! (`rdma_rxe`). Cargo feature `verbs`.
//!
//! One [`VerbsQp`] is one UD queue pair on one port, with its own protection
//! domain, completion channel and send/receive CQs. It follows the provider
//! semantics of [`crate::fabric`] with real hardware doing the work:
//! - memory: [`UdQueuePair::register`] is `ibv_reg_mr` on the region's address;
//!   WRs point at `region.addr() + offset` (inline sends are copied by the library);
//! - limits are read from the device: active MTU (`ibv_query_port`), the granted
//!   `max_inline_data`, send/receive queue depths (`ibv_query_qp`);
//! - the GID is chosen from the port's table: RoCE v2 only, IPv4-mapped first;
//! - selective signaling and in-order retirement: every AH reference held by an
//!   unsignaled send is released by the next completion, so `destroy_ah` refuses
//!   (`AhBusy`) while a send that used the AH is in flight — destroying it would be
//!   undefined behaviour on hardware;
//! - wake-ups through the completion channel: see [`notify`] and [`VerbsNotifier`];
//! - async events (`ibv_get_async_event`): port up/down, GID change, QP fatal.
//!
//! Every `unsafe` block of the crate lives under this module.
//!
//! **Drop order.** The kernel may DMA into posted receive buffers until the QP is
//! destroyed, so the QP must be dropped (or [`VerbsQp::quiesce`]d) before the
//! memory its WRs point into is freed.

mod device;
pub mod notify;
mod qp;

pub use device::{list_devices, DeviceInfo, GidEntry, GidKind};
pub use notify::VerbsNotifier;
pub use qp::{select_gid, VerbsOptions, VerbsQp};
