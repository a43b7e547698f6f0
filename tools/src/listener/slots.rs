//! The connection cap of a TCP listener, with room made by evicting idle
//! connections: a flood of connections that never send a request (or that
//! sit between requests) cannot lock a real client out, because a new
//! connection takes the slot of the one idle longest. Only connections in the
//! middle of a request are protected; those end by themselves (the stall
//! timeout bounds a client that stops reading).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use slab::Slab;
use tokio::sync::Notify;

/// The table of open connections of one listener, at most `cap` of them.
#[derive(Debug)]
pub struct Slots {
    table: Mutex<Table>,
    cap: usize,
}

#[derive(Debug, Default)]
struct Table {
    entries: Slab<Entry>,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    /// Distinguishes a reused slab key from the entry that was evicted from it.
    id: u64,
    /// Requests in progress (a response body still streaming counts).
    busy: u32,
    /// When `busy` last fell to 0 (or the connection opened).
    idle_since: Instant,
    evict: Arc<Notify>,
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// Every slot holds a connection in the middle of a request.
    AllBusy,
}

/// How a connection got its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// A slot was free.
    Free,
    /// The connection idle longest was evicted to make room.
    Evicted,
}

impl Slots {
    /// A table of at most `cap` connections (at least 1).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table::default()),
            cap: cap.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection: a free one, or the slot of the connection
    /// idle longest (which is told to close), or `Err` if all are busy.
    pub fn admit(self: &Arc<Self>) -> Result<(Slot, Admitted), Refused> {
        let mut t = self.lock();
        let how = if t.entries.len() < self.cap {
            Admitted::Free
        } else if Self::evict_locked(&mut t) {
            Admitted::Evicted
        } else {
            return Err(Refused::AllBusy);
        };
        let id = t.next_id;
        t.next_id += 1;
        let evict = Arc::new(Notify::new());
        let key = t.entries.insert(Entry {
            id,
            busy: 0,
            idle_since: Instant::now(),
            evict: evict.clone(),
        });
        Ok((
            Slot {
                slots: self.clone(),
                key,
                id,
                evict,
            },
            how,
        ))
    }

    /// Close the connection idle longest, if any is idle (to free a file
    /// descriptor when accepting fails for want of one). True if one was.
    pub fn evict_oldest_idle(&self) -> bool {
        Self::evict_locked(&mut self.lock())
    }

    fn evict_locked(t: &mut Table) -> bool {
        let oldest = t
            .entries
            .iter()
            .filter(|(_, e)| e.busy == 0)
            .min_by_key(|(_, e)| e.idle_since)
            .map(|(k, _)| k);
        match oldest {
            Some(k) => {
                // `notify_one` stores a permit: the connection closes even if
                // its task is not waiting yet.
                t.entries.remove(k).evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Connections holding a slot now.
    pub fn open(&self) -> usize {
        self.lock().entries.len()
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// One connection's place in [`Slots`]; the slot is freed when this drops.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    key: usize,
    id: u64,
    evict: Arc<Notify>,
}

impl Slot {
    /// Completes when the connection has been chosen for eviction: its task
    /// should then drop the connection.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// Mark a request in progress until the returned guard drops; a busy
    /// connection is never evicted.
    pub fn busy(&self) -> Busy {
        self.with_entry(|e| e.busy += 1);
        Busy {
            slots: self.slots.clone(),
            key: self.key,
            id: self.id,
        }
    }

    fn with_entry(&self, f: impl FnOnce(&mut Entry)) {
        with_entry(&self.slots, self.key, self.id, f)
    }
}

fn with_entry(slots: &Slots, key: usize, id: u64, f: impl FnOnce(&mut Entry)) {
    let mut t = slots.lock();
    if let Some(e) = t.entries.get_mut(key).filter(|e| e.id == id) {
        f(e);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.slots.lock();
        if t.entries.get(self.key).is_some_and(|e| e.id == self.id) {
            t.entries.remove(self.key);
        }
    }
}

/// A request in progress on a connection (see [`Slot::busy`]).
#[derive(Debug)]
pub struct Busy {
    slots: Arc<Slots>,
    key: usize,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        with_entry(&self.slots, self.key, self.id, |e| {
            e.busy -= 1;
            if e.busy == 0 {
                e.idle_since = Instant::now();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_table_evicts_the_connection_idle_longest_never_a_busy_one() {
        let slots = Slots::new(2);
        let (a, how) = slots.admit().unwrap();
        assert_eq!(how, Admitted::Free);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let (b, _) = slots.admit().unwrap();
        let _busy_b = b.busy();
        // Full: `a` is idle, `b` busy, so `a` goes.
        let (c, how) = slots.admit().unwrap();
        assert_eq!(how, Admitted::Evicted);
        tokio::time::timeout(std::time::Duration::from_secs(1), a.evicted())
            .await
            .expect("the idle connection is told to close");
        assert_eq!(slots.open(), 2);
        // `a`'s late drop must not free the slot now owned by `c`.
        drop(a);
        assert_eq!(slots.open(), 2);
        let _busy_c = c.busy();
        assert_eq!(slots.admit().err(), Some(Refused::AllBusy));
        drop(_busy_c);
        assert_eq!(slots.admit().map(|(_, h)| h).ok(), Some(Admitted::Evicted));
    }

    #[test]
    fn evicting_for_a_file_descriptor_takes_only_idle_connections() {
        let slots = Slots::new(4);
        let (a, _) = slots.admit().unwrap();
        let _g = a.busy();
        assert!(!slots.evict_oldest_idle());
        let (_b, _) = slots.admit().unwrap();
        assert!(slots.evict_oldest_idle());
        assert_eq!(slots.open(), 1);
    }
}
