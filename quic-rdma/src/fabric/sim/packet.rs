//! A packet on the simulated wire, and the pool its buffers come from.

use crate::fabric::{Gid, Qpn, GRH_LEN};

/// A packet on the simulated wire: the fields a RoCEv2 packet carries.
pub(crate) struct Packet {
    pub(crate) dgid: Gid,
    pub(crate) dqpn: Qpn,
    pub(crate) sgid: Gid,
    pub(crate) src_qp: Qpn,
    pub(crate) pkey: u16,
    pub(crate) qkey: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) traffic_class: u8,
    pub(crate) flow_label: u32,
    pub(crate) hop_limit: u8,
    /// [`GRH_LEN`] bytes of room for the GRH the receiver writes, then the
    /// payload: the buffer is handed to the receive queue as it is.
    pub(crate) data: Vec<u8>,
}

impl Packet {
    /// The UD payload.
    pub(crate) fn payload(&self) -> &[u8] {
        &self.data[GRH_LEN..]
    }
}

/// Recycled packet buffers: no allocation per packet in steady state.
#[derive(Default)]
pub(crate) struct BufPool {
    free: Vec<Vec<u8>>,
}

/// Buffers kept for reuse at most (a burst beyond it is freed).
const POOL_MAX: usize = 8192;

impl BufPool {
    /// A buffer holding a GRH area followed by a copy of `payload`.
    pub(crate) fn take(&mut self, payload: &[u8]) -> Vec<u8> {
        let mut v = self.free.pop().unwrap_or_default();
        v.clear();
        v.resize(GRH_LEN, 0);
        v.extend_from_slice(payload);
        v
    }

    /// A buffer holding a copy of `data` (a duplicated packet, GRH area included).
    pub(crate) fn copy(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self.free.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(data);
        v
    }

    /// Return a buffer for reuse.
    pub(crate) fn give(&mut self, buf: Vec<u8>) {
        if self.free.len() < POOL_MAX {
            self.free.push(buf);
        }
    }
}
