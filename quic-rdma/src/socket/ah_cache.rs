//! The address-handle cache (docs/architecture.md §3).
//!
//! Keyed per (GID, flow label, traffic class, hop limit) — everything an AH
//! holds, and nothing else: an AH names a path to a GID, not a peer, so every
//! peer at one GID shares it whatever its QPN. A peer that moves to a new GID
//! simply needs the AH of that GID; the old path's AH ages out of the bounded
//! LRU like any other. (Tracking "where was QPN q last seen" confused two
//! clients on different hosts with the same QPN — every soft endpoint's
//! default is 0x11 — and rebuilt AHs on every alternation; its map also grew
//! with every spoofed QPN.) Each entry counts the sends in flight that
//! reference it; a retired entry (evicted, or our own GID changed) is
//! destroyed only when its last send completes — destroying an AH under an
//! in-flight WR is undefined behaviour on hardware.
//!
//! Bounded: at most `capacity` live entries, plus retired ones still
//! referenced by sends in flight (at most the send queue's depth).

use std::collections::HashMap;

use slab::Slab;

use super::stats::SocketStats;
use crate::fabric::{AhAttr, AhId, FabricError, UdQueuePair};

/// Index of a cache entry (stable while sends reference it).
pub(crate) type AhRef = usize;

#[derive(Debug)]
struct Entry {
    ah: AhId,
    attr: AhAttr,
    inflight: u32,
    retired: bool,
    last_use: u64,
}

/// Address handles by attributes, with in-flight accounting.
#[derive(Debug)]
pub(crate) struct AhCache {
    by_attr: HashMap<AhAttr, AhRef>,
    entries: Slab<Entry>,
    capacity: usize,
    clock: u64,
    /// The entry the last `get` returned: tried before the map, since a
    /// connection sends to one path (SipHash of the key cost ~340
    /// instructions per send, callgrind). Valid only while that entry is
    /// live with the same attributes: the one live entry per key is the
    /// map's, so a slab index reused since cannot give a wrong AH.
    last: Option<AhRef>,
}

impl AhCache {
    pub(crate) fn new(capacity: usize) -> Self {
        AhCache {
            by_attr: HashMap::new(),
            entries: Slab::new(),
            capacity: capacity.max(1),
            clock: 0,
            last: None,
        }
    }

    /// The AH for `attr`, created on a miss. The caller must follow with
    /// [`AhCache::sent`] for each WR posted with it.
    pub(crate) fn get<Q: UdQueuePair + ?Sized>(
        &mut self,
        qp: &mut Q,
        attr: &AhAttr,
        stats: &mut SocketStats,
    ) -> Result<(AhRef, AhId), FabricError> {
        self.clock += 1;
        if let Some(r) = self.last {
            if let Some(e) = self.entries.get_mut(r) {
                if !e.retired && e.attr == *attr {
                    e.last_use = self.clock;
                    stats.ah_hits += 1;
                    return Ok((r, e.ah));
                }
            }
        }
        if let Some(&r) = self.by_attr.get(attr) {
            self.last = Some(r);
            let e = &mut self.entries[r];
            e.last_use = self.clock;
            stats.ah_hits += 1;
            return Ok((r, e.ah));
        }
        if self.by_attr.len() >= self.capacity {
            if let Some(lru) = self
                .by_attr
                .values()
                .copied()
                .min_by_key(|&r| self.entries[r].last_use)
            {
                self.retire(qp, lru, stats);
            }
        }
        let ah = qp.create_ah(attr)?;
        stats.ah_created += 1;
        let r = self.entries.insert(Entry {
            ah,
            attr: *attr,
            inflight: 0,
            retired: false,
            last_use: self.clock,
        });
        self.by_attr.insert(*attr, r);
        self.last = Some(r);
        Ok((r, ah))
    }

    /// A send using `r` was posted.
    pub(crate) fn sent(&mut self, r: AhRef) {
        self.entries[r].inflight += 1;
    }

    /// A send using `r` completed (or was never posted): release its reference.
    pub(crate) fn completed<Q: UdQueuePair + ?Sized>(
        &mut self,
        qp: &mut Q,
        r: AhRef,
        stats: &mut SocketStats,
    ) {
        let e = &mut self.entries[r];
        e.inflight -= 1;
        if e.retired && e.inflight == 0 {
            self.destroy(qp, r, stats);
        }
    }

    /// Retire every entry: our own GID changed, so every AH (which names the
    /// source GID) must be built again.
    pub(crate) fn retire_all<Q: UdQueuePair + ?Sized>(
        &mut self,
        qp: &mut Q,
        stats: &mut SocketStats,
    ) {
        let live: Vec<AhRef> = self.by_attr.values().copied().collect();
        stats.ah_rebuilt += live.len() as u64;
        for r in live {
            self.retire(qp, r, stats);
        }
    }

    fn retire<Q: UdQueuePair + ?Sized>(&mut self, qp: &mut Q, r: AhRef, stats: &mut SocketStats) {
        let e = &mut self.entries[r];
        if e.retired {
            return;
        }
        e.retired = true;
        self.by_attr.remove(&e.attr);
        if e.inflight == 0 {
            self.destroy(qp, r, stats);
        }
    }

    fn destroy<Q: UdQueuePair + ?Sized>(&mut self, qp: &mut Q, r: AhRef, stats: &mut SocketStats) {
        let e = self.entries.remove(r);
        debug_assert_eq!(e.inflight, 0);
        match qp.destroy_ah(e.ah) {
            Ok(()) => stats.ah_destroyed += 1,
            Err(err) => tracing::warn!(ah = e.ah.0, %err, "destroy_ah failed"),
        }
    }

    /// Live (not retired) entries.
    pub(crate) fn live(&self) -> usize {
        self.by_attr.len()
    }

    /// Retired entries still waiting for their sends to complete.
    pub(crate) fn retired_pending(&self) -> usize {
        self.entries.len() - self.by_attr.len()
    }
}
