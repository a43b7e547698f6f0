//! Registered memory: the regions send and receive work requests point into.
//!
//! Hardware reads and writes only memory registered with it (a memory region and
//! its local key). `sim` and `soft` keep the same contract, so the socket code is
//! one for every provider: it owns the [`Memory`], registers each [`Region`] with
//! its provider, and work requests carry a [`Sge`] (region, offset, length, lkey).

use std::sync::Arc;

/// Cache-line alignment of every region's first usable byte.
pub const REGION_ALIGN: usize = 64;

/// Takes over a registered region's storage when the [`Region`] is dropped,
/// and keeps it allocated for as long as a device may still read or write it.
///
/// A NIC writes received packets into registered memory by DMA, outside
/// Rust's view: if a region were freed while its memory stayed registered
/// (and receives into it stayed posted), the device would write into memory
/// the allocator had handed to someone else. A provider whose device does DMA
/// sets a keeper in [`UdQueuePair::register`](super::UdQueuePair::register),
/// so dropping a region — even under posted receives — is always safe: the
/// storage outlives the device's access to it, and is freed when the provider
/// knows the device is done (its queue pair reset or destroyed).
pub trait RegionKeeper: Send + Sync {
    /// Keep `storage` (the dropped region's whole allocation) alive.
    fn keep(&self, storage: Box<[u8]>);
}

/// One contiguous block of memory registered with a provider.
pub struct Region {
    // Over-allocated by REGION_ALIGN so `base` can be 64-byte aligned without unsafe;
    // a boxed slice never moves its heap storage, so the alignment holds.
    buf: Box<[u8]>,
    base: usize,
    len: usize,
    lkey: Option<u32>,
    /// Where the storage goes when the region drops (a DMA-capable provider).
    keeper: Option<Arc<dyn RegionKeeper>>,
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.keep(std::mem::take(&mut self.buf));
        }
    }
}

impl Region {
    /// Allocate a zeroed, 64-byte-aligned, not yet registered region of `len` bytes.
    pub fn new(len: usize) -> Self {
        let buf = vec![0u8; len + REGION_ALIGN].into_boxed_slice();
        let base = buf.as_ptr().align_offset(REGION_ALIGN).min(REGION_ALIGN);
        Region {
            buf,
            base,
            len,
            lkey: None,
            keeper: None,
        }
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no usable bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key, once a provider registered the region.
    pub fn lkey(&self) -> Option<u32> {
        self.lkey
    }

    /// Record the provider's local key (called by providers from `register`).
    pub fn set_lkey(&mut self, lkey: Option<u32>) {
        self.lkey = lkey;
    }

    /// Hand the storage to `keeper` when this region drops, instead of freeing
    /// it (called by providers whose device does DMA, from `register`).
    pub fn set_keeper(&mut self, keeper: Arc<dyn RegionKeeper>) {
        self.keeper = Some(keeper);
    }

    /// The whole usable memory.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.base..self.base + self.len]
    }

    /// The whole usable memory, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.base..self.base + self.len]
    }

    /// Address of the first usable byte (what a verbs provider registers).
    pub fn addr(&self) -> usize {
        self.bytes().as_ptr() as usize
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .finish()
    }
}

/// A scatter/gather element: `len` bytes at `offset` in region `region`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Index of the region in the owning [`Memory`].
    pub region: u32,
    /// Byte offset in the region.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
    /// The region's local key, checked by the provider like hardware does.
    pub lkey: u32,
}

/// Every region a socket owns, addressed by index.
#[derive(Debug, Default)]
pub struct Memory {
    regions: Vec<Region>,
}

impl Memory {
    /// An empty set of regions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a region; returns its index.
    pub fn push(&mut self, region: Region) -> u32 {
        self.regions.push(region);
        (self.regions.len() - 1) as u32
    }

    /// The region at `index`.
    pub fn region(&self, index: u32) -> Option<&Region> {
        self.regions.get(index as usize)
    }

    /// The region at `index`, mutably.
    pub fn region_mut(&mut self, index: u32) -> Option<&mut Region> {
        self.regions.get_mut(index as usize)
    }

    /// All regions.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// All regions, mutably.
    pub fn regions_mut(&mut self) -> &mut [Region] {
        &mut self.regions
    }

    /// Resolve an SGE the way hardware does: the lkey must match a registered
    /// region and the range must lie inside it.
    pub fn resolve(&self, sge: &Sge) -> Option<&[u8]> {
        let r = self.regions.get(sge.region as usize)?;
        if r.lkey != Some(sge.lkey) {
            return None;
        }
        r.bytes()
            .get(sge.offset as usize..sge.offset as usize + sge.len as usize)
    }

    /// Mutable form of [`Memory::resolve`].
    pub fn resolve_mut(&mut self, sge: &Sge) -> Option<&mut [u8]> {
        let r = self.regions.get_mut(sge.region as usize)?;
        if r.lkey != Some(sge.lkey) {
            return None;
        }
        r.bytes_mut()
            .get_mut(sge.offset as usize..sge.offset as usize + sge.len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned() {
        for len in [1, 63, 4096, 1 << 20] {
            let r = Region::new(len);
            assert_eq!(r.addr() % REGION_ALIGN, 0);
            assert_eq!(r.bytes().len(), len);
        }
    }

    #[test]
    fn resolve_checks_lkey_and_bounds() {
        let mut m = Memory::new();
        let mut r = Region::new(128);
        r.set_lkey(Some(7));
        let i = m.push(r);
        let ok = Sge {
            region: i,
            offset: 64,
            len: 64,
            lkey: 7,
        };
        assert_eq!(m.resolve(&ok).unwrap().len(), 64);
        assert!(m.resolve(&Sge { lkey: 8, ..ok }).is_none());
        assert!(m.resolve(&Sge { len: 65, ..ok }).is_none());
        assert!(m.resolve(&Sge { region: 1, ..ok }).is_none());
    }

    /// A dropped region's storage goes to its keeper, still at the address the
    /// device was given; without a keeper it is simply freed.
    #[test]
    fn keeper_takes_the_storage() {
        use std::sync::Mutex;
        #[derive(Default)]
        struct Keep(Mutex<Vec<Box<[u8]>>>);
        impl RegionKeeper for Keep {
            fn keep(&self, storage: Box<[u8]>) {
                self.0.lock().unwrap().push(storage);
            }
        }
        let keep = Arc::new(Keep::default());
        let mut r = Region::new(4096);
        r.bytes_mut()[0] = 0xAB;
        let addr = r.addr();
        r.set_keeper(keep.clone());
        drop(r);
        let kept = keep.0.lock().unwrap();
        assert_eq!(kept.len(), 1);
        let base = kept[0].as_ptr() as usize;
        assert!(base <= addr && addr < base + REGION_ALIGN);
        assert_eq!(kept[0][addr - base], 0xAB);
        drop(Region::new(16)); // no keeper: nothing to hand over
    }
}
