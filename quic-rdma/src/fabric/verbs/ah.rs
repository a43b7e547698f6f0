//! Address handles: `ibv_create_ah` with a GRH from the QP's source GID, and
//! `ibv_destroy_ah`, refused while a send that uses the handle is in flight.

use std::io;

use rdma_sys::*;

use super::qp::{os_err, VerbsQp};
use crate::fabric::{AhAttr, AhId, FabricError};

impl VerbsQp {
    /// `UdQueuePair::create_ah`.
    pub(super) fn create_address_handle(&mut self, attr: &AhAttr) -> Result<AhId, FabricError> {
        // SAFETY: ibv_ah_attr is plain data; zero is valid.
        let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.port_num = self.port;
        a.grh.dgid = ibv_gid { raw: attr.dgid.0 };
        a.grh.sgid_index = self.gid_index as u8;
        a.grh.flow_label = attr.flow_label & 0xF_FFFF;
        a.grh.hop_limit = attr.hop_limit;
        a.grh.traffic_class = attr.traffic_class;
        // SAFETY: valid PD; `a` is fully initialised.
        let ah = unsafe { ibv_create_ah(self.dev.pd, &mut a) };
        if ah.is_null() {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
                    FabricError::Unreachable(attr.dgid)
                }
                _ => FabricError::QpError(format!("ibv_create_ah({}): {e}", attr.dgid)),
            });
        }
        Ok(self.sends.create_ah(ah))
    }

    /// `UdQueuePair::destroy_ah`: `AhBusy` while an in-flight send holds the AH.
    pub(super) fn destroy_address_handle(&mut self, ah: AhId) -> Result<(), FabricError> {
        // The ledger refuses (AhBusy) while a send in flight holds the AH.
        let p = self.sends.destroy_ah(ah)?;
        // SAFETY: `p` was created by ibv_create_ah and no WR in flight uses it.
        let rc = unsafe { ibv_destroy_ah(p) };
        if rc != 0 {
            return Err(os_err("ibv_destroy_ah", rc));
        }
        Ok(())
    }
}
