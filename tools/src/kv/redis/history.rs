//! The replication history the downstream relay serves, as it last saw it
//! from the upstream relay: the current replication id and offset, and the
//! previous id with the offset where it ended (PSYNC2's `replid2` and
//! `second_repl_offset`, Redis replication docs, "Replication ID
//! explained"). `INFO replication` and `ROLE` show it.

use std::sync::Mutex;

/// Redis's id for "no such history" (`master_replid2` before any switch).
pub const NO_REPLID: &str = "0000000000000000000000000000000000000000";

/// A snapshot of the history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ids {
    /// Current replication id (`None` before any session).
    pub replid: Option<String>,
    /// Highest offset of the current id seen so far.
    pub offset: u64,
    /// The previous id, if the history switched ids.
    pub replid2: Option<String>,
    /// The last offset valid under `replid2`.
    pub second_offset: Option<u64>,
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

    /// A session saw `replid` at `offset`: move the offset forward, or start
    /// over with a new id.
    pub fn observe(&self, replid: &str, offset: u64) {
        let mut ids = self.lock();
        if ids.replid.as_deref() == Some(replid) {
            ids.offset = ids.offset.max(offset);
        } else {
            ids.replid = Some(replid.to_string());
            ids.offset = offset;
        }
    }

    /// The previous id and the offset where it ended, as the upstream says.
    pub fn set_previous(&self, replid2: Option<(String, u64)>) {
        let mut ids = self.lock();
        (ids.replid2, ids.second_offset) = match replid2 {
            Some((r, o)) => (Some(r), Some(o)),
            None => (None, None),
        };
    }

    /// The view now.
    pub fn get(&self) -> Ids {
        self.lock().clone()
    }
}
