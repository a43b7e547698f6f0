//! The verbs UD queue pair: opening it (device, GID, QP to RTS), its state
//! transitions (quiesce, recovery from the error state) and its teardown.
//!
//! The rest of [`VerbsQp`] lives next door, one concept per file: memory
//! registration in `mr.rs`, address handles in `ah.rs`, posting in `post.rs`,
//! completions in `cq.rs`, async events in `events.rs`.

use std::collections::VecDeque;
use std::sync::Arc;

use rdma_sys::*;

use super::cq::CqPoller;
use super::device::{errno_of, mtu_from_ibv, Device, GidEntry};
use super::events;
use super::gid::select_gid;
use super::mr::KeptRegions;
use super::notify::{NotifyShared, VerbsNotifier};
use crate::fabric::send_ledger::SendLedger;
use crate::fabric::{check_qkey, AsyncEvent, FabricError, Gid, QpAttr, DEFAULT_QKEY};

/// How to open a [`VerbsQp`].
#[derive(Clone, Debug)]
pub struct VerbsOptions {
    /// Device name (`rxe0`, `mlx5_0`); the first device when `None`.
    pub device: Option<String>,
    /// Port number (1-based).
    pub port: u8,
    /// Source GID to use; when `None`, the first RoCE v2 GID, IPv4-mapped preferred.
    pub gid: Option<Gid>,
    /// Q_Key the QP accepts (must not be privileged).
    pub qkey: u32,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Send queue depth requested.
    pub max_send_wr: u32,
    /// Receive queue depth requested.
    pub max_recv_wr: u32,
    /// Inline data requested (the device may grant more, or refuse).
    pub max_inline: u32,
}

impl Default for VerbsOptions {
    fn default() -> Self {
        VerbsOptions {
            device: None,
            port: 1,
            gid: None,
            qkey: DEFAULT_QKEY,
            pkey_index: 0,
            max_send_wr: 1024,
            max_recv_wr: 4096,
            max_inline: 64,
        }
    }
}

/// Port counters at open time: drops are reported as deltas.
#[derive(Clone, Copy, Default)]
pub(super) struct PortBaseline {
    pub(super) bad_pkey: u32,
    pub(super) qkey_viol: u32,
}

/// A UD queue pair on libibverbs (see the [module docs](super)).
pub struct VerbsQp {
    pub(super) dev: Arc<Device>,
    pub(super) notify: Arc<NotifyShared>,
    pub(super) qp: *mut ibv_qp,
    pub(super) port: u8,
    /// P_Key index the QP was brought up with (again on `recover`).
    pub(super) pkey_index: u16,
    pub(super) gid_index: u32,
    pub(super) attr: QpAttr,
    /// Registered MRs; the region's lkey maps back to its MR for deregistration.
    pub(super) mrs: Vec<*mut ibv_mr>,
    /// Address handles and the sends in flight that hold them, retired in
    /// order as completions are polled (shared with `sim` and `soft`).
    pub(super) sends: SendLedger<*mut ibv_ah>,
    pub(super) recv_posted: usize,
    /// Completions polled ahead, and the scratch to poll into.
    pub(super) cq: CqPoller,
    /// Async events read while recovering, other than the QP's own failure.
    pub(super) events: VecDeque<AsyncEvent>,
    /// Scratch for building WR chains (no allocation per post after warm-up).
    pub(super) send_wrs: Vec<ibv_send_wr>,
    pub(super) recv_wrs: Vec<ibv_recv_wr>,
    pub(super) sges: Vec<ibv_sge>,
    pub(super) baseline: PortBaseline,
    pub(super) oversize_sent: u64,
    /// Storage of registered regions dropped before this QP (see [`KeptRegions`]).
    pub(super) kept: Arc<KeptRegions>,
}

// SAFETY: the raw pointers are libibverbs objects owned by this VerbsQp; libibverbs
// is thread-safe, and `&mut self` serialises every mutation of our own state.
unsafe impl Send for VerbsQp {}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("device", &self.dev.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("attr", &self.attr)
            .finish()
    }
}

/// A `QpError` naming the failed call (`rc` as for [`errno_of`]).
pub(super) fn os_err(what: &str, rc: i32) -> FabricError {
    FabricError::QpError(format!("{what}: {}", errno_of(rc)))
}

impl VerbsQp {
    /// Open a device, pick the GID, create a UD QP and move it to RTS.
    ///
    /// With no RDMA device (or no kernel RDMA support: `ibv_get_device_list`
    /// fails with `ENOSYS`) this is [`FabricError::NoDevice`], whose message
    /// names the alternatives (`soft`, `sim`, loading `rdma_rxe`).
    pub fn open(opts: &VerbsOptions) -> Result<VerbsQp, FabricError> {
        check_qkey(opts.qkey)?;
        let dev = Arc::new(Device::open(
            opts.device.as_deref(),
            opts.max_send_wr.max(1),
            opts.max_recv_wr.max(1),
        )?);
        let port = dev.query_port(opts.port)?;
        if port.state != ibv_port_state::IBV_PORT_ACTIVE {
            return Err(FabricError::QpError(format!(
                "port {} of {} is not active (state {})",
                opts.port, dev.name, port.state
            )));
        }
        let active_mtu = mtu_from_ibv(port.active_mtu).ok_or_else(|| {
            FabricError::QpError(format!("unknown active MTU enum {}", port.active_mtu))
        })?;
        let table = dev.gid_table(opts.port, port.gid_tbl_len.max(0) as u32);
        let entry = select_gid(&table, opts.gid).ok_or_else(|| match opts.gid {
            Some(g) => FabricError::QpError(format!(
                "GID {g} is not a RoCE v2 GID of {} port {} (table: {table:?})",
                dev.name, opts.port
            )),
            None => FabricError::QpError(format!(
                "{} port {} has no RoCE v2 GID (is the netdev up with an IP address?)",
                dev.name, opts.port
            )),
        })?;
        let pkey = dev.query_pkey(opts.port, opts.pkey_index).unwrap_or(0xFFFF);

        // SAFETY: ibv_qp_init_attr is plain data (pointers and integers); zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = dev.send_cq;
        init.recv_cq = dev.recv_cq;
        init.qp_type = ibv_qp_type::IBV_QPT_UD;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = opts.max_send_wr;
        init.cap.max_recv_wr = opts.max_recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = opts.max_inline;
        // SAFETY: valid PD; `init` outlives the call; CQs belong to the same context.
        let qp = unsafe { ibv_create_qp(dev.pd, &mut init) };
        if qp.is_null() {
            return Err(os_err("ibv_create_qp(UD)", 0));
        }
        let notify = Arc::new(NotifyShared::new(dev.clone()));
        let mut me = VerbsQp {
            dev,
            notify,
            qp,
            port: opts.port,
            pkey_index: opts.pkey_index,
            gid_index: entry.index,
            attr: QpAttr {
                // SAFETY: `qp` is valid.
                qpn: unsafe { (*qp).qp_num },
                qkey: opts.qkey,
                pkey,
                gid: entry.gid,
                active_mtu,
                max_inline: init.cap.max_inline_data,
                max_send_wr: init.cap.max_send_wr,
                max_recv_wr: init.cap.max_recv_wr,
            },
            mrs: Vec::new(),
            sends: SendLedger::new(init.cap.max_send_wr as usize),
            recv_posted: 0,
            cq: CqPoller::new(),
            events: VecDeque::new(),
            send_wrs: Vec::new(),
            recv_wrs: Vec::new(),
            sges: Vec::new(),
            baseline: PortBaseline {
                bad_pkey: port.bad_pkey_cntr,
                qkey_viol: port.qkey_viol_cntr,
            },
            oversize_sent: 0,
            kept: Arc::default(),
        };
        // From here on, Drop cleans up.
        me.bring_up(opts.pkey_index)?;
        me.read_back_caps()?;
        tracing::info!(device = %me.dev.name, port = me.port, gid = %me.attr.gid,
            gid_index = me.gid_index, qpn = me.attr.qpn, mtu = me.attr.active_mtu.bytes(),
            max_inline = me.attr.max_inline, "verbs UD QP ready");
        Ok(me)
    }

    pub(super) fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &str,
    ) -> Result<(), FabricError> {
        // SAFETY: valid QP; `attr` is initialised for every bit of `mask`.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(os_err(what, rc));
        }
        Ok(())
    }

    /// RESET → INIT (P_Key index, port, Q_Key) → RTR → RTS (SQ PSN).
    fn bring_up(&mut self, pkey_index: u16) -> Result<(), FabricError> {
        // SAFETY: ibv_qp_attr is plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = pkey_index;
        a.port_num = self.port;
        a.qkey = self.attr.qkey;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_QKEY,
            "modify_qp(INIT)",
        )?;
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify_qp(RTR)")?;
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = rand::random::<u32>() & 0xFF_FFFF;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            "modify_qp(RTS)",
        )
    }

    /// What the QP granted, from `ibv_query_qp` (the authoritative numbers).
    fn read_back_caps(&mut self) -> Result<(), FabricError> {
        // SAFETY: plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe {
            ibv_query_qp(
                self.qp,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_CAP.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(os_err("ibv_query_qp", rc));
        }
        self.attr.max_inline = init.cap.max_inline_data;
        self.attr.max_send_wr = init.cap.max_send_wr;
        self.attr.max_recv_wr = init.cap.max_recv_wr;
        Ok(())
    }

    /// A notifier for async callers (see [`notify`](super::notify)).
    pub fn notifier(&self) -> VerbsNotifier {
        VerbsNotifier {
            shared: self.notify.clone(),
        }
    }

    /// The completion channel's fd (same as `notifier().fd()`).
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.dev.channel_fd()
    }

    /// Device name.
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// Port number.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// Index of the source GID in the port's GID table.
    pub fn gid_index(&self) -> u32 {
        self.gid_index
    }

    /// The port's GID table (RoCE types included).
    pub fn gid_table(&self) -> Result<Vec<GidEntry>, FabricError> {
        let p = self.dev.query_port(self.port)?;
        Ok(self.dev.gid_table(self.port, p.gid_tbl_len.max(0) as u32))
    }

    /// Sends posted and not yet retired by a polled completion.
    pub fn sends_outstanding(&self) -> usize {
        self.sends.outstanding()
    }

    /// Registered regions dropped before this QP whose storage is kept
    /// allocated until it drops (the device may still write into it).
    pub fn kept_regions(&self) -> usize {
        self.kept.len()
    }

    /// Receives posted and not yet completed.
    pub fn recvs_posted(&self) -> usize {
        self.recv_posted
    }

    /// Move the QP to the error state: the device stops writing into receive
    /// buffers and flushes every outstanding WR (completions `WrFlushErr`).
    pub fn quiesce(&mut self) -> Result<(), FabricError> {
        // SAFETY: plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify_qp(ERR)")
    }

    /// The next async event that concerns this QP or its port (see [`events`]);
    /// a GID change updates `attr.gid`.
    pub(super) fn read_async_event(&mut self) -> Option<AsyncEvent> {
        events::read_async_event(
            &self.dev,
            self.qp,
            self.port,
            self.gid_index,
            &mut self.attr.gid,
        )
    }

    /// Error → Reset (the device forgets every outstanding WR) → Init → RTR →
    /// RTS with the original P_Key index, port and Q_Key; the QPN is unchanged.
    pub(super) fn recover_from_error(&mut self) -> Result<(), FabricError> {
        // SAFETY: plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RESET;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify_qp(RESET)")?;
        self.cq.discard(&self.dev);
        self.sends.reset();
        self.recv_posted = 0;
        self.kept.reset_posted();
        // A failure reported before the reset was about the QP just reset: drop
        // it, or it would reset the recovered QP again. Keep every other event.
        while let Some(ev) = self.read_async_event() {
            if ev != AsyncEvent::QpFatal {
                self.events.push_back(ev);
            }
        }
        self.bring_up(self.pkey_index)?;
        tracing::info!(
            qpn = self.attr.qpn,
            "verbs UD QP recovered from the error state"
        );
        Ok(())
    }
}

impl VerbsQp {
    /// Teardown after `ibv_destroy_qp` succeeded: no WR is left, so the device
    /// writes nothing any more; destroy the AHs, deregister the MRs and free
    /// the storage of regions dropped while registered.
    fn destroy_after_qp(&mut self) {
        for ah in self.sends.drain_ahs() {
            // SAFETY: `ah` was created by ibv_create_ah, is destroyed once (the
            // ledger hands it out once), and no WR uses it: the QP is gone.
            let rc = unsafe { ibv_destroy_ah(ah) };
            if rc != 0 {
                tracing::warn!(qpn = self.attr.qpn, error = %errno_of(rc), "ibv_destroy_ah failed");
            }
        }
        for mr in self.mrs.drain(..) {
            // SAFETY: `mr` is a live MR of ours, deregistered once (drained).
            let rc = unsafe { ibv_dereg_mr(mr) };
            if rc != 0 {
                // Its pages stay pinned; nothing writes into them: the PD it
                // belongs to is this QP's own and has no QP left, and the MR
                // grants no remote access.
                tracing::warn!(qpn = self.attr.qpn, error = %errno_of(rc),
                    "ibv_dereg_mr failed; its memory is freed (the QP is destroyed)");
            }
        }
        self.kept.release();
    }

    /// Teardown after `ibv_destroy_qp` failed with `rc`: the QP may still be
    /// live in the device, writing into posted receive buffers (and reading
    /// AHs, CQs, the PD). Nothing it may use is released: the MRs stay
    /// registered, the storage of regions dropped while registered — and of
    /// those that drop later — is never freed, their posted buffers stay out
    /// of safe code's reach, and the device context (PD, CQs) is never closed.
    fn leak_after_failed_destroy(&mut self, rc: i32) {
        let error = errno_of(rc);
        let errno = error.raw_os_error().unwrap_or(rc);
        tracing::error!(qpn = self.attr.qpn, device = %self.dev.name, errno, %error,
            mrs = self.mrs.len(), kept_regions = self.kept.len(),
            recvs_posted = self.recv_posted,
            "ibv_destroy_qp failed: the device may still write into this QP's receive \
             buffers, so its memory regions stay registered and their memory is leaked \
             (never freed) rather than handed back to the allocator");
        self.kept.leak();
        // Raw pointers: forgetting them frees nothing; the MRs (and the AHs,
        // left in the ledger) stay.
        self.mrs.clear();
        // The device context outlives the QP that may still use its PD and CQs.
        std::mem::forget(Arc::clone(&self.dev));
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: the QP is ours and destroyed once, here, first: the AHs, MRs
        // and memory it uses are released only once it is gone.
        let rc = unsafe { ibv_destroy_qp(self.qp) };
        if rc == 0 {
            self.destroy_after_qp();
        } else {
            self.leak_after_failed_destroy(rc);
        }
        self.notify.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::UdQueuePair;

    /// On a machine without RDMA (this project's hosts and CI), opening fails with
    /// a clear NoDevice error naming the alternatives. In the rxe guest a device
    /// exists, so the test checks the other outcome there.
    #[test]
    fn open_without_device_is_no_device() {
        match VerbsQp::open(&VerbsOptions::default()) {
            Err(e @ FabricError::NoDevice { .. }) => {
                let msg = e.to_string();
                eprintln!("{msg}");
                assert!(msg.contains("no RDMA device"), "{msg}");
                assert!(msg.contains("--provider soft"), "{msg}");
                assert!(msg.contains("rdma_rxe"), "{msg}");
            }
            Err(other) => panic!("expected NoDevice, got {other}"),
            Ok(qp) => {
                assert!(std::path::Path::new("/sys/class/infiniband").exists());
                assert!(qp.attr().qpn > 0);
            }
        }
    }
}
