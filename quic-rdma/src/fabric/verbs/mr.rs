//! Memory registration: `ibv_reg_mr` of a [`Region`] with local write access,
//! and the keeper that makes dropping a registered region sound.

use std::io;
use std::sync::{Arc, Mutex};

use rdma_sys::*;

use super::qp::VerbsQp;
use crate::fabric::{FabricError, Region, RegionKeeper};

/// The storage of regions dropped while registered with a [`VerbsQp`]: kept
/// allocated until the QP is destroyed and its MRs deregistered, because the
/// device may write into posted receive buffers until then.
#[derive(Default)]
pub(super) struct KeptRegions(Mutex<Vec<Box<[u8]>>>);

impl KeptRegions {
    /// Free what was kept: only once the device can no longer touch it.
    pub(super) fn release(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// How many dropped regions' storage is being kept.
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl RegionKeeper for KeptRegions {
    fn keep(&self, storage: Box<[u8]>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(storage);
    }
}

impl VerbsQp {
    /// Register `region` (`UdQueuePair::register`); the MR lives until the QP drops.
    pub(super) fn register_region(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: the region's memory is `len` valid bytes that never move (boxed
        // slice), and stay allocated until this QP is destroyed: a region dropped
        // before that hands its storage to `self.kept` (set below, before any WR
        // can point into it), which is released only after `ibv_destroy_qp` and
        // `ibv_dereg_mr` in `Drop for VerbsQp`.
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
        region.set_keeper(self.kept.clone() as Arc<dyn RegionKeeper>);
        // SAFETY: `mr` is valid.
        region.set_lkey(Some(unsafe { (*mr).lkey }));
        Ok(())
    }
}
