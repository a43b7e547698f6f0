//! The keeper of registered memory (the registration itself is
//! `register.rs`): it makes dropping a registered [`Region`] sound and keeps
//! safe code away from the receive buffers the device is writing.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::fabric::{RegionKeeper, RegionStorage};

/// What the device of a [`VerbsQp`](super::VerbsQp) may still touch of the regions registered
/// with it, shared with each of them as its [`RegionKeeper`]: the receive
/// buffers posted and not completed (the device may be writing them: no
/// region accessor hands them out), and the storage of regions dropped while
/// registered (kept allocated until the QP is destroyed, because the device
/// may write into posted receive buffers until then).
#[derive(Default)]
pub(super) struct KeptRegions(Mutex<Kept>);

#[derive(Default)]
pub(super) struct Kept {
    /// Receive buffers the device may be writing.
    pub(super) posted: PostedRecvs,
    storage: Vec<RegionStorage>,
    teardown: Teardown,
}

impl Drop for Kept {
    /// The last region (or the QP) let go. If the QP could not be destroyed,
    /// its device may still write into this storage: leak it, never free it.
    fn drop(&mut self) {
        if self.teardown == Teardown::Leaked {
            std::mem::forget(std::mem::take(&mut self.storage));
        }
    }
}

/// Where the QP is in its life, as far as its regions' memory is concerned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Teardown {
    /// The QP exists: the device may write into posted receive buffers.
    #[default]
    Live,
    /// The QP was destroyed: the device writes nothing any more.
    Released,
    /// `ibv_destroy_qp` failed: the device may write into the QP's receive
    /// buffers for as long as the process lives, so nothing is ever freed.
    Leaked,
}

impl KeptRegions {
    pub(super) fn lock(&self) -> MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The QP was destroyed: free what was kept, and free from now on the
    /// storage of regions that drop later.
    pub(super) fn release(&self) {
        let mut k = self.lock();
        if k.teardown == Teardown::Leaked {
            return;
        }
        k.teardown = Teardown::Released;
        k.posted.clear();
        k.storage.clear();
    }

    /// The QP could not be destroyed: never free the storage kept, nor that
    /// of regions that drop later (see `Drop for Kept`), and keep every posted
    /// receive buffer out of safe code's reach for good.
    pub(super) fn leak(&self) {
        self.lock().teardown = Teardown::Leaked;
    }

    /// The QP went through RESET: the device forgot every posted receive.
    pub(super) fn reset_posted(&self) {
        self.lock().posted.clear();
    }

    /// Receives that completed (handed to the caller): their buffers are the
    /// caller's again.
    pub(super) fn completed(&self, wr_ids: impl IntoIterator<Item = u64>) {
        let mut k = self.lock();
        for id in wr_ids {
            if !k.posted.complete(id) {
                tracing::debug!(wr_id = id, "receive completion for no posted buffer");
            }
        }
    }

    /// How many dropped regions' storage is being kept.
    pub(super) fn len(&self) -> usize {
        self.lock().storage.len()
    }
}

impl RegionKeeper for KeptRegions {
    fn keep(&self, storage: RegionStorage) {
        let mut k = self.lock();
        match k.teardown {
            Teardown::Live | Teardown::Leaked => k.storage.push(storage),
            Teardown::Released => drop(storage),
        }
    }

    fn device_writes(&self, addr: usize, len: usize) -> bool {
        self.lock().posted.overlaps(addr, len)
    }
}

/// The receive buffers posted to the device and not yet completed, by address.
/// They never overlap (a buffer posted twice would be written twice at once:
/// refused), and they complete in the order they were posted (a QP's receive
/// queue is a FIFO, flushed in order too).
#[derive(Debug, Default)]
pub(super) struct PostedRecvs {
    /// First address → one past the last, of each buffer.
    ranges: BTreeMap<usize, usize>,
    /// `(wr_id, first address)` in posting order.
    order: VecDeque<(u64, usize)>,
}

impl PostedRecvs {
    /// Whether any of the `len` bytes at `addr` lies in a posted buffer.
    pub(super) fn overlaps(&self, addr: usize, len: usize) -> bool {
        // The buffer starting last before the range's end is the only
        // candidate: every earlier one ends before it starts.
        len > 0
            && self
                .ranges
                .range(..addr.saturating_add(len))
                .next_back()
                .is_some_and(|(_, &end)| end > addr)
    }

    /// Record the receive `wr_id` of `len` bytes at `addr`, about to be
    /// posted; `false` (nothing recorded) if it overlaps one still posted.
    pub(super) fn post(&mut self, wr_id: u64, addr: usize, len: usize) -> bool {
        let len = len.max(1);
        if self.overlaps(addr, len) {
            return false;
        }
        self.ranges.insert(addr, addr.saturating_add(len));
        self.order.push_back((wr_id, addr));
        true
    }

    /// Forget the last `n` recorded: the device refused them.
    pub(super) fn unpost_last(&mut self, n: usize) {
        for _ in 0..n {
            if let Some((_, addr)) = self.order.pop_back() {
                self.ranges.remove(&addr);
            }
        }
    }

    /// The receive `wr_id` completed: forget the oldest one posted with that
    /// id. `false` if none is.
    pub(super) fn complete(&mut self, wr_id: u64) -> bool {
        let Some(i) = self.order.iter().position(|&(id, _)| id == wr_id) else {
            return false;
        };
        if let Some((_, addr)) = self.order.remove(i) {
            self.ranges.remove(&addr);
        }
        true
    }

    /// The device forgot every posted receive.
    pub(super) fn clear(&mut self) {
        self.ranges.clear();
        self.order.clear();
    }

    /// Receives posted and not completed.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{FabricError, Memory, Region, Sge};
    use std::sync::Arc;

    #[test]
    fn posted_buffers_are_found_by_any_overlapping_byte() {
        let mut p = PostedRecvs::default();
        assert!(p.post(0, 1000, 64));
        assert!(p.post(1, 1064, 64));
        for (addr, len, want) in [
            (999, 1, false),
            (1000, 1, true),
            (1063, 1, true),
            (1127, 1, true),
            (1128, 1, false),
            (900, 100, false),
            (900, 101, true),
            (0, usize::MAX, true),
            (1000, 0, false),
        ] {
            assert_eq!(p.overlaps(addr, len), want, "{addr} + {len}");
        }
        assert!(!p.post(2, 1032, 64), "overlaps both");
        assert!(!p.post(2, 1000, 64), "the same buffer twice");
        assert_eq!(p.len(), 2, "refused posts are not recorded");
        assert!(p.complete(1));
        assert!(!p.overlaps(1064, 64));
        assert!(!p.complete(1) && !p.complete(7), "no such receive");
        assert!(p.post(3, 1064, 64));
        p.unpost_last(1);
        assert!(!p.overlaps(1064, 64), "refused by the device: not posted");
        assert!(p.overlaps(1000, 64));
        p.clear();
        assert_eq!(p.len(), 0);
        assert!(!p.overlaps(0, usize::MAX));
    }

    /// Receives complete in posting order: a reused wr_id completes the oldest.
    #[test]
    fn a_reused_wr_id_completes_the_oldest_receive() {
        let mut p = PostedRecvs::default();
        assert!(p.post(5, 0, 64));
        assert!(p.post(5, 64, 64));
        assert!(p.post(6, 128, 0), "a zero-length buffer");
        assert!(p.overlaps(128, 1), "tracked as one byte");
        assert!(p.complete(5));
        assert!(!p.overlaps(0, 64));
        assert!(p.overlaps(64, 64));
    }

    fn registered(kept: &Arc<KeptRegions>, len: usize) -> Region {
        let mut r = Region::new(len);
        r.set_keeper(kept.clone() as Arc<dyn RegionKeeper>).unwrap();
        r.set_lkey(Some(1));
        r
    }

    fn slot(region: u32, n: u32) -> Sge {
        Sge {
            region,
            offset: n * 64,
            len: 64,
            lkey: 1,
        }
    }

    /// Between post and completion the region accessors refuse a receive
    /// buffer; a reset (or the QP's destruction) gives every buffer back.
    #[test]
    fn a_posted_buffer_is_nobody_elses_until_it_completes() {
        let kept = Arc::new(KeptRegions::default());
        let mut mem = Memory::new();
        let r = mem.push(registered(&kept, 4 * 64));
        let addr = mem.region(r).unwrap().addr();
        for (id, n) in [(10, 1), (11, 2)] {
            assert!(kept.lock().posted.post(id, addr + n * 64, 64));
        }
        assert!(mem.resolve(&slot(r, 1)).is_none());
        assert!(mem.resolve_mut(&slot(r, 2)).is_none());
        assert!(mem.region(r).unwrap().slice(0, 4 * 64).is_none());
        assert!(mem.resolve_mut(&slot(r, 0)).is_some(), "not posted");
        assert!(mem.resolve_mut(&slot(r, 3)).is_some(), "not posted");
        kept.completed([10]);
        assert!(mem.resolve(&slot(r, 1)).is_some(), "completed");
        assert!(mem.resolve(&slot(r, 2)).is_none(), "still posted");
        kept.reset_posted();
        assert!(mem.resolve(&slot(r, 2)).is_some(), "the device forgot it");
        // A region can be kept by one QP only.
        let other = Arc::new(KeptRegions::default());
        let e = mem
            .region_mut(r)
            .unwrap()
            .set_keeper(other as Arc<dyn RegionKeeper>);
        assert!(matches!(e, Err(FabricError::Registration(_))), "{e:?}");
    }

    /// After a successful destroy, kept storage is freed, later drops free at
    /// once, and no buffer is posted any more.
    #[test]
    fn release_frees_what_was_kept() {
        let kept = Arc::new(KeptRegions::default());
        let mut mem = Memory::new();
        let r = mem.push(registered(&kept, 128));
        let addr = mem.region(r).unwrap().addr();
        assert!(kept.lock().posted.post(1, addr, 64));
        drop(registered(&kept, 64));
        assert_eq!(kept.len(), 1, "kept while the device may write");
        kept.release();
        assert_eq!(kept.len(), 0);
        assert!(mem.resolve(&slot(r, 0)).is_some());
        drop(registered(&kept, 64));
        assert_eq!(kept.len(), 0, "freed at once: the device is gone");
    }

    /// After `ibv_destroy_qp` failed, nothing is ever freed and the buffers
    /// still posted stay out of reach, whatever happens next.
    #[test]
    fn a_failed_destroy_leaks_and_keeps_posted_buffers_out_of_reach() {
        let kept = Arc::new(KeptRegions::default());
        let mut mem = Memory::new();
        let r = mem.push(registered(&kept, 128));
        let addr = mem.region(r).unwrap().addr();
        assert!(kept.lock().posted.post(1, addr + 64, 64));
        drop(registered(&kept, 64));
        kept.leak();
        kept.release();
        assert_eq!(
            kept.len(),
            1,
            "release after a failed destroy frees nothing"
        );
        assert!(
            mem.resolve(&slot(r, 1)).is_none(),
            "the device may write it"
        );
        assert!(mem.resolve(&slot(r, 0)).is_some());
        drop(registered(&kept, 64));
        assert_eq!(kept.len(), 2, "later drops are kept too");
        // The regions and the keeper go; the storage is leaked, not freed
        // (`Drop for Kept`): this test leaks a few hundred bytes on purpose.
        drop(mem);
        drop(kept);
    }
}
