//! The registered slot pool: no allocation per packet.
//!
//! A few large regions (1–4 MiB each, registered once) are cut into 64-byte
//! aligned slots of MTU + 64 bytes. A receive slot's 40-byte GRH area sits at
//! offset 24 so the payload starts 64-byte aligned; a send slot's payload starts
//! at offset 64 (docs/architecture.md §4).
//!
//! A pool may start with fewer slots than it may hold and grow on demand
//! ([`SlotPool::grow_to`]), a region per step: a receive pool whose posted
//! window starts small (`SocketConfig::recv_start`) registers only that
//! window's buffers until the window grows — what lets a forwarder keep a
//! queue pair per client at tens of KiB each.

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
    /// Slots backed by registered regions so far (`..=total`).
    made: usize,
}

impl SlotPool {
    /// A pool of `count` slots able to hold `mtu` bytes of payload, in regions
    /// of at most `region_bytes`; the first `initial` slots (all, if
    /// `initial >= count`) are registered now, the rest by [`Self::grow_to`],
    /// in regions of `initial` slots.
    pub(crate) fn new<Q: UdQueuePair + ?Sized>(
        qp: &mut Q,
        mem: &mut Memory,
        mtu: usize,
        count: usize,
        region_bytes: usize,
        initial: usize,
    ) -> Result<Self, FabricError> {
        let stride = (REGION_ALIGN + mtu).div_ceil(REGION_ALIGN) * REGION_ALIGN;
        let per_region = (region_bytes / stride).max(1).min(initial.max(1));
        let mut pool = SlotPool {
            stride,
            per_region,
            regions: Vec::new(),
            free: Vec::with_capacity(count),
            total: count,
            made: 0,
        };
        pool.grow_to(initial.min(count), qp, mem)?;
        Ok(pool)
    }

    /// Register regions until at least `n` slots (at most all) are backed;
    /// the new slots are free.
    pub(crate) fn grow_to<Q: UdQueuePair + ?Sized>(
        &mut self,
        n: usize,
        qp: &mut Q,
        mem: &mut Memory,
    ) -> Result<(), FabricError> {
        while self.made < n.min(self.total) {
            let k = (self.total - self.made).min(self.per_region);
            let mut r = Region::new(k * self.stride);
            qp.register(&mut r)?;
            self.regions.push(mem.push(r));
            // Lowest slots first out of the free list.
            self.free
                .extend((self.made as SlotId..(self.made + k) as SlotId).rev());
            self.made += k;
        }
        Ok(())
    }

    pub(crate) fn alloc(&mut self) -> Option<SlotId> {
        self.free.pop()
    }

    pub(crate) fn release(&mut self, slot: SlotId) {
        debug_assert!(self.free.len() < self.made);
        self.free.push(slot);
    }

    /// Every slot free again (their owner, e.g. a recovered QP, holds none).
    pub(crate) fn release_all(&mut self) {
        self.free.clear();
        self.free.extend((0..self.made as SlotId).rev());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
    use crate::fabric::Gid;

    #[test]
    fn a_pool_registers_what_it_is_asked_to_hold_and_grows_by_steps() {
        let fabric = SimFabric::new(SimConfig::default());
        let mut qp = fabric
            .create_qp(
                Gid::from(std::net::Ipv6Addr::LOCALHOST),
                SimQpOptions::default(),
            )
            .unwrap();
        let mut mem = Memory::new();
        // 128 slots of 4 096 bytes may be held, 8 now.
        let mut p = SlotPool::new(&mut qp, &mut mem, 4096, 128, 1 << 20, 8).unwrap();
        assert_eq!((p.made, p.available(), p.regions.len()), (8, 8, 1));
        let slots: Vec<SlotId> = (0..8).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(slots, (0..8).collect::<Vec<_>>(), "lowest first");
        assert_eq!(p.alloc(), None);
        // Growing to 20 adds two regions of 8 slots (24 made); every slot's
        // place lies inside its region.
        p.grow_to(20, &mut qp, &mut mem).unwrap();
        assert_eq!((p.made, p.available(), p.regions.len()), (24, 16, 3));
        for s in 0..24 {
            let sge = p.recv_sge(&mem, s);
            assert!(mem.resolve(&sge).is_some(), "slot {s}");
        }
        p.grow_to(1000, &mut qp, &mut mem).unwrap();
        assert_eq!((p.made, p.total()), (128, 128));
        p.release_all();
        assert_eq!(p.available(), 128);
        // An eager pool is registered whole, in regions of up to 1 MiB.
        let eager = SlotPool::new(&mut qp, &mut mem, 4096, 300, 1 << 20, 300).unwrap();
        assert_eq!((eager.made, eager.regions.len()), (300, 2));
    }
}
