//! Memory registration of a [`VerbsQp`] (`UdQueuePair::register` and
//! `deregister`): `ibv_reg_mr`/`ibv_dereg_mr`, with the region handed to the
//! QP's keeper ([`super::mr::KeptRegions`]) before any work request can name
//! it. Apart from `mr.rs` because the QP owns a keeper (`qp` uses `mr`): the
//! methods here use both, and nothing uses this file's items but through
//! `VerbsQp`.

use std::io;
use std::sync::Arc;

use rdma_sys::*;

use super::qp::VerbsQp;
use crate::fabric::{FabricError, Region, RegionKeeper};

impl VerbsQp {
    /// Register `region` (`UdQueuePair::register`); the MR lives until the QP drops.
    pub(super) fn register_region(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if !region.intact() {
            return Err(FabricError::Registration(
                "region's memory moved since it was allocated".into(),
            ));
        }
        // Before any WR can point into it: the storage goes to `self.kept`
        // when the region drops, and its accessors ask `self.kept` which bytes
        // the device may be writing. Refused for a region another QP keeps.
        region.set_keeper(self.kept.clone() as Arc<dyn RegionKeeper>)?;
        // SAFETY: the region's memory is `len` valid, initialised bytes (a boxed
        // slice, or a Vec's whole capacity, zero-filled at creation) at `addr`,
        // and stays allocated until this QP is destroyed: a region dropped
        // before that hands its storage, unmoved, to `self.kept` (set above,
        // before any WR can point into it), which is released only after a
        // successful `ibv_destroy_qp` in `Drop for VerbsQp` (and never if it
        // fails). A lent Vec that reallocates frees its old memory early, but
        // it is lent only while no receive is posted into it
        // (`Region::vec_mut` asks `self.kept`); posts refuse a region no longer
        // intact, and the socket deregisters it (`deregister_region`).
        let mr = unsafe {
            ibv_reg_mr(
                self.dev.pd,
                region.addr() as *mut std::ffi::c_void,
                region.len().max(1),
                access.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(FabricError::Registration(format!(
                "ibv_reg_mr({} bytes): {}",
                region.len(),
                io::Error::last_os_error()
            )));
        }
        self.mrs.push(mr);
        // SAFETY: `mr` is valid.
        region.set_lkey(Some(unsafe { (*mr).lkey }));
        Ok(())
    }

    /// Deregister `region` (`UdQueuePair::deregister`): `ibv_dereg_mr` of the
    /// MR that holds its lkey. Its storage still goes to the keeper on drop.
    pub(super) fn deregister_region(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let lkey = region.lkey();
        // SAFETY: every pointer in `mrs` is a live MR of ours (removed from the
        // list when deregistered, so never used after).
        let found = self
            .mrs
            .iter()
            .position(|&mr| Some(unsafe { (*mr).lkey }) == lkey);
        let Some(i) = found else {
            return Err(FabricError::Registration(format!(
                "lkey {lkey:?} is not registered with this QP"
            )));
        };
        let mr = self.mrs.swap_remove(i);
        // SAFETY: `mr` is live and ours, and now out of `mrs`, so it is
        // deregistered once and never touched again. A WR still pointing into it
        // (which the socket never leaves) would complete with a protection error:
        // the memory itself stays owned by the region or its keeper.
        let rc = unsafe { ibv_dereg_mr(mr) };
        if rc != 0 {
            // Still registered: `Drop for VerbsQp` tries again.
            self.mrs.push(mr);
            return Err(FabricError::Registration(format!(
                "ibv_dereg_mr: {}",
                io::Error::from_raw_os_error(rc)
            )));
        }
        region.set_lkey(None);
        Ok(())
    }
}
