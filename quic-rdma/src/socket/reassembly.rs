//! Reassembly of segmented datagrams (the parts of [`super::segment`]), sans-IO:
//! the caller passes each part with the time it was read (`now`), and no clock
//! is read here (docs/architecture.md §6, "Segmented datagrams").
//!
//! Memory is bounded: at most [`ReassemblyConfig::max_datagrams`] datagrams in
//! progress in total and [`ReassemblyConfig::per_peer`] per peer, each in a
//! buffer of [`SEGMENTED_MAX`] bytes created on first need and reused for the
//! socket's life (nothing is allocated per packet). A datagram is dropped whole
//! — never handed up with a part missing — when it times out, or when a new
//! datagram needs its buffer (its peer's oldest first, else the oldest of all);
//! QUIC retransmits what it carried (RFC 9000 §13.3). Malformed and duplicate
//! parts are dropped and counted, never trusted: a part must agree with the
//! datagram's other parts on count, immediate data and part size.

use std::time::{Duration, Instant};

use super::segment::{datagram_imm, PartHeader, SEGMENTED_MAX};

/// Bounds of a [`Reassembler`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReassemblyConfig {
    /// Datagrams in progress at once, over all peers (each holds a buffer of
    /// [`SEGMENTED_MAX`] bytes).
    pub max_datagrams: usize,
    /// Datagrams in progress at once from one peer: a peer sending parts that
    /// never complete takes at most this many buffers.
    pub per_peer: usize,
    /// A datagram whose parts have not all arrived this long after its first
    /// is dropped. The parts of one datagram are posted back to back, so they
    /// arrive microseconds apart unless the fabric reorders; much longer than
    /// that and QUIC has declared the packet lost and sent its frames again.
    pub timeout: Duration,
}

impl Default for ReassemblyConfig {
    fn default() -> Self {
        ReassemblyConfig {
            max_datagrams: 256,
            per_peer: 64,
            timeout: Duration::from_millis(50),
        }
    }
}

/// Counters of a [`Reassembler`] (copied into
/// [`SocketStats`](super::SocketStats) by the socket).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReassemblyStats {
    /// Parts taken into a datagram in progress.
    pub parts: u64,
    /// Datagrams completed and handed up.
    pub reassembled: u64,
    /// Datagrams dropped because a part did not arrive within the timeout.
    pub expired: u64,
    /// Datagrams dropped incomplete to make room for a newer one.
    pub evicted: u64,
    /// Parts dropped as malformed: a bad header, or disagreeing with the
    /// datagram's other parts (count, immediate data, size).
    pub malformed: u64,
    /// Parts dropped because that part of the datagram had already arrived.
    pub duplicates: u64,
}

/// A datagram completed by its last part, borrowed from its reassembly buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Reassembled<'a> {
    /// The datagram's bytes.
    pub data: &'a [u8],
    /// The datagram's own immediate data (see [`super::segment::datagram_imm`]).
    pub imm: Option<u32>,
    /// ECN: Congestion Experienced if any part had it (as IP reassembly does,
    /// RFC 3168 §5.3), else the first part's codepoint.
    pub ecn: u8,
}

#[derive(Debug)]
struct Entry<K> {
    live: bool,
    peer: K,
    id: u32,
    count: u8,
    /// Bit *i* set once part *i* is in.
    have: u16,
    got: u8,
    /// Datagram bytes of every part but the last (0 until one of them arrives).
    part_len: usize,
    /// Datagram bytes of the last part (0 until it arrives). Until `part_len`
    /// is known it waits at the end of the buffer.
    tail_len: usize,
    /// The immediate data every part carries.
    imm: u32,
    ecn: u8,
    born: Instant,
    /// Creation order, to find the oldest.
    seq: u64,
    /// [`SEGMENTED_MAX`] bytes, or empty until first used.
    buf: Box<[u8]>,
}

/// Reassembles segmented datagrams from parts keyed by peer `K` (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct Reassembler<K> {
    cfg: ReassemblyConfig,
    entries: Vec<Entry<K>>,
    /// The datagrams completed last (a ring of `2 × max_datagrams`): a late
    /// duplicate of one of their parts is a duplicate, not a new datagram that
    /// would hold a buffer until it times out.
    done: Vec<(K, u32)>,
    done_next: usize,
    next_seq: u64,
    stats: ReassemblyStats,
}

impl<K: Copy + Eq + Default> Reassembler<K> {
    /// An empty reassembler (no buffers yet: they are created as datagrams
    /// arrive, up to `cfg.max_datagrams`). Bounds of 0 are taken as 1.
    pub fn new(cfg: ReassemblyConfig) -> Self {
        let cfg = ReassemblyConfig {
            max_datagrams: cfg.max_datagrams.max(1),
            per_peer: cfg.per_peer.max(1),
            ..cfg
        };
        Reassembler {
            cfg,
            entries: Vec::new(),
            done: Vec::new(),
            done_next: 0,
            next_seq: 0,
            stats: ReassemblyStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Datagrams in progress.
    pub fn in_progress(&self) -> usize {
        self.entries.iter().filter(|e| e.live).count()
    }

    /// Bytes of reassembly buffers created so far (at most
    /// `max_datagrams × SEGMENTED_MAX`).
    pub fn buffer_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.buf.len()).sum()
    }

    /// Drop every datagram in progress for longer than the timeout at `now`.
    pub fn expire(&mut self, now: Instant) {
        for e in &mut self.entries {
            if e.live && now.saturating_duration_since(e.born) >= self.cfg.timeout {
                e.live = false;
                self.stats.expired += 1;
            }
        }
    }

    /// Take one part: `payload` as it arrived (part header first) from `peer`
    /// with immediate data `imm` (bit 31 set: the caller checked it is a part)
    /// and ECN codepoint `ecn`, read at `now`. Returns the datagram when this
    /// part completes it; a malformed or duplicate part is counted and dropped.
    pub fn accept(
        &mut self,
        now: Instant,
        peer: K,
        imm: u32,
        ecn: u8,
        payload: &[u8],
    ) -> Option<Reassembled<'_>> {
        self.expire(now);
        let Ok((h, data)) = PartHeader::decode(payload) else {
            self.stats.malformed += 1;
            return None;
        };
        let i = match self
            .entries
            .iter()
            .position(|e| e.live && e.peer == peer && e.id == h.id)
        {
            Some(i) => {
                let e = &self.entries[i];
                if e.count != h.count || e.imm != imm {
                    self.stats.malformed += 1;
                    return None;
                }
                if e.have & (1 << h.index) != 0 {
                    self.stats.duplicates += 1;
                    return None;
                }
                i
            }
            None if self.done.contains(&(peer, h.id)) => {
                self.stats.duplicates += 1;
                return None;
            }
            None => self.start(now, peer, h, imm),
        };
        if !place(&mut self.entries[i], h, data) {
            self.stats.malformed += 1;
            // A datagram with no part in it yet holds no buffer.
            let e = &mut self.entries[i];
            e.live &= e.got > 0;
            return None;
        }
        self.stats.parts += 1;
        let e = &mut self.entries[i];
        e.have |= 1 << h.index;
        e.got += 1;
        if ecn == 0b11 {
            e.ecn = ecn;
        }
        if e.got < e.count {
            return None;
        }
        e.live = false;
        self.stats.reassembled += 1;
        let key = (e.peer, e.id);
        if self.done.len() < 2 * self.cfg.max_datagrams {
            self.done.push(key);
        } else {
            self.done[self.done_next] = key;
        }
        self.done_next = (self.done_next + 1) % (2 * self.cfg.max_datagrams);
        let e = &self.entries[i];
        let len = (usize::from(e.count) - 1) * e.part_len + e.tail_len;
        Some(Reassembled {
            data: &e.buf[..len],
            imm: datagram_imm(e.imm),
            ecn: e.ecn,
        })
    }

    /// A fresh entry for `peer`'s datagram `h.id`, making room within the
    /// bounds by dropping the oldest incomplete datagram (the peer's own first).
    fn start(&mut self, now: Instant, peer: K, h: PartHeader, imm: u32) -> usize {
        let mine = self.entries.iter().filter(|e| e.live && e.peer == peer);
        if mine.count() >= self.cfg.per_peer {
            self.evict_oldest(|e| e.peer == peer);
        }
        let i = match self.entries.iter().position(|e| !e.live) {
            Some(i) => i,
            None if self.entries.len() < self.cfg.max_datagrams => {
                self.entries.push(Entry {
                    live: false,
                    peer: K::default(),
                    id: 0,
                    count: 0,
                    have: 0,
                    got: 0,
                    part_len: 0,
                    tail_len: 0,
                    imm: 0,
                    ecn: 0,
                    born: now,
                    seq: 0,
                    buf: Box::default(),
                });
                self.entries.len() - 1
            }
            None => self.evict_oldest(|_| true),
        };
        let e = &mut self.entries[i];
        if e.buf.is_empty() {
            e.buf = vec![0; SEGMENTED_MAX].into_boxed_slice();
        }
        *e = Entry {
            live: true,
            peer,
            id: h.id,
            count: h.count,
            have: 0,
            got: 0,
            part_len: 0,
            tail_len: 0,
            imm,
            ecn: 0,
            born: now,
            seq: self.next_seq,
            buf: std::mem::take(&mut e.buf),
        };
        self.next_seq += 1;
        i
    }

    /// Drop the oldest live entry that `which` selects; returns its index.
    fn evict_oldest(&mut self, which: impl Fn(&Entry<K>) -> bool) -> usize {
        let i = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.live && which(e))
            .min_by_key(|(_, e)| e.seq)
            .map(|(i, _)| i)
            .expect("called only when a selected entry is live");
        self.entries[i].live = false;
        self.stats.evicted += 1;
        i
    }
}

/// Copy part `h` (its datagram bytes `data`) into `e`'s buffer, if it agrees
/// with the parts already in: every part but the last the same size, the last
/// no larger, the whole within the buffer.
fn place<K>(e: &mut Entry<K>, h: PartHeader, data: &[u8]) -> bool {
    let cap = e.buf.len();
    let last = usize::from(h.count) - 1;
    let len = data.len();
    if usize::from(h.index) == last {
        let at = if e.part_len == 0 {
            // Park it at the end until a full part tells where it belongs.
            match cap.checked_sub(len) {
                Some(at) => at,
                None => return false,
            }
        } else if len <= e.part_len && last * e.part_len + len <= cap {
            last * e.part_len
        } else {
            return false;
        };
        e.buf[at..at + len].copy_from_slice(data);
        e.tail_len = len;
        return true;
    }
    if e.part_len == 0 {
        // The first full-size part fixes the part size; a parked last part
        // moves to its place.
        if last * len >= cap
            || (e.tail_len > 0 && (len < e.tail_len || last * len + e.tail_len > cap))
        {
            return false;
        }
        if e.tail_len > 0 {
            e.buf.copy_within(cap - e.tail_len..cap, last * len);
        }
        e.part_len = len;
    } else if len != e.part_len {
        return false;
    }
    let at = usize::from(h.index) * len;
    e.buf[at..at + len].copy_from_slice(data);
    true
}

#[cfg(test)]
mod tests {
    use super::super::segment::{part_imm, split, PART_HEADER_LEN};
    use super::*;
    use proptest::prelude::*;

    type Peer = u8;

    /// Every part of `datagram` (id `id`) as it goes on the wire.
    fn parts(id: u32, datagram: &[u8], mtu: usize) -> Vec<Vec<u8>> {
        split(id, datagram.len(), mtu)
            .map(|(h, r)| {
                let mut p = h.encode().to_vec();
                p.extend_from_slice(&datagram[r]);
                p
            })
            .collect()
    }

    fn imm() -> u32 {
        part_imm(Some(0x1_2345)).unwrap()
    }

    #[test]
    fn parts_in_any_order_make_the_datagram() {
        let t0 = Instant::now();
        let d: Vec<u8> = (0..2040u32).map(|i| (i * 7) as u8).collect();
        let mut r = Reassembler::<Peer>::new(ReassemblyConfig::default());
        let p = parts(9, &d, 1024);
        assert_eq!(r.accept(t0, 1, imm(), 0, &p[1]), None);
        assert_eq!(r.accept(t0, 1, imm(), 0, &p[1]), None, "duplicate");
        let got = r.accept(t0, 1, imm(), 3, &p[0]).expect("complete");
        assert_eq!((got.data, got.imm, got.ecn), (&d[..], Some(0x1_2345), 3));
        assert_eq!(r.accept(t0, 1, imm(), 0, &p[0]), None, "late duplicate");
        let s = r.stats();
        assert_eq!((s.parts, s.reassembled, s.duplicates), (2, 1, 2));
        assert_eq!(r.in_progress(), 0, "a late duplicate holds no buffer");
    }

    #[test]
    fn a_lost_part_drops_the_datagram_after_the_timeout() {
        let t0 = Instant::now();
        let cfg = ReassemblyConfig::default();
        let mut r = Reassembler::<Peer>::new(cfg);
        let p = parts(1, &[5; 1500], 1024);
        assert_eq!(r.accept(t0, 1, imm(), 0, &p[0]), None);
        r.expire(t0 + cfg.timeout / 2);
        assert_eq!(r.in_progress(), 1, "not yet");
        r.expire(t0 + cfg.timeout);
        assert_eq!((r.in_progress(), r.stats().expired), (0, 1));
        // The late part starts a datagram of its own, which never completes.
        assert_eq!(r.accept(t0 + cfg.timeout, 1, imm(), 0, &p[1]), None);
        assert_eq!(r.stats().reassembled, 0);
    }

    #[test]
    fn memory_is_bounded_per_peer_and_in_total() {
        let t0 = Instant::now();
        let cfg = ReassemblyConfig {
            max_datagrams: 4,
            per_peer: 2,
            ..ReassemblyConfig::default()
        };
        let mut r = Reassembler::<Peer>::new(cfg);
        // Peer 1 opens 10 datagrams and never finishes one: it keeps 2 buffers.
        for id in 0..10 {
            let p = parts(id, &[1; 1100], 1024);
            r.accept(t0, 1, imm(), 0, &p[0]);
        }
        assert_eq!((r.in_progress(), r.stats().evicted), (2, 8));
        for peer in 2..6 {
            r.accept(t0, peer, imm(), 0, &parts(0, &[1; 1100], 1024)[0]);
        }
        assert_eq!(r.in_progress(), 4);
        assert_eq!(r.buffer_bytes(), 4 * SEGMENTED_MAX);
        assert_eq!(r.stats().evicted, 8 + 2);
    }

    #[test]
    fn parts_that_disagree_are_malformed() {
        let t0 = Instant::now();
        let mut r = Reassembler::<Peer>::new(ReassemblyConfig::default());
        let d = [3u8; 2000];
        let p = parts(4, &d, 512); // 4 parts: 3 of 508, one of 476
        assert_eq!(p.len(), 4);
        r.accept(t0, 1, imm(), 0, &p[0]);
        // Another immediate value, another count, a short middle part.
        r.accept(t0, 1, imm() ^ 1, 0, &p[1]);
        let mut other_count = p[1].clone();
        other_count[3] = 0x14;
        r.accept(t0, 1, imm(), 0, &other_count);
        r.accept(t0, 1, imm(), 0, &p[1][..300]);
        r.accept(t0, 1, imm(), 0, &[0, 0, 4]);
        assert_eq!(r.stats().malformed, 4);
        r.accept(t0, 1, imm(), 0, &p[1]);
        r.accept(t0, 1, imm(), 0, &p[3]);
        let got = r.accept(t0, 1, imm(), 0, &p[2]).unwrap();
        assert_eq!(got.data, &d[..]);
    }

    #[test]
    fn a_last_part_first_waits_for_the_part_size() {
        let t0 = Instant::now();
        let mut r = Reassembler::<Peer>::new(ReassemblyConfig::default());
        // A sender at MTU 256: 8 parts of 252 and a last of 4.
        let d: Vec<u8> = (0..2020u32).map(|i| i as u8).collect();
        let mut p = parts(77, &d, 256);
        assert_eq!(p.len(), 9);
        p.reverse();
        let mut out = None;
        for part in &p {
            if let Some(got) = r.accept(t0, 2, imm(), 0, part) {
                out = Some(got.data.to_vec());
            }
        }
        assert_eq!(out.as_deref(), Some(&d[..]));
        // A last part larger than the others: refused when the size is known.
        let d = [9u8; 1500];
        let mut p = parts(78, &d, 1024);
        r.accept(t0, 2, imm(), 0, &p[0]);
        p[1].extend_from_slice(&[0; 600]);
        assert_eq!(r.accept(t0, 2, imm(), 0, &p[1]), None);
        assert_eq!(r.stats().malformed, 1);
    }

    /// How one part is delivered: dropped, once, or twice.
    fn fates() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![1 => Just(0u8), 8 => Just(1u8), 1 => Just(2u8)],
            64,
        )
    }

    proptest! {
        /// Any datagrams, split at any fabric MTU, parts delivered in any
        /// order with loss and duplication: every datagram all of whose
        /// parts arrived comes out exactly once and bit for bit; no other
        /// comes out; each one started and not finished is counted dropped
        /// once the timeout passes. Never panics.
        #[test]
        fn reassembles_exactly_or_drops_and_counts(
            mtu in prop::sample::select(vec![256usize, 512, 1024]),
            lens in prop::collection::vec(0usize..=2048, 1..12),
            seed in any::<u64>(),
            fates in fates(),
            order in prop::collection::vec(any::<u32>(), 256),
        ) {
            let t0 = Instant::now();
            let cfg = ReassemblyConfig::default();
            let mut r = Reassembler::<Peer>::new(cfg);
            // Datagrams larger than the MTU and at most what it offers.
            let dmtu = super::super::segment::datagram_mtu(mtu);
            let datagrams: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &l)| {
                    let len = mtu + 1 + l % (dmtu - mtu);
                    (0..len).map(|j| (seed as usize ^ (i * 131 + j * 7)) as u8).collect()
                })
                .collect();
            let mut wire = Vec::new();
            let mut complete = vec![true; datagrams.len()];
            let mut started = vec![false; datagrams.len()];
            let mut k = 0;
            for (i, d) in datagrams.iter().enumerate() {
                let peer = (i % 3) as Peer;
                for p in parts(i as u32, d, mtu) {
                    let fate = fates[k % fates.len()];
                    k += 1;
                    complete[i] &= fate > 0;
                    started[i] |= fate > 0;
                    for _ in 0..fate {
                        wire.push((peer, p.clone()));
                    }
                }
            }
            // Shuffle by the random keys.
            let mut keyed: Vec<_> = wire.into_iter().enumerate()
                .map(|(j, w)| (order[j % order.len()].wrapping_add(j as u32), w))
                .collect();
            keyed.sort_by_key(|(key, _)| *key);
            let mut out = vec![0usize; datagrams.len()];
            for (_, (peer, p)) in &keyed {
                if let Some(got) = r.accept(t0, *peer, imm(), 0, p) {
                    let i = datagrams.iter().position(|d| d[..] == *got.data);
                    prop_assert!(i.is_some(), "a datagram nobody sent came out");
                    out[i.unwrap()] += 1;
                }
            }
            for i in 0..datagrams.len() {
                prop_assert_eq!(out[i], usize::from(complete[i]), "datagram {}", i);
            }
            let incomplete = (0..datagrams.len()).filter(|&i| started[i] && !complete[i]).count();
            prop_assert_eq!(r.in_progress(), incomplete);
            r.expire(t0 + cfg.timeout);
            let s = r.stats();
            prop_assert_eq!(s.reassembled as usize, complete.iter().filter(|c| **c).count());
            prop_assert_eq!(s.expired as usize + s.evicted as usize, incomplete);
            prop_assert_eq!(s.malformed, 0);
            prop_assert_eq!(r.in_progress(), 0);
        }

        /// Arbitrary bytes as parts, from a few peers, with time moving:
        /// never a panic, memory within its bounds, and every part counted
        /// once (taken, malformed or duplicate).
        #[test]
        fn arbitrary_parts_never_panic(
            inputs in prop::collection::vec(
                (0u8..4, any::<u32>(), 0u8..4, prop::collection::vec(any::<u8>(), 0..80), 0u64..40),
                0..200,
            ),
        ) {
            let t0 = Instant::now();
            let cfg = ReassemblyConfig { max_datagrams: 8, per_peer: 3, ..ReassemblyConfig::default() };
            let mut r = Reassembler::<Peer>::new(cfg);
            let mut at = t0;
            for (peer, imm, ecn, mut bytes, dt) in inputs {
                // Small ids and counts so parts meet each other.
                if bytes.len() >= PART_HEADER_LEN {
                    bytes[0] = 0;
                    bytes[1] = 0;
                    bytes[2] &= 3;
                }
                at += Duration::from_millis(dt);
                let _ = r.accept(at, peer, imm & 3, ecn, &bytes);
                prop_assert!(r.in_progress() <= 8);
                prop_assert!(r.buffer_bytes() <= 8 * SEGMENTED_MAX);
            }
        }
    }
}
