//! The registered slot pool: no allocation per packet.
//!
//! A few large regions (1–4 MiB each, registered once) are cut into 64-byte
//! aligned slots of MTU + 64 bytes. A receive slot's 40-byte GRH area sits at
//! offset 24 so the payload starts 64-byte aligned; a send slot's payload starts
//! at offset 64 (docs/architecture.md §4).

use crate::fabric::memory::REGION_ALIGN;
use crate::fabric::{FabricError, Memory, Region, Sge, UdQueuePair, GRH_LEN};

/// Identifies one slot in the pool.
pub(crate) type SlotId = u32;

/// Fixed-size slots over registered regions, with a free list.
#[derive(Debug)]
pub(crate) struct SlotPool {
    stride: usize,
    per_region: usize,
    regions: Vec<u32>,
    free: Vec<SlotId>,
    total: usize,
}

impl SlotPool {
    /// Allocate and register enough regions of `region_bytes` for `count` slots
    /// able to hold `mtu` bytes of payload.
    pub(crate) fn new<Q: UdQueuePair + ?Sized>(
        qp: &mut Q,
        mem: &mut Memory,
        mtu: usize,
        count: usize,
        region_bytes: usize,
    ) -> Result<Self, FabricError> {
        let stride = (REGION_ALIGN + mtu).div_ceil(REGION_ALIGN) * REGION_ALIGN;
        let per_region = (region_bytes / stride).max(1);
        let mut regions = Vec::new();
        let mut left = count;
        while left > 0 {
            let n = left.min(per_region);
            let mut r = Region::new(n * stride);
            qp.register(&mut r)?;
            regions.push(mem.push(r));
            left -= n;
        }
        Ok(SlotPool {
            stride,
            per_region,
            regions,
            free: (0..count as SlotId).rev().collect(),
            total: count,
        })
    }

    pub(crate) fn alloc(&mut self) -> Option<SlotId> {
        self.free.pop()
    }

    pub(crate) fn release(&mut self, slot: SlotId) {
        debug_assert!(self.free.len() < self.total);
        self.free.push(slot);
    }

    /// Every slot free again (their owner, e.g. a recovered QP, holds none).
    pub(crate) fn release_all(&mut self) {
        self.free.clear();
        self.free.extend((0..self.total as SlotId).rev());
    }

    pub(crate) fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }

    fn place(&self, slot: SlotId) -> (u32, u32) {
        let s = slot as usize;
        (
            self.regions[s / self.per_region],
            ((s % self.per_region) * self.stride) as u32,
        )
    }

    /// The SGE of a receive into `slot`: GRH area + MTU, payload 64-byte aligned.
    pub(crate) fn recv_sge(&self, mem: &Memory, slot: SlotId) -> Sge {
        let (region, off) = self.place(slot);
        Sge {
            region,
            offset: off + (REGION_ALIGN - GRH_LEN) as u32,
            len: (self.stride - (REGION_ALIGN - GRH_LEN)) as u32,
            lkey: lkey(mem, region),
        }
    }

    /// The SGE of `len` bytes of send payload in `slot` (64-byte aligned).
    pub(crate) fn send_sge(&self, mem: &Memory, slot: SlotId, len: usize) -> Sge {
        let (region, off) = self.place(slot);
        Sge {
            region,
            offset: off + REGION_ALIGN as u32,
            len: len as u32,
            lkey: lkey(mem, region),
        }
    }
}

fn lkey(mem: &Memory, region: u32) -> u32 {
    mem.region(region).and_then(Region::lkey).unwrap_or(0)
}
