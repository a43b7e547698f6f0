//! Registered memory: the regions send and receive work requests point into.
//!
//! Hardware reads and writes only memory registered with it (a memory region and
//! its local key). `sim` and `soft` keep the same contract, so the socket code is
//! one for every provider: it owns the [`Memory`], registers each [`Region`] with
//! its provider, and work requests carry a [`Sge`] (region, offset, length, lkey).

use std::sync::Arc;

use super::FabricError;

/// Cache-line alignment of every region's first usable byte.
pub(crate) const REGION_ALIGN: usize = 64;

/// Takes over a registered region's storage when the [`Region`] is dropped,
/// keeps it allocated for as long as a device may still read or write it, and
/// says which of its bytes the device may be writing right now.
///
/// A NIC writes received packets into registered memory by DMA, outside
/// Rust's view: if a region were freed while its memory stayed registered
/// (and receives into it stayed posted), the device would write into memory
/// the allocator had handed to someone else. A provider whose device does DMA
/// sets a keeper in [`UdQueuePair::register`](super::UdQueuePair::register),
/// so dropping a region — even under posted receives — is always safe: the
/// storage outlives the device's access to it, and is freed when the provider
/// knows the device is done (its queue pair reset or destroyed).
///
/// For the same reason a region's bytes are reached only through accessors
/// ([`Region::slice`], [`Region::slice_mut`], [`Region::vec_mut`],
/// [`Memory::resolve`]) that ask the keeper first: a reference to bytes the
/// device may be writing (a receive posted there and not yet completed) would
/// alias memory changed behind Rust's back, so none is given out.
pub trait RegionKeeper: Send + Sync {
    /// Keep `storage` (the dropped region's whole allocation) alive.
    fn keep(&self, storage: RegionStorage);

    /// Whether the device may be writing into any of the `len` bytes at
    /// address `addr` (`len` > 0): a receive posted there has not completed.
    fn device_writes(&self, addr: usize, len: usize) -> bool;
}

/// The allocation behind a dropped [`Region`], handed to its [`RegionKeeper`]:
/// owned as it was (a boxed slice, or a `Vec` with its capacity), so handing
/// it over never moves or reallocates the memory a device was given.
pub struct RegionStorage(Storage);

impl RegionStorage {
    /// Address of the allocation's first byte.
    pub fn addr(&self) -> usize {
        match &self.0 {
            Storage::Boxed { buf, .. } => buf.as_ptr() as usize,
            Storage::Vec { vec, .. } => vec.as_ptr() as usize,
        }
    }

    /// Bytes allocated (a `Vec`'s capacity, not its length).
    pub fn allocated(&self) -> usize {
        match &self.0 {
            Storage::Boxed { buf, .. } => buf.len(),
            Storage::Vec { vec, .. } => vec.capacity(),
        }
    }
}

impl std::fmt::Debug for RegionStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionStorage")
            .field("allocated", &self.allocated())
            .finish()
    }
}

/// What a region's memory is.
enum Storage {
    /// A fixed block. Over-allocated by REGION_ALIGN so `base` can be 64-byte
    /// aligned without unsafe; a boxed slice never moves its heap storage, so
    /// the alignment holds.
    Boxed {
        buf: Box<[u8]>,
        base: usize,
        len: usize,
    },
    /// A `Vec` whose whole capacity is registered, so it can be lent as
    /// `&mut Vec<u8>` to code that writes by appending (quinn-proto's
    /// `poll_transmit`). `addr`/`cap` are what was registered: should the
    /// borrower make the `Vec` reallocate, it no longer matches them and the
    /// region stops resolving ([`Region::intact`]) — the registered memory was
    /// freed, and a work request must never point there again.
    Vec {
        vec: Vec<u8>,
        addr: usize,
        cap: usize,
    },
}

/// One contiguous block of memory registered with a provider.
pub struct Region {
    storage: Storage,
    lkey: Option<u32>,
    /// Where the storage goes when the region drops (a DMA-capable provider).
    keeper: Option<Arc<dyn RegionKeeper>>,
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            let empty = Storage::Boxed {
                buf: Box::default(),
                base: 0,
                len: 0,
            };
            k.keep(RegionStorage(std::mem::replace(&mut self.storage, empty)));
        }
    }
}

impl Region {
    /// Allocate a zeroed, 64-byte-aligned, not yet registered region of `len` bytes.
    pub fn new(len: usize) -> Self {
        let buf = vec![0u8; len + REGION_ALIGN].into_boxed_slice();
        let base = buf.as_ptr().align_offset(REGION_ALIGN).min(REGION_ALIGN);
        Region {
            storage: Storage::Boxed { buf, base, len },
            lkey: None,
            keeper: None,
        }
    }

    /// Allocate a not yet registered region backed by an empty `Vec<u8>` of
    /// exactly `capacity` bytes, to be lent with [`Region::vec_mut`]. The
    /// registration covers the whole capacity, which is zero-filled before the
    /// `Vec` is cleared: every byte a device may read is initialised.
    ///
    /// The `Vec`'s memory is aligned as the allocator aligns it (not to
    /// [`REGION_ALIGN`]: aligning it would take `unsafe`); DMA does not need it.
    pub fn new_vec(capacity: usize) -> Self {
        let mut vec = vec![0u8; capacity.max(1)];
        vec.clear();
        let (addr, cap) = (vec.as_ptr() as usize, vec.capacity());
        Region {
            storage: Storage::Vec { vec, addr, cap },
            lkey: None,
            keeper: None,
        }
    }

    /// Registered length in bytes: the whole capacity of a `Vec`-backed region.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Boxed { len, .. } => *len,
            Storage::Vec { cap, .. } => *cap,
        }
    }

    /// Whether the region has no usable bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    /// it, and ask it before giving out a reference to any byte (called by
    /// providers whose device does DMA, from `register`).
    ///
    /// A region has at most one keeper for its life: the device of one queue
    /// pair may write into it. Registering it with a second DMA-capable queue
    /// pair is refused (`Registration`); setting the same keeper again is not.
    pub fn set_keeper(&mut self, keeper: Arc<dyn RegionKeeper>) -> Result<(), FabricError> {
        match &self.keeper {
            Some(k) if !Arc::ptr_eq(k, &keeper) => Err(FabricError::Registration(
                "region is already registered with another DMA-capable queue pair".into(),
            )),
            _ => {
                self.keeper = Some(keeper);
                Ok(())
            }
        }
    }

    /// How many bytes are initialised: all of a fixed region; of a
    /// `Vec`-backed one, the bytes written so far (its length).
    pub fn written(&self) -> usize {
        match &self.storage {
            Storage::Boxed { len, .. } => *len,
            Storage::Vec { vec, .. } => vec.len(),
        }
    }

    /// Whether the device may be writing into any of the `len` bytes at `addr`.
    fn device_writes(&self, addr: usize, len: usize) -> bool {
        len > 0
            && self
                .keeper
                .as_ref()
                .is_some_and(|k| k.device_writes(addr, len))
    }

    /// `len` initialised bytes at `offset` (see [`Region::written`]). `None`
    /// if they are not all initialised, or if the device may be writing into
    /// any of them (a receive posted there has not completed): safe code never
    /// holds a reference to bytes a device is writing.
    pub fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        let addr = self.slice_addr(offset, end)?;
        if self.device_writes(addr, len) {
            return None;
        }
        match &self.storage {
            Storage::Boxed { buf, base, len } => buf[*base..*base + *len].get(offset..end),
            Storage::Vec { vec, .. } => vec.get(offset..end),
        }
    }

    /// [`Region::slice`], mutably.
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        let addr = self.slice_addr(offset, end)?;
        if self.device_writes(addr, len) {
            return None;
        }
        match &mut self.storage {
            Storage::Boxed { buf, base, len } => buf[*base..*base + *len].get_mut(offset..end),
            Storage::Vec { vec, .. } => vec.get_mut(offset..end),
        }
    }

    /// Address of the byte at `offset`, if `offset..end` lies in the
    /// initialised bytes.
    fn slice_addr(&self, offset: usize, end: usize) -> Option<usize> {
        (end <= self.written()).then(|| {
            let first = match &self.storage {
                Storage::Boxed { buf, base, .. } => buf.as_ptr() as usize + base,
                Storage::Vec { vec, .. } => vec.as_ptr() as usize,
            };
            first + offset
        })
    }

    /// Address of the first registered byte (what a verbs provider registers):
    /// for a `Vec`-backed region, where its memory was when it was created.
    pub fn addr(&self) -> usize {
        match &self.storage {
            Storage::Boxed { buf, base, .. } => buf.as_ptr() as usize + base,
            Storage::Vec { addr, .. } => *addr,
        }
    }

    /// Whether the memory is still where it was registered. Always true of a
    /// fixed region; false once a lent `Vec` reallocated (or was taken out):
    /// its registered memory is then gone, and nothing resolves in it any more.
    pub fn intact(&self) -> bool {
        match &self.storage {
            Storage::Boxed { .. } => true,
            Storage::Vec { vec, addr, cap } => {
                vec.as_ptr() as usize == *addr && vec.capacity() == *cap
            }
        }
    }

    /// Lend a `Vec`-backed region's `Vec` (`None` for a fixed region, and
    /// while the device may be writing into any byte of its allocation). The
    /// borrower may write, clear and truncate; if it grows the `Vec` past its
    /// capacity the region stops being [`intact`](Region::intact).
    pub fn vec_mut(&mut self) -> Option<&mut Vec<u8>> {
        let (first, cap) = match &self.storage {
            Storage::Boxed { .. } => return None,
            Storage::Vec { vec, .. } => (vec.as_ptr() as usize, vec.capacity()),
        };
        if self.device_writes(first, cap) {
            return None;
        }
        match &mut self.storage {
            Storage::Boxed { .. } => None,
            Storage::Vec { vec, .. } => Some(vec),
        }
    }

    /// Take a `Vec`-backed region's `Vec` out, leaving an empty one behind
    /// (the region is no longer intact). `None` for a fixed region, and while
    /// the device may be writing into it ([`Region::vec_mut`]).
    pub fn take_vec(&mut self) -> Option<Vec<u8>> {
        self.vec_mut().map(std::mem::take)
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len())
            .field("lkey", &self.lkey)
            .field("intact", &self.intact())
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

    /// Put `region` at `index` in place of the one there, which is returned
    /// (`Err(region)` if there is no region at `index`).
    pub fn replace(&mut self, index: u32, region: Region) -> Result<Region, Region> {
        match self.regions.get_mut(index as usize) {
            Some(slot) => Ok(std::mem::replace(slot, region)),
            None => Err(region),
        }
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
    /// region, whose memory is still where it was registered, and the range
    /// must lie inside it (inside the written part of a `Vec`-backed region:
    /// safe code cannot read past a `Vec`'s length). `None` too while the
    /// device may be writing into the range ([`Region::slice`]).
    pub fn resolve(&self, sge: &Sge) -> Option<&[u8]> {
        let r = self.regions.get(sge.region as usize)?;
        if r.lkey != Some(sge.lkey) || !r.intact() {
            return None;
        }
        r.slice(sge.offset as usize, sge.len as usize)
    }

    /// Mutable form of [`Memory::resolve`].
    pub fn resolve_mut(&mut self, sge: &Sge) -> Option<&mut [u8]> {
        let r = self.regions.get_mut(sge.region as usize)?;
        if r.lkey != Some(sge.lkey) || !r.intact() {
            return None;
        }
        r.slice_mut(sge.offset as usize, sge.len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A keeper standing for a DMA-capable provider: it keeps dropped
    /// storage, and the device writes into the address ranges in `writing`.
    #[derive(Default)]
    struct Keep {
        kept: Mutex<Vec<RegionStorage>>,
        writing: Mutex<Vec<(usize, usize)>>,
    }

    impl RegionKeeper for Keep {
        fn keep(&self, storage: RegionStorage) {
            self.kept.lock().unwrap().push(storage);
        }

        fn device_writes(&self, addr: usize, len: usize) -> bool {
            let w = self.writing.lock().unwrap();
            w.iter().any(|&(a, l)| a < addr + len && addr < a + l)
        }
    }

    #[test]
    fn regions_are_aligned() {
        for len in [1, 63, 4096, 1 << 20] {
            let r = Region::new(len);
            assert_eq!(r.addr() % REGION_ALIGN, 0);
            assert_eq!(r.written(), len);
            assert_eq!(r.slice(0, len).unwrap().len(), len);
            assert!(r.slice(0, len + 1).is_none());
            assert!(r.slice(usize::MAX, 2).is_none(), "no overflow");
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

    /// A Vec-backed region registers its whole capacity, resolves only what was
    /// written, and stops resolving once the lent Vec reallocated.
    #[test]
    fn vec_regions_resolve_until_reallocated() {
        let mut m = Memory::new();
        let mut r = Region::new_vec(4096);
        assert_eq!((r.len(), r.written()), (4096, 0));
        assert_eq!(r.addr(), r.vec_mut().unwrap().as_ptr() as usize);
        assert!(Region::new(64).vec_mut().is_none());
        r.set_lkey(Some(3));
        let i = m.push(r);
        let sge = Sge {
            region: i,
            offset: 100,
            len: 1000,
            lkey: 3,
        };
        assert!(m.resolve(&sge).is_none(), "nothing written yet");
        let v = m.region_mut(i).unwrap().vec_mut().unwrap();
        v.resize(4096, 7);
        assert_eq!(m.resolve(&sge).unwrap(), &[7; 1000][..]);
        assert!(m.resolve(&Sge { len: 3997, ..sge }).is_none());
        // Growing past the capacity reallocates: the registered memory is gone.
        m.region_mut(i).unwrap().vec_mut().unwrap().push(1);
        assert!(!m.region(i).unwrap().intact());
        assert!(m.resolve(&sge).is_none());
        assert!(m.resolve_mut(&sge).is_none());
        let old = m.replace(i, Region::new_vec(16)).unwrap();
        assert_eq!(old.written(), 4097);
        assert!(m.replace(9, Region::new(1)).is_err());
    }

    /// A dropped region's storage goes to its keeper, still at the address the
    /// device was given; without a keeper it is simply freed.
    #[test]
    fn keeper_takes_the_storage() {
        let keep = Arc::new(Keep::default());
        let mut r = Region::new(4096);
        r.slice_mut(0, 1).unwrap()[0] = 0xAB;
        let addr = r.addr();
        r.set_keeper(keep.clone()).unwrap();
        drop(r);
        let kept = keep.kept.lock().unwrap();
        assert_eq!(kept.len(), 1);
        let base = kept[0].addr();
        assert!(base <= addr && addr < base + REGION_ALIGN);
        assert_eq!(kept[0].allocated(), 4096 + REGION_ALIGN);
        drop(kept);
        drop(Region::new(16)); // no keeper: nothing to hand over
                               // A Vec-backed region hands over its Vec whole: same memory, same capacity.
        let mut v = Region::new_vec(8192);
        v.vec_mut().unwrap().extend_from_slice(&[1, 2, 3]);
        let addr = v.addr();
        v.set_keeper(keep.clone()).unwrap();
        drop(v);
        let kept = keep.kept.lock().unwrap();
        assert_eq!((kept[1].addr(), kept[1].allocated()), (addr, 8192));
    }

    /// Safe code gets no reference to bytes the device may be writing: every
    /// accessor refuses a range that overlaps one, and serves its neighbours.
    #[test]
    fn no_reference_to_bytes_the_device_writes() {
        let keep = Arc::new(Keep::default());
        let mut m = Memory::new();
        let mut r = Region::new(4 * 64);
        r.set_lkey(Some(5));
        r.set_keeper(keep.clone()).unwrap();
        let addr = r.addr();
        let i = m.push(r);
        let slot = |n: u32| Sge {
            region: i,
            offset: n * 64,
            len: 64,
            lkey: 5,
        };
        // The device writes slot 1.
        keep.writing.lock().unwrap().push((addr + 64, 64));
        let r = m.region_mut(i).unwrap();
        assert!(r.slice(64, 64).is_none());
        assert!(r.slice(127, 1).is_none(), "its last byte");
        assert!(r.slice(0, 65).is_none(), "a range reaching into it");
        assert!(r.slice(0, 256).is_none(), "the whole region");
        assert!(r.slice_mut(64, 1).is_none());
        assert_eq!(r.slice(0, 64).unwrap().len(), 64, "slot 0 is the caller's");
        r.slice_mut(128, 64).unwrap().fill(9);
        assert_eq!(r.slice(64, 0), Some(&[][..]), "no byte, nothing aliased");
        assert!(m.resolve(&slot(1)).is_none());
        assert!(m.resolve_mut(&slot(1)).is_none());
        assert_eq!(m.resolve(&slot(2)).unwrap(), &[9; 64][..]);
        assert!(m.resolve_mut(&slot(3)).is_some());
        // Completed: the caller owns the slot again.
        keep.writing.lock().unwrap().clear();
        assert!(m.resolve_mut(&slot(1)).is_some());

        // A Vec-backed region is not lent while the device writes into it.
        let mut v = Region::new_vec(256);
        v.set_keeper(keep.clone()).unwrap();
        v.vec_mut().unwrap().resize(256, 0);
        keep.writing.lock().unwrap().push((v.addr() + 200, 8));
        assert!(v.vec_mut().is_none());
        assert!(v.take_vec().is_none());
        assert!(v.slice(0, 200).is_some());
        keep.writing.lock().unwrap().clear();
        assert_eq!(v.take_vec().unwrap().len(), 256);
    }

    /// A region's keeper is fixed: a second DMA-capable queue pair could not
    /// be asked which bytes its device writes, nor keep the storage for it.
    #[test]
    fn a_region_has_one_keeper() {
        let (a, b) = (Arc::new(Keep::default()), Arc::new(Keep::default()));
        let mut r = Region::new(64);
        r.set_keeper(a.clone()).unwrap();
        r.set_keeper(a.clone()).unwrap();
        let e = r.set_keeper(b.clone()).unwrap_err();
        assert!(matches!(e, FabricError::Registration(_)), "{e}");
        drop(r);
        assert_eq!(a.kept.lock().unwrap().len(), 1);
        assert!(b.kept.lock().unwrap().is_empty());
    }
}
