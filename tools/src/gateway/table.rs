//! The gateway's client table: one entry per client (a UDP 4-tuple, or a
//! fabric peer), bounded in size, each entry expiring after a quiet spell.
//!
//! Bounded on purpose: every entry holds a queue pair or a UDP socket, and a
//! flood of spoofed source addresses must not exhaust either. A client beyond
//! the bound is refused (its datagrams dropped and counted) until an idle entry
//! expires; existing clients are never evicted to make room, so an attacker
//! cannot push live connections out.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When a client was last heard from or sent to, shared with the task that
/// forwards its replies (which touches it too).
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new(epoch: Instant, now: Instant) -> Self {
        let a = Activity {
            epoch,
            last_ms: AtomicU64::new(0),
        };
        a.touch(now);
        a
    }

    /// Record traffic at `now`.
    pub fn touch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn idle_at(&self, now: Instant) -> Duration {
        let last = self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }
}

/// What [`ClientTable::get_or_admit`] found or did.
#[derive(Debug)]
pub enum Admission<'a, V> {
    /// A known client.
    Known(&'a V),
    /// A new client, admitted now.
    New(&'a V),
    /// A new client refused: the table is full.
    Full,
}

/// A bounded map from client key to its state, with idle expiry.
#[derive(Debug)]
pub struct ClientTable<K, V> {
    map: HashMap<K, (V, Arc<Activity>)>,
    max: usize,
    epoch: Instant,
}

impl<K: Hash + Eq + Clone, V> ClientTable<K, V> {
    /// An empty table holding at most `max` clients.
    pub fn new(max: usize) -> Self {
        ClientTable {
            map: HashMap::new(),
            max,
            epoch: Instant::now(),
        }
    }

    /// The client `key`'s state, touched at `now`; if unknown and there is room,
    /// admit it with the state `make` builds from its activity record (a
    /// failing `make` admits nothing and returns its error).
    pub fn get_or_admit<E>(
        &mut self,
        key: &K,
        now: Instant,
        make: impl FnOnce(Arc<Activity>) -> Result<V, E>,
    ) -> Result<Admission<'_, V>, E> {
        if self.map.contains_key(key) {
            let (v, a) = &self.map[key];
            a.touch(now);
            return Ok(Admission::Known(v));
        }
        if self.map.len() >= self.max {
            return Ok(Admission::Full);
        }
        let activity = Arc::new(Activity::new(self.epoch, now));
        let v = make(activity.clone())?;
        let (v, _) = self.map.entry(key.clone()).or_insert((v, activity));
        Ok(Admission::New(v))
    }

    /// Remove and return every client idle for at least `idle` at `now`.
    pub fn expire(&mut self, now: Instant, idle: Duration) -> Vec<(K, V)> {
        let gone: Vec<K> = self
            .map
            .iter()
            .filter(|(_, (_, a))| a.idle_at(now) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| self.map.remove(&k).map(|(v, _)| (k, v)))
            .collect()
    }

    /// Clients in the table.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_refuses_then_admits_after_expiry() {
        let t0 = Instant::now();
        let mut t: ClientTable<u32, u32> = ClientTable::new(2);
        let ok = |_| Ok::<_, ()>(7);
        assert!(matches!(t.get_or_admit(&1, t0, ok), Ok(Admission::New(7))));
        assert!(matches!(t.get_or_admit(&2, t0, ok), Ok(Admission::New(7))));
        assert!(matches!(t.get_or_admit(&3, t0, ok), Ok(Admission::Full)));
        // Client 1 keeps talking, client 2 goes quiet.
        let t1 = t0 + Duration::from_secs(5);
        assert!(matches!(
            t.get_or_admit(&1, t1, ok),
            Ok(Admission::Known(7))
        ));
        let gone = t.expire(t0 + Duration::from_secs(6), Duration::from_secs(3));
        assert_eq!(gone.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![2]);
        assert_eq!(t.len(), 1);
        assert!(matches!(t.get_or_admit(&3, t1, ok), Ok(Admission::New(7))));
    }

    #[test]
    fn reply_traffic_keeps_a_client_alive_and_failed_admission_leaves_no_entry() {
        let t0 = Instant::now();
        let mut t: ClientTable<u32, Arc<Activity>> = ClientTable::new(4);
        let Ok(Admission::New(a)) = t.get_or_admit(&1, t0, Ok::<_, ()>) else {
            panic!("admitted")
        };
        // Only the reply direction is active (the forwarding task touches it).
        a.touch(t0 + Duration::from_secs(10));
        assert!(t
            .expire(t0 + Duration::from_secs(11), Duration::from_secs(3))
            .is_empty());
        assert_eq!(
            t.expire(t0 + Duration::from_secs(13), Duration::from_secs(3))
                .len(),
            1
        );
        assert!(t.get_or_admit(&9, t0, |_| Err("no QP")).is_err());
        assert!(t.is_empty());
    }
}
