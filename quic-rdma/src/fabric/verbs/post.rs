//! Posting work requests: send and receive WRs validated against the QP's limits
//! and registered memory, then chained into one `ibv_post_send` /
//! `ibv_post_recv` (one doorbell). Each posted send is recorded in the QP's
//! `SendLedger` (`fabric/send_ledger.rs`), whose in-order
//! retirement as completions arrive releases the AH references that keep
//! `destroy_ah` safe.

use std::ptr;

use rdma_sys::*;

use super::qp::{os_err, VerbsQp};
use crate::fabric::{FabricError, Memory, RecvWr, SendWr, Sge};

impl VerbsQp {
    /// `UdQueuePair::post_send`: as many WRs as fit, in one chain.
    pub(super) fn post_send_chain(
        &mut self,
        mem: &Memory,
        wrs: &[SendWr],
    ) -> Result<(), (usize, FabricError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let room = (self.attr.max_send_wr as usize).saturating_sub(self.sends.outstanding());
        // Validate first and post at most what fits: a chain is one doorbell.
        let mut take = 0;
        let mut failure = None;
        self.sges.clear();
        for wr in wrs {
            if take >= room {
                failure = Some(FabricError::QueueFull(self.sends.outstanding()));
                break;
            }
            if self.sends.ah(wr.ah).is_none() {
                failure = Some(FabricError::InvalidAh(wr.ah.0));
                break;
            }
            if wr.flags.inline && wr.sge.len > self.attr.max_inline {
                failure = Some(FabricError::QpError(format!(
                    "inline send of {} bytes exceeds the granted max_inline_data {}",
                    wr.sge.len, self.attr.max_inline
                )));
                break;
            }
            // The library reads inline data (and the device non-inline data) at this
            // address: it must lie inside a region of `mem`.
            let Some(addr) = Self::region_addr(mem, &wr.sge) else {
                failure = Some(FabricError::QpError(format!(
                    "send buffer {:?} outside its region",
                    wr.sge
                )));
                break;
            };
            if wr.sge.len as usize > self.attr.active_mtu.bytes() {
                // The device drops it silently and completes it as success.
                self.oversize_sent += 1;
            }
            self.sges.push(ibv_sge {
                addr,
                length: wr.sge.len,
                lkey: wr.sge.lkey,
            });
            take += 1;
        }
        if take > 0 {
            self.send_wrs.clear();
            for (i, wr) in wrs[..take].iter().enumerate() {
                let ah = *self.sends.ah(wr.ah).expect("checked above");
                let mut flags = 0u32;
                if wr.flags.signaled {
                    flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
                if wr.flags.inline {
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                }
                // SAFETY: ibv_send_wr is plain data (pointers, integers, unions of
                // those); zero is valid and every used field is set below.
                let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
                w.wr_id = wr.wr_id;
                w.sg_list = &mut self.sges[i];
                w.num_sge = 1;
                w.send_flags = flags;
                match wr.imm {
                    Some(imm) => {
                        w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                        w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                    }
                    None => w.opcode = ibv_wr_opcode::IBV_WR_SEND,
                }
                w.wr.ud = ud_t {
                    ah,
                    remote_qpn: wr.remote_qpn,
                    remote_qkey: wr.remote_qkey,
                };
                self.send_wrs.push(w);
            }
            // Chain after the Vec stopped growing, so the pointers stay valid.
            for i in 0..take - 1 {
                let next: *mut ibv_send_wr = &mut self.send_wrs[i + 1];
                self.send_wrs[i].next = next;
            }
            self.send_wrs[take - 1].next = ptr::null_mut();
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: the chain and its SGEs live in `self` for the call; SGE
            // addresses were checked against `mem`'s regions; AHs are live.
            let rc = unsafe { ibv_post_send(self.qp, self.send_wrs.as_mut_ptr(), &mut bad) };
            let posted = if rc == 0 {
                take
            } else {
                // SAFETY: on failure `bad` points into our chain.
                let idx = unsafe { bad.offset_from(self.send_wrs.as_ptr()) };
                let idx = usize::try_from(idx).unwrap_or(0).min(take);
                failure = Some(os_err("ibv_post_send", rc));
                idx
            };
            for wr in &wrs[..posted] {
                self.sends.posted(wr.wr_id, wr.ah);
            }
            if let Some(e) = failure {
                return Err((posted, e));
            }
            return Ok(());
        }
        match failure {
            Some(e) => Err((0, e)),
            None => Ok(()),
        }
    }

    /// `UdQueuePair::post_recv`: as many WRs as fit, in one chain.
    ///
    /// Each buffer is recorded in `self.kept` before the doorbell: from then
    /// until its completion is handed out, the device may write into it, and
    /// the region accessors refuse its bytes. `mem` is borrowed mutably, so no
    /// reference into it is alive when the device starts writing.
    pub(super) fn post_recv_chain(
        &mut self,
        mem: &mut Memory,
        wrs: &[RecvWr],
    ) -> Result<(), (usize, FabricError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let room = (self.attr.max_recv_wr as usize).saturating_sub(self.recv_posted);
        let mut failure = None;
        self.sges.clear();
        // Held to the end: the regions' accessors ask `self.kept` too, and
        // must not see a buffer before it is recorded.
        let mut kept = self.kept.lock();
        for wr in wrs {
            if self.sges.len() >= room {
                failure = Some(FabricError::QueueFull(self.recv_posted));
                break;
            }
            // The device writes here: it must lie inside a registered region of `mem`.
            let Some(addr) = Self::recv_addr(mem, &wr.sge) else {
                failure = Some(FabricError::QpError(format!(
                    "receive buffer {:?} not registered",
                    wr.sge
                )));
                break;
            };
            if !kept
                .posted
                .post(wr.wr_id, addr as usize, wr.sge.len as usize)
            {
                failure = Some(FabricError::QpError(format!(
                    "receive buffer {:?} overlaps a receive still posted",
                    wr.sge
                )));
                break;
            }
            self.sges.push(ibv_sge {
                addr,
                length: wr.sge.len,
                lkey: wr.sge.lkey,
            });
        }
        let take = self.sges.len();
        if take == 0 {
            return Err((0, failure.expect("nothing taken means a failure")));
        }
        self.recv_wrs.clear();
        for (i, wr) in wrs[..take].iter().enumerate() {
            self.recv_wrs.push(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                sg_list: &mut self.sges[i],
                num_sge: 1,
            });
        }
        for i in 0..take - 1 {
            let next: *mut ibv_recv_wr = &mut self.recv_wrs[i + 1];
            self.recv_wrs[i].next = next;
        }
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the chain and SGEs live in `self` for the call; buffers lie in
        // registered regions that outlive the QP (`verbs` module docs).
        let rc = unsafe { ibv_post_recv(self.qp, self.recv_wrs.as_mut_ptr(), &mut bad) };
        let posted = if rc == 0 {
            take
        } else {
            // SAFETY: on failure `bad` points into our chain.
            let idx = unsafe { bad.offset_from(self.recv_wrs.as_ptr()) };
            failure = Some(os_err("ibv_post_recv", rc));
            usize::try_from(idx).unwrap_or(0).min(take)
        };
        kept.posted.unpost_last(take - posted);
        drop(kept);
        self.recv_posted += posted;
        match failure {
            Some(e) => Err((posted, e)),
            None => Ok(()),
        }
    }

    /// The address of a receive buffer: inside the initialised bytes of the
    /// region of `mem` whose lkey it names ([`Memory::resolve`]'s rules, without
    /// asking the region's keeper, which is `self.kept`, locked by the caller).
    fn recv_addr(mem: &Memory, sge: &Sge) -> Option<u64> {
        let r = mem.region(sge.region)?;
        let end = sge.offset as usize + sge.len as usize;
        if r.lkey() != Some(sge.lkey) || end > r.written() {
            return None;
        }
        Self::region_addr(mem, sge)
    }

    /// The address of `sge` if it lies inside its region of `mem`, whose memory
    /// is still where it was registered (a lent `Vec` that reallocated is not:
    /// its registered memory was freed).
    fn region_addr(mem: &Memory, sge: &Sge) -> Option<u64> {
        let r = mem.region(sge.region)?;
        let end = sge.offset as usize + sge.len as usize;
        (end <= r.len() && r.intact()).then(|| (r.addr() + sge.offset as usize) as u64)
    }
}
