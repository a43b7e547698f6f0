//! Memory registration: `ibv_reg_mr` of a [`Region`] with local write access.

use std::io;

use rdma_sys::*;

use super::qp::VerbsQp;
use crate::fabric::{FabricError, Region};

impl VerbsQp {
    /// Register `region` (`UdQueuePair::register`); the MR lives until the QP drops.
    pub(super) fn register_region(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: the region's memory is `len` valid bytes that never move (boxed
        // slice); the caller keeps it alive while the MR and any WR use it (see the
        // `verbs` module docs on drop order).
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
}
