//! The gateway's client table: one entry per client (a UDP 4-tuple, or a
//! fabric peer), in two tiers, every tier bounded and every entry expiring.
//!
//! Every entry holds a queue pair or a UDP socket, and anyone can send a
//! datagram from any source, so (docs/architecture.md, "Gateway"):
//! - a source gets an entry only for a well-formed client Initial (checked by
//!   the caller, `quic::is_client_initial`); junk costs nothing;
//! - a new entry is **unvalidated**: a small tier ([`Limits::max_unvalidated`])
//!   that evicts its oldest entry when full, drops every entry
//!   [`Limits::unvalidated_expiry`] after admission, and holds at most
//!   [`Limits::max_unvalidated_per_source`] entries per source IP (or GID) — so
//!   a flood of forged Initials churns only this tier, and one source cannot
//!   fill it;
//! - an entry is **validated** once its client proves it receives what is sent
//!   to its address ([`ClientTable::validate`]); validated entries are bounded
//!   ([`Limits::max_clients`], [`Limits::max_per_source`]), never evicted to
//!   make room (an attacker cannot push live connections out) and removed after
//!   [`Limits::idle_timeout`] without traffic either way.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Limits;

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

/// Why [`ClientTable::admit`] refused a new client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source IP already has as many entries as it may.
    SourceLimit,
    /// The validated tier is full: it could never be validated.
    Full,
}

/// What [`ClientTable::admit`] did.
#[derive(Debug)]
pub enum Admission<'a, V> {
    /// Admitted as unvalidated; `evicted` is the oldest unvalidated entry,
    /// pushed out to make room.
    New {
        /// The new client's state.
        value: &'a V,
        /// The entry evicted for it, if the tier was full.
        evicted: Option<V>,
    },
    /// Refused; nothing was made.
    Refused(Refusal),
}

/// What [`ClientTable::expire`] removed.
#[derive(Debug)]
pub struct Expired<V> {
    /// Unvalidated entries whose time ran out.
    pub unvalidated: Vec<V>,
    /// Validated entries silent for the idle timeout.
    pub idle: Vec<V>,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    activity: Arc<Activity>,
    source: IpAddr,
    /// When it was admitted, while unvalidated; `None` once validated.
    unvalidated_since: Option<Instant>,
}

/// Entries of one source IP, per tier.
#[derive(Clone, Copy, Debug, Default)]
struct PerSource {
    unvalidated: usize,
    total: usize,
}

/// The two-tier client table (see the [module docs](self)).
#[derive(Debug)]
pub struct ClientTable<K, V> {
    map: HashMap<K, Entry<V>>,
    /// Unvalidated entries, oldest first, with their admission time (entries
    /// since validated or removed are skipped).
    fifo: VecDeque<(K, Instant)>,
    sources: HashMap<IpAddr, PerSource>,
    unvalidated: usize,
    limits: Limits,
    epoch: Instant,
}

impl<K: Hash + Eq + Clone, V> ClientTable<K, V> {
    /// An empty table bounded by `limits`.
    pub fn new(limits: Limits) -> Self {
        ClientTable {
            map: HashMap::new(),
            fifo: VecDeque::new(),
            sources: HashMap::new(),
            unvalidated: 0,
            limits,
            epoch: Instant::now(),
        }
    }

    /// The client `key`'s state, touched at `now`, and whether it is validated.
    pub fn get(&self, key: &K, now: Instant) -> Option<(&V, bool)> {
        let e = self.map.get(key)?;
        e.activity.touch(now);
        Some((&e.value, e.unvalidated_since.is_none()))
    }

    /// Admit the new client `key` from `source` as unvalidated, with the state
    /// `make` builds from its activity record (a failing `make` admits nothing
    /// and returns its error). The caller checked that `key` is unknown.
    pub fn admit<E>(
        &mut self,
        key: &K,
        source: IpAddr,
        now: Instant,
        make: impl FnOnce(Arc<Activity>) -> Result<V, E>,
    ) -> Result<Admission<'_, V>, E> {
        debug_assert!(!self.map.contains_key(key));
        let per = self.sources.get(&source).copied().unwrap_or_default();
        if per.unvalidated >= self.limits.max_unvalidated_per_source
            || per.total >= self.limits.max_per_source
        {
            return Ok(Admission::Refused(Refusal::SourceLimit));
        }
        if self.validated() >= self.limits.max_clients {
            return Ok(Admission::Refused(Refusal::Full));
        }
        let activity = Arc::new(Activity::new(self.epoch, now));
        let value = make(activity.clone())?;
        let evicted = if self.unvalidated >= self.limits.max_unvalidated {
            self.pop_oldest_unvalidated()
        } else {
            None
        };
        self.fifo.push_back((key.clone(), now));
        self.unvalidated += 1;
        let per = self.sources.entry(source).or_default();
        per.unvalidated += 1;
        per.total += 1;
        let e = self.map.entry(key.clone()).or_insert(Entry {
            value,
            activity,
            source,
            unvalidated_since: Some(now),
        });
        Ok(Admission::New {
            value: &e.value,
            evicted,
        })
    }

    /// The client `key` proved its address: move it to the validated tier.
    /// `false` if it is unknown, already validated, or the validated tier is
    /// full (it stays unvalidated, and expires).
    pub fn validate(&mut self, key: &K) -> bool {
        let full = self.validated() >= self.limits.max_clients;
        let Some(e) = self.map.get_mut(key) else {
            return false;
        };
        if full || e.unvalidated_since.take().is_none() {
            return false;
        }
        self.unvalidated -= 1;
        if let Some(per) = self.sources.get_mut(&e.source) {
            per.unvalidated -= 1;
        }
        true
    }

    /// Remove and return the unvalidated entries admitted at least
    /// `unvalidated_expiry` ago and the validated ones idle for `idle_timeout`.
    pub fn expire(&mut self, now: Instant) -> Expired<V> {
        let mut unvalidated = Vec::new();
        while let Some((key, since)) = self.fifo.front() {
            if now.saturating_duration_since(*since) < self.limits.unvalidated_expiry {
                break;
            }
            let (key, since) = (key.clone(), *since);
            self.fifo.pop_front();
            if self.is_unvalidated_since(&key, since) {
                unvalidated.extend(self.remove(&key));
            }
        }
        let idle_timeout = self.limits.idle_timeout;
        let gone: Vec<K> = self
            .map
            .iter()
            .filter(|(_, e)| {
                e.unvalidated_since.is_none() && e.activity.idle_at(now) >= idle_timeout
            })
            .map(|(k, _)| k.clone())
            .collect();
        let idle = gone.iter().filter_map(|k| self.remove(k)).collect();
        // Validated and removed entries leave stale FIFO records behind; keep
        // the FIFO within a small multiple of its tier.
        if self.fifo.len() > 2 * self.limits.max_unvalidated + 64 {
            let map = &self.map;
            self.fifo.retain(
                |(k, since)| matches!(map.get(k), Some(e) if e.unvalidated_since == Some(*since)),
            );
        }
        Expired { unvalidated, idle }
    }

    /// Clients in the table, both tiers.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Unvalidated clients in the table.
    pub fn unvalidated(&self) -> usize {
        self.unvalidated
    }

    /// Validated clients in the table.
    pub fn validated(&self) -> usize {
        self.map.len() - self.unvalidated
    }

    fn is_unvalidated_since(&self, key: &K, since: Instant) -> bool {
        matches!(self.map.get(key), Some(e) if e.unvalidated_since == Some(since))
    }

    fn pop_oldest_unvalidated(&mut self) -> Option<V> {
        while let Some((key, since)) = self.fifo.pop_front() {
            if self.is_unvalidated_since(&key, since) {
                return self.remove(&key);
            }
        }
        None
    }

    fn remove(&mut self, key: &K) -> Option<V> {
        let e = self.map.remove(key)?;
        if let Some(per) = self.sources.get_mut(&e.source) {
            per.total -= 1;
            if e.unvalidated_since.is_some() {
                per.unvalidated -= 1;
            }
            if per.total == 0 {
                self.sources.remove(&e.source);
            }
        }
        if e.unvalidated_since.is_some() {
            self.unvalidated -= 1;
        }
        Some(e.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_clients: 3,
            max_unvalidated: 2,
            max_unvalidated_per_source: 2,
            max_per_source: 3,
            unvalidated_expiry: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn admit(t: &mut ClientTable<u32, u32>, k: u32, src: IpAddr, now: Instant) -> Option<u32> {
        match t.admit(&k, src, now, |_| Ok::<_, ()>(k)).unwrap() {
            Admission::New { evicted, .. } => evicted,
            Admission::Refused(r) => panic!("{k} refused: {r:?}"),
        }
    }

    #[test]
    fn a_flood_of_unvalidated_clients_churns_only_its_own_tier() {
        let t0 = Instant::now();
        let mut t = ClientTable::new(limits());
        assert_eq!(admit(&mut t, 1, A, t0), None);
        assert!(t.validate(&1));
        assert!(!t.validate(&1), "once");
        // Unvalidated 2 and 3 (per source: 2 of A's unvalidated slots).
        assert_eq!(admit(&mut t, 2, B, t0), None);
        assert_eq!(admit(&mut t, 3, A, t0), None);
        // The tier is full: the oldest unvalidated goes, never the validated.
        assert_eq!(admit(&mut t, 4, B, t0), Some(2));
        assert_eq!(t.get(&1, t0).map(|(v, ok)| (*v, ok)), Some((1, true)));
        assert!(t.get(&2, t0).is_none());
        assert_eq!((t.validated(), t.unvalidated()), (1, 2));
    }

    #[test]
    fn one_source_cannot_take_more_than_its_share() {
        let t0 = Instant::now();
        let mut t = ClientTable::new(Limits {
            max_unvalidated: 10,
            ..limits()
        });
        admit(&mut t, 1, A, t0);
        admit(&mut t, 2, A, t0);
        let r = t.admit(&3, A, t0, |_| Ok::<_, ()>(3)).unwrap();
        assert!(matches!(r, Admission::Refused(Refusal::SourceLimit)));
        // Validated entries count toward the source's total, not its
        // unvalidated share.
        assert!(t.validate(&1) && t.validate(&2));
        admit(&mut t, 3, A, t0);
        let r = t.admit(&4, A, t0, |_| Ok::<_, ()>(4)).unwrap();
        assert!(matches!(r, Admission::Refused(Refusal::SourceLimit)));
        admit(&mut t, 5, B, t0);
    }

    #[test]
    fn unvalidated_entries_expire_fast_and_validated_ones_when_idle() {
        let t0 = Instant::now();
        let mut t = ClientTable::new(limits());
        admit(&mut t, 1, A, t0);
        admit(&mut t, 2, B, t0);
        assert!(t.validate(&1));
        // Traffic does not extend an unvalidated entry's time.
        let t1 = t0 + Duration::from_secs(1);
        assert!(t.get(&2, t1).is_some());
        let e = t.expire(t0 + Duration::from_secs(2));
        assert_eq!((e.unvalidated, e.idle.len()), (vec![2], 0));
        // The validated one lives while anything moves, either way.
        let (_, _) = t.get(&1, t0 + Duration::from_secs(20)).unwrap();
        assert!(t.expire(t0 + Duration::from_secs(40)).idle.is_empty());
        assert_eq!(t.expire(t0 + Duration::from_secs(50)).idle, vec![1]);
        assert!(t.is_empty());
        assert!(t.sources.is_empty(), "per-source counts return to zero");
    }

    #[test]
    fn a_full_validated_tier_refuses_and_failed_admission_leaves_no_entry() {
        let t0 = Instant::now();
        let mut t = ClientTable::new(Limits {
            max_clients: 1,
            ..limits()
        });
        admit(&mut t, 1, A, t0);
        assert!(t.validate(&1));
        let r = t.admit(&2, B, t0, |_| Ok::<_, ()>(2)).unwrap();
        assert!(matches!(r, Admission::Refused(Refusal::Full)));
        let mut t = ClientTable::<u32, u32>::new(limits());
        assert!(t.admit(&3, B, t0, |_| Err("no QP")).is_err());
        assert_eq!((t.len(), t.unvalidated()), (0, 0));
        assert!(!t.sources.contains_key(&B));
    }
}
