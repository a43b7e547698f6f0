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
    /// Move up to `n` recycled buffers into `out` (a sender takes what its
    /// post needs in one visit, then fills them without holding the pool).
    pub(crate) fn take_into(&mut self, n: usize, out: &mut Vec<Vec<u8>>) {
        let keep = self.free.len().saturating_sub(n);
        out.extend(self.free.drain(keep..));
    }

    /// Return buffers for reuse, leaving `bufs` empty.
    pub(crate) fn give_all(&mut self, bufs: &mut Vec<Vec<u8>>) {
        let room = POOL_MAX.saturating_sub(self.free.len());
        let n = bufs.len().min(room);
        self.free.extend(bufs.drain(..n));
        bufs.clear();
    }
}

/// `buf` (a recycled buffer, or a new one) as a packet: a GRH area, then a
/// copy of `payload`.
pub(crate) fn packet_data(buf: Option<Vec<u8>>, payload: &[u8]) -> Vec<u8> {
    let mut v = buf.unwrap_or_default();
    v.clear();
    v.resize(GRH_LEN, 0);
    v.extend_from_slice(payload);
    v
}
