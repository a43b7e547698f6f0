//! Completion polling: the two CQs of a [`VerbsQp`](super::VerbsQp), polled in
//! batches with `ibv_poll_cq`, and the mapping of work completions to
//! [`Completion`]s (status, opcode, immediate data, source QP).

use std::collections::VecDeque;

use rdma_sys::*;

use super::device::Device;
use crate::fabric::{Completion, WcOpcode, WcStatus};

/// Completions polled per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// Completions polled ahead of the caller (by `arm`, which must look before
/// sleeping), and the scratch `ibv_poll_cq` writes into.
pub(super) struct CqPoller {
    /// Completions polled by `arm`, handed out by the next `poll_*_cq`.
    send_stash: VecDeque<Completion>,
    recv_stash: VecDeque<Completion>,
    wcs: Vec<ibv_wc>,
}

/// A zeroed ibv_wc (plain data: integers and a union of integers).
fn zeroed_wc() -> ibv_wc {
    // SAFETY: every field of ibv_wc is an integer; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

impl CqPoller {
    /// Empty stashes and a batch of zeroed work completions.
    pub(super) fn new() -> Self {
        CqPoller {
            send_stash: VecDeque::new(),
            recv_stash: VecDeque::new(),
            wcs: (0..POLL_BATCH).map(|_| zeroed_wc()).collect(),
        }
    }

    /// Up to `out.len()` send completions, stashed ones first. The caller
    /// retires the send queue up to each one.
    pub(super) fn poll_send(&mut self, dev: &Device, out: &mut [Completion]) -> usize {
        let mut stash = std::mem::take(&mut self.send_stash);
        if stash.len() < out.len() {
            let cq = dev.send_cq;
            let want = out.len() - stash.len();
            self.poll_raw(cq, false, &mut stash, want);
        }
        let n = stash.len().min(out.len());
        for (slot, c) in out.iter_mut().zip(stash.drain(..n)) {
            *slot = c;
        }
        self.send_stash = stash;
        n
    }

    /// Up to `out.len()` receive completions, stashed ones first.
    pub(super) fn poll_recv(&mut self, dev: &Device, out: &mut [Completion]) -> usize {
        let mut stash = std::mem::take(&mut self.recv_stash);
        if stash.len() < out.len() {
            let cq = dev.recv_cq;
            let want = out.len() - stash.len();
            self.poll_raw(cq, true, &mut stash, want);
        }
        let n = stash.len().min(out.len());
        for (slot, c) in out.iter_mut().zip(stash.drain(..n)) {
            *slot = c;
        }
        self.recv_stash = stash;
        n
    }

    /// Request a completion event on both CQs, then look for completions that
    /// arrived before they were armed; `true` if any wait (or arming failed).
    pub(super) fn arm(&mut self, dev: &Device) -> bool {
        // SAFETY: valid CQs of this device.
        let rc = unsafe { ibv_req_notify_cq(dev.send_cq, 0) | ibv_req_notify_cq(dev.recv_cq, 0) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_req_notify_cq failed");
            return true;
        }
        // Completions that arrived before the CQs were armed raise no event: look.
        if self.send_stash.is_empty() {
            let cq = dev.send_cq;
            let mut s = std::mem::take(&mut self.send_stash);
            self.poll_raw(cq, false, &mut s, POLL_BATCH);
            self.send_stash = s;
        }
        if self.recv_stash.is_empty() {
            let cq = dev.recv_cq;
            let mut s = std::mem::take(&mut self.recv_stash);
            self.poll_raw(cq, true, &mut s, POLL_BATCH);
            self.recv_stash = s;
        }
        !self.send_stash.is_empty() || !self.recv_stash.is_empty()
    }

    /// Discard every completion waiting in the stashes and on both CQs (the
    /// CQs are this QP's alone: each `VerbsQp` opens its own device context).
    pub(super) fn discard(&mut self, dev: &Device) {
        self.send_stash.clear();
        self.recv_stash.clear();
        let mut scratch = VecDeque::new();
        for cq in [dev.send_cq, dev.recv_cq] {
            while self.poll_raw(cq, false, &mut scratch, POLL_BATCH) > 0 {
                scratch.clear();
            }
        }
    }

    /// Poll one CQ into `out`, converting completions.
    fn poll_raw(
        &mut self,
        cq: *mut ibv_cq,
        recv: bool,
        out: &mut VecDeque<Completion>,
        max: usize,
    ) -> usize {
        let want = max.min(POLL_BATCH);
        // SAFETY: valid CQ; `wcs` has POLL_BATCH initialised entries, want <= that.
        let n = unsafe { ibv_poll_cq(cq, want as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            tracing::warn!(rc = n, recv, "ibv_poll_cq failed");
            return 0;
        }
        for wc in &self.wcs[..n as usize] {
            out.push_back(convert_wc(wc, recv));
        }
        n as usize
    }
}

/// One work completion as a [`Completion`]; unmapped error statuses are logged
/// and reported as `GeneralErr`.
fn convert_wc(wc: &ibv_wc, recv: bool) -> Completion {
    let status = match wc.status {
        ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        other => {
            tracing::debug!(status = ?other, vendor_err = wc.vendor_err, recv, "work completion error");
            WcStatus::GeneralErr
        }
    };
    let with_imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0) != 0;
    Completion {
        wr_id: wc.wr_id,
        status,
        opcode: if recv { WcOpcode::Recv } else { WcOpcode::Send },
        byte_len: if recv { wc.byte_len } else { 0 },
        // SAFETY: the union's imm_data member is valid when WITH_IMM is set.
        imm: (recv && with_imm)
            .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
        src_qp: if recv { wc.src_qp & 0xFF_FFFF } else { 0 },
        // The plain CQ carries no completion clock (see `enable_timestamps`).
        timestamp: None,
    }
}
