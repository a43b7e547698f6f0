//! The replication history the downstream relay serves, as it last saw it
//! from the upstream relay: the current replication id and offset, and the
//! previous id with the offset where it ended (PSYNC2's `replid2` and
//! `second_repl_offset`, Redis replication docs, "Replication ID
//! explained"). `INFO replication` and `ROLE` show it.

use std::sync::Mutex;

use crate::kv::frame::Previous;

/// Redis's id for "no such history" (`master_replid2` before any switch).
pub const NO_REPLID: &str = "0000000000000000000000000000000000000000";

/// A snapshot of the history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ids {
    /// Current replication id (`None` before any session).
    pub replid: Option<String>,
    /// Highest offset of the current id seen so far.
    pub offset: u64,
    /// The previous id and the last offset valid under it, if the history
    /// switched ids.
    pub previous: Option<Previous>,
}

/// The shared, updated view.
#[derive(Debug, Default)]
pub struct History {
    ids: Mutex<Ids>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session began under `replid` at `offset`, the upstream relay naming
    /// the id before it (`previous`).
    pub fn observe(&self, replid: &str, offset: u64, previous: Option<Previous>) {
        let mut ids = self.lock();
        if ids.replid.as_deref() != Some(replid) {
            ids.offset = 0;
        }
        ids.replid = Some(replid.to_string());
        ids.offset = ids.offset.max(offset);
        ids.previous = previous;
    }

    /// A session under `replid` delivered the log up to `offset`; the
    /// furthest offset now.
    pub fn advance(&self, replid: &str, offset: u64) -> u64 {
        let mut ids = self.lock();
        if ids.replid.as_deref() == Some(replid) {
            ids.offset = ids.offset.max(offset);
        }
        ids.offset
    }

    /// The view now.
    pub fn get(&self) -> Ids {
        self.lock().clone()
    }
}
