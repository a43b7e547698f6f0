//! The address-handle cache (DESIGN.md §3).
//!
//! Keyed per (GID, flow label, traffic class, hop limit). Each entry counts the
//! sends in flight that reference it; a retired entry (peer migrated, our GID
//! changed, evicted) is destroyed only when its last send completes — destroying
//! an AH under an in-flight WR is undefined behaviour on hardware.

use std::collections::HashMap;

use slab::Slab;

use super::stats::SocketStats;
use crate::fabric::{AhAttr, AhId, FabricError, Gid, Qpn, UdQueuePair};

/// Index of a cache entry (stable while sends reference it).
pub(crate) type AhRef = usize;

#[derive(Debug)]
struct Entry {
    ah: AhId,
    attr: AhAttr,
    peer: (Qpn, u32),
    inflight: u32,
    retired: bool,
    last_use: u64,
}

/// Address handles by attributes, with in-flight accounting.
#[derive(Debug)]
pub(crate) struct AhCache {
    by_attr: HashMap<AhAttr, AhRef>,
    entries: Slab<Entry>,
    /// Where each peer (QPN, Q_Key) was last seen, to tell a migration.
    peer_gid: HashMap<(Qpn, u32), Gid>,
    capacity: usize,
    clock: u64,
}

impl AhCache {
    pub(crate) fn new(capacity: usize) -> Self {
        AhCache {
            by_attr: HashMap::new(),
            entries: Slab::new(),
            peer_gid: HashMap::new(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    /// The AH for `attr` towards peer (QPN, Q_Key), created on a miss. The caller
    /// must follow with [`AhCache::sent`] for each WR posted with it.
    pub(crate) fn get<Q: UdQueuePair + ?Sized>(
        &mut self,
        qp: &mut Q,
        attr: &AhAttr,
        peer: (Qpn, u32),
        stats: &mut SocketStats,
    ) -> Result<(AhRef, AhId), FabricError> {
        self.clock += 1;
        if let Some(&r) = self.by_attr.get(attr) {
            let e = &mut self.entries[r];
            e.last_use = self.clock;
            stats.ah_hits += 1;
            return Ok((r, e.ah));
        }
        // A peer seen at another GID has migrated: retire the AHs of the old path.
        match self.peer_gid.insert(peer, attr.dgid) {
            Some(old) if old != attr.dgid => {
                stats.ah_rebuilt += 1;
                let stale: Vec<AhRef> = self
                    .entries
                    .iter()
                    .filter(|(_, e)| !e.retired && e.peer == peer && e.attr.dgid == old)
                    .map(|(r, _)| r)
                    .collect();
                for r in stale {
                    self.retire(qp, r, stats);
                }
            }
            _ => {}
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
            peer,
            inflight: 0,
            retired: false,
            last_use: self.clock,
        });
        self.by_attr.insert(*attr, r);
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
