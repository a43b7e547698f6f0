//! The peer table: UD addresses ↔ the `SocketAddr`s quinn and quinn-proto see,
//! shared by the engine and the quinn adapter.
//!
//! [`UdAddr::to_socket_addr`] keeps the QPN in `scope_id` and the Q_Key in
//! `flowinfo`, but quinn-proto's Retry tokens carry only IP and port and are
//! checked with `token_address != remote_address`, so with that mapping every
//! Retry token fails (INVALID_TOKEN). Both drivers therefore show quinn-proto a
//! synthetic address per peer — the GID with a port unique to the (GID, QPN,
//! Q_Key) triple, flowinfo and scope 0 — which survives the token's encoding,
//! is stable per peer (so a peer that moves is still a path change) and maps
//! back through this table. Lookups hash; nothing allocates once a peer is known.
//!
//! ## Who gets an entry, and who loses one
//! UD headers are not authenticated: anyone who can compute an ICRC can send
//! from any (GID, QPN). So the table has three tiers (docs/architecture.md,
//! "Peer table"; SECURITY.md):
//! - a packet from an unknown peer makes it **pending**: it gets an address so
//!   quinn-proto can look at the packet, in a small FIFO that evicts its oldest
//!   entry when full — a flood of spoofed sources churns only this tier;
//! - the peer becomes **unvalidated** when QUIC answers it with state — an
//!   Initial being answered, a stateless reset — but not for the stateless
//!   answers (Version Negotiation, Retry). This tier is smaller
//!   ([`PeerLimits::max_unvalidated`]), evicts its oldest entry when full and
//!   drops entries older than [`PeerLimits::unvalidated_expiry`]; what it may
//!   be sent is held to 3× what it sent, in bytes on the wire ([`amplification`](super::amplification),
//!   RFC 9000 §8.1) — quinn-proto's own limit overshoots by a datagram;
//! - the peer is **admitted** once its address is validated: it used a
//!   connection ID this endpoint chose and sent only to it (RFC 9000 §8.1), or
//!   the driver says so ([`PeerTable::confirm`]: a Retry token, a completed
//!   handshake), or quinn-proto sends it more than its own limit allows to an
//!   unvalidated address (it validated the path itself), or the application
//!   names the peer ([`PeerTable::admit`]);
//! - an admitted peer is evicted only when the table is full and it has been
//!   silent both ways for [`PeerLimits::evict_idle_after`]: longer than any
//!   idle timeout, so its connections are gone. A live connection's entry is
//!   never evicted; when no entry qualifies, the peer stays unvalidated
//!   (counted), and the existing connections carry on.
//! - a send to an address the table does not know is a counted drop, never an
//!   I/O error (quinn would take an error for a fatal one and kill the connection).

use std::collections::VecDeque;

// Keyed by addresses from the wire, on every packet: foldhash (randomly
// seeded per process) instead of SipHash; the maps are bounded besides.
use foldhash::HashMap;
use std::net::{SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use crate::fabric::UdAddr;

use super::amplification::{Budget, CidKey};
use super::cid::ROUTING_KEY_BITS;

/// Bounds of a peer table (both drivers take one in their configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLimits {
    /// Admitted peers (ones QUIC talks to) at most.
    pub max_peers: usize,
    /// Pending peers (seen, not yet answered) at most; the oldest is evicted first.
    pub max_pending: usize,
    /// Unvalidated peers (answered, address not yet validated) at most; the
    /// oldest is evicted first.
    pub max_unvalidated: usize,
    /// An unvalidated peer is dropped this long after it was first answered. A
    /// real client validates its address within a round trip of the server's
    /// first flight; a spoofed source never does.
    pub unvalidated_expiry: Duration,
    /// An admitted peer silent this long may be evicted when the table is full.
    /// Keep it above the transport's idle timeout: then only dead connections lose
    /// their entry.
    pub evict_idle_after: Duration,
}

impl PeerLimits {
    /// Ports are 16 bits: the three tiers share 65 535 of them.
    pub const MAX_TOTAL: usize = u16::MAX as usize;
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            max_peers: 16_384,
            max_pending: 4_096,
            max_unvalidated: 1_024,
            unvalidated_expiry: Duration::from_secs(2),
            // Twice quinn's default idle timeout (30 s), far above the fabric's.
            evict_idle_after: Duration::from_secs(60),
        }
    }
}

/// Counters and sizes of a peer table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStats {
    /// Admitted peers now.
    pub peers: u64,
    /// Pending peers now.
    pub pending: u64,
    /// Unvalidated peers now.
    pub unvalidated: u64,
    /// The bound on admitted peers.
    pub max_peers: u64,
    /// The bound on pending peers.
    pub max_pending: u64,
    /// The bound on unvalidated peers.
    pub max_unvalidated: u64,
    /// Peers admitted since the start.
    pub admitted: u64,
    /// Pending peers evicted to make room (a flood of new sources shows here).
    pub evicted_pending: u64,
    /// Unvalidated peers evicted to make room (a flood of spoofed Initials).
    pub evicted_unvalidated: u64,
    /// Unvalidated peers dropped after [`PeerLimits::unvalidated_expiry`].
    pub expired_unvalidated: u64,
    /// Datagrams to unvalidated peers dropped by the 3× limit (RFC 9000 §8.1).
    pub amplification_drops: u64,
    /// Admitted peers evicted after being silent for `evict_idle_after`.
    pub evicted_idle: u64,
    /// Admissions refused because every admitted peer was live (the peer
    /// stays unvalidated).
    pub refused_full: u64,
    /// Sends to an address the table does not know (packet dropped).
    pub unknown_destination: u64,
}

/// The names `qr serve` has always exported (`qr_peers_live`, ...).
impl crate::counters::Counters for PeerStats {
    fn visit(&self, f: &mut dyn FnMut(crate::counters::Metric)) {
        crate::visit_fields!(f, self, None;
            peers => live: Gauge, Count, "UD peers in the peer table";
            max_peers => live_limit: Gauge, Count, "Bound on UD peers in the peer table";
            pending: Gauge, Count, "UD peers not yet confirmed";
            max_pending => pending_limit: Gauge, Count, "Bound on unconfirmed UD peers";
            unvalidated: Gauge, Count, "UD peers whose address is not validated yet";
            max_unvalidated => unvalidated_limit: Gauge, Count, "Bound on UD peers whose address is not validated";
            admitted: Counter, Count, "UD peers admitted";
            evicted_pending: Counter, Count, "Unconfirmed peers evicted";
            evicted_unvalidated: Counter, Count, "Unvalidated peers evicted to make room";
            expired_unvalidated: Counter, Count, "Unvalidated peers dropped when their time ran out";
            amplification_drops: Counter, Count, "Datagrams to unvalidated peers dropped by the 3x amplification limit";
            evicted_idle: Counter, Count, "Idle peers evicted";
            refused_full: Counter, Count, "Peers refused by a full table";
            unknown_destination: Counter, Count, "Sends to an unknown peer dropped";
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum State {
    Pending(Budget),
    Unvalidated(Budget),
    Admitted { last: Instant },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    ud: UdAddr,
    state: State,
    /// When a packet from this peer was last read off the fabric (receives
    /// only, unlike `State::Admitted::last`): what liveness judges by.
    heard: Option<Instant>,
}

/// Bidirectional map of known peers (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct PeerTable {
    limits: PeerLimits,
    by_ud: HashMap<UdAddr, u16>,
    /// Entry of port `p` at index `p - 1`.
    by_port: Vec<Option<Entry>>,
    /// Freed ports, reused oldest first (the longest a stale address can linger
    /// in quinn-proto before it names another peer).
    free: VecDeque<u16>,
    /// Ports never used yet.
    fresh: std::ops::RangeInclusive<u16>,
    /// Pending peers, oldest first (entries since admitted or evicted are skipped).
    pending: VecDeque<(u16, UdAddr)>,
    /// Unvalidated peers and when they became so, oldest first (entries since
    /// admitted or evicted are skipped).
    unvalidated: VecDeque<(u16, UdAddr, Instant)>,
    /// Hashes the connection IDs sent to unvalidated peers.
    cid_key: CidKey,
    /// The largest datagram QUIC sends ([`Budget::validated_by_quic`]).
    mtu: usize,
    /// No admitted peer can be evicted before this (from the last full scan):
    /// spares a scan per refused admission while the table is full of live peers.
    no_eviction_before: Option<Instant>,
    stats: PeerStats,
    /// Peers the application named itself by their lossless address
    /// ([`UdAddr::to_socket_addr`]): they keep that address, so a client that
    /// connects to it sees replies from it. Only servers validate Retry tokens,
    /// and a server learns its peers from packets, i.e. by synthetic address.
    adopted: HashMap<SocketAddr, UdAddr>,
    /// An adopted peer's address, and when a packet from it was last read.
    adopted_by_ud: HashMap<UdAddr, (SocketAddr, Option<Instant>)>,
}

impl Default for PeerTable {
    fn default() -> Self {
        Self::new(PeerLimits::default(), 4096)
    }
}

/// What [`PeerTable::on_receive`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Source {
    /// The address quinn-proto sees.
    pub(crate) addr: SocketAddr,
    /// The peer is admitted (or adopted): further datagrams from it within the
    /// same batch need no accounting ([`LastSource`]).
    admitted: bool,
}

impl PeerTable {
    /// An empty table with `limits` (clamped so the tiers fit in 65 535 ports),
    /// for QUIC datagrams of at most `mtu` bytes.
    pub(crate) fn new(limits: PeerLimits, mtu: usize) -> Self {
        let max_pending = limits.max_pending.clamp(1, PeerLimits::MAX_TOTAL / 4);
        let max_unvalidated = limits.max_unvalidated.clamp(1, PeerLimits::MAX_TOTAL / 4);
        let max_peers = limits
            .max_peers
            .clamp(1, PeerLimits::MAX_TOTAL - max_pending - max_unvalidated);
        let limits = PeerLimits {
            max_peers,
            max_pending,
            max_unvalidated,
            ..limits
        };
        PeerTable {
            limits,
            by_ud: HashMap::default(),
            by_port: Vec::new(),
            free: VecDeque::new(),
            fresh: 1..=u16::MAX,
            pending: VecDeque::new(),
            unvalidated: VecDeque::new(),
            cid_key: CidKey::default(),
            mtu,
            no_eviction_before: None,
            stats: PeerStats {
                max_peers: max_peers as u64,
                max_pending: max_pending as u64,
                max_unvalidated: max_unvalidated as u64,
                ..PeerStats::default()
            },
            adopted: HashMap::default(),
            adopted_by_ud: HashMap::default(),
        }
    }

    /// Counters and sizes.
    pub(crate) fn stats(&self) -> PeerStats {
        self.stats
    }

    /// [`receive`](Self::receive)'s address only.
    #[cfg(test)]
    pub(crate) fn on_receive(&mut self, ud: UdAddr, datagram: &[u8], now: Instant) -> SocketAddr {
        self.receive(ud, datagram, now).addr
    }

    /// The address quinn-proto sees for `ud`, from which `datagram` just
    /// arrived: an unknown peer becomes pending; a pending or unvalidated one is
    /// charged for it, and admitted if it proves its address; an admitted one
    /// is marked active.
    pub(crate) fn receive(&mut self, ud: UdAddr, datagram: &[u8], now: Instant) -> Source {
        if let Some((a, heard)) = self.adopted_by_ud.get_mut(&ud) {
            *heard = Some(now);
            return Source {
                addr: *a,
                admitted: true,
            };
        }
        let port = match self.by_ud.get(&ud) {
            Some(&p) => p,
            None => self.add_pending(ud, now),
        };
        let idx = usize::from(port) - 1;
        let Some(e) = &mut self.by_port[idx] else {
            unreachable!("by_ud names live ports")
        };
        e.heard = Some(now);
        let proves = match &mut e.state {
            State::Admitted { last } => {
                *last = now;
                return Source {
                    addr: synthetic(ud, port),
                    admitted: true,
                };
            }
            State::Pending(b) | State::Unvalidated(b) => {
                b.heard(datagram);
                b.proves_address(datagram, &self.cid_key, ROUTING_KEY_BITS)
            }
        };
        let admitted = proves && self.promote(port, now);
        Source {
            addr: synthetic(ud, port),
            admitted,
        }
    }

    /// When a packet from the peer quinn-proto knows as `a` was last read off
    /// the fabric (`None`: unknown, or never heard from).
    #[cfg_attr(not(feature = "quinn"), allow(dead_code))]
    pub(crate) fn last_heard(&self, a: SocketAddr) -> Option<Instant> {
        if let Some(ud) = self.adopted.get(&a) {
            return self.adopted_by_ud.get(ud).and_then(|&(_, h)| h);
        }
        self.by_port[usize::from(self.port_of(a)?) - 1]?.heard
    }

    /// The address for a peer the application names (it wants to talk to it):
    /// admitted at once. When the table is full of live peers the lossless
    /// address is adopted instead (fine for clients, which never check Retry tokens).
    pub(crate) fn admit(&mut self, ud: UdAddr, now: Instant) -> SocketAddr {
        if let Some(&(a, _)) = self.adopted_by_ud.get(&ud) {
            return a;
        }
        let port = match self.by_ud.get(&ud) {
            Some(&p) => p,
            None => self.add_pending(ud, now),
        };
        if self.promote(port, now) {
            synthetic(ud, port)
        } else {
            self.remove(port);
            self.adopt(ud.to_socket_addr(), ud)
        }
    }

    /// The driver knows that the peer quinn-proto calls `a` has a validated
    /// address (RFC 9000 §8.1: a valid Retry or NEW_TOKEN token, a completed
    /// handshake): admit it. `false` if unknown or the table is full of live peers.
    #[cfg_attr(not(feature = "quinn"), allow(dead_code))]
    pub(crate) fn confirm(&mut self, a: SocketAddr, now: Instant) -> bool {
        if self.adopted.contains_key(&a) {
            return true;
        }
        match self.port_of(a) {
            Some(port) => self.promote(port, now),
            None => false,
        }
    }

    /// Where to send a transmit of `contents` (datagrams of `segment` bytes,
    /// the last maybe shorter) that quinn-proto addressed to `a`, and how many
    /// of its bytes may go (whole datagrams); `None` (counted) if the address
    /// is unknown or nothing may go. A pending peer becomes unvalidated unless
    /// the packet is a stateless answer; an unvalidated one is held to 3×
    /// ([`amplification`](super::amplification)).
    pub(crate) fn on_send(
        &mut self,
        a: SocketAddr,
        contents: &[u8],
        segment: Option<usize>,
        now: Instant,
    ) -> Option<(UdAddr, usize)> {
        let len = contents.len();
        if let Some(ud) = self.adopted.get(&a) {
            return Some((*ud, len));
        }
        let Some(port) = self.port_of(a) else {
            // The application may dial a peer by its lossless address.
            return match UdAddr::from_socket_addr(a) {
                Ok(ud) if !self.by_ud.contains_key(&ud) => Some((self.adopt_ud(a, ud), len)),
                _ => {
                    self.stats.unknown_destination += 1;
                    None
                }
            };
        };
        let idx = usize::from(port) - 1;
        let Entry { ud, state, .. } = self.by_port[idx].expect("port_of checked");
        if matches!(state, State::Pending(_)) && !is_stateless_answer(contents) {
            // Evicting the tier's oldest never evicts this entry: it is
            // not queued there yet.
            self.make_unvalidated(port, now);
        }
        let mtu = self.mtu;
        let Some(e) = &mut self.by_port[idx] else {
            unreachable!("port_of checked")
        };
        let (mut allowed, validated) = match &mut e.state {
            State::Admitted { last } => {
                *last = now;
                return Some((ud, len));
            }
            State::Pending(b) => {
                b.issue(contents, &self.cid_key);
                (b.allow(len, segment), false)
            }
            State::Unvalidated(b) => {
                b.issue(contents, &self.cid_key);
                let allowed = b.allow(len, segment);
                (allowed, allowed < len && b.validated_by_quic(mtu))
            }
        };
        if validated && self.promote(port, now) {
            allowed = len;
        }
        if allowed < len {
            let segment = segment.unwrap_or(len).max(1);
            self.stats.amplification_drops += (len - allowed).div_ceil(segment) as u64;
        }
        (allowed > 0).then_some((ud, allowed))
    }

    /// The UD address behind an address quinn-proto gave us (no side effects).
    pub(crate) fn ud_addr(&self, a: SocketAddr) -> Option<UdAddr> {
        if let Some(ud) = self.adopted.get(&a) {
            return Some(*ud);
        }
        let port = self.port_of(a)?;
        Some(self.by_port[usize::from(port) - 1]?.ud)
    }

    fn port_of(&self, a: SocketAddr) -> Option<u16> {
        let port = a.port();
        let e = (*self.by_port.get(usize::from(port).checked_sub(1)?)?)?;
        (a == synthetic(e.ud, port)).then_some(port)
    }

    fn add_pending(&mut self, ud: UdAddr, now: Instant) -> u16 {
        self.expire_unvalidated(now);
        // Compact the FIFO of entries admitted or evicted meanwhile.
        if self.pending.len() >= 2 * self.limits.max_pending {
            let by_port = &self.by_port;
            self.pending
                .retain(|&(p, u)| in_state(by_port, p, u, Tier::Pending));
        }
        while self.stats.pending as usize >= self.limits.max_pending {
            let (p, u) = self
                .pending
                .pop_front()
                .expect("pending entries are queued");
            if in_state(&self.by_port, p, u, Tier::Pending) {
                self.remove(p);
                self.stats.evicted_pending += 1;
            }
        }
        let port = match self.fresh.next() {
            Some(p) => p,
            None => self
                .free
                .pop_front()
                .expect("the tiers fit in 65 535 ports"),
        };
        let idx = usize::from(port) - 1;
        if self.by_port.len() <= idx {
            // Grown as ports are first used: a small deployment stays small.
            self.by_port.resize(idx + 1, None);
        }
        self.by_port[idx] = Some(Entry {
            ud,
            state: State::Pending(Budget::default()),
            heard: None,
        });
        self.by_ud.insert(ud, port);
        self.pending.push_back((port, ud));
        self.stats.pending += 1;
        port
    }

    /// Move pending `port` to the unvalidated tier, evicting that tier's oldest
    /// entry if it is full.
    fn make_unvalidated(&mut self, port: u16, now: Instant) {
        self.expire_unvalidated(now);
        if self.unvalidated.len() >= 2 * self.limits.max_unvalidated {
            let by_port = &self.by_port;
            self.unvalidated
                .retain(|&(p, u, _)| in_state(by_port, p, u, Tier::Unvalidated));
        }
        while self.stats.unvalidated as usize >= self.limits.max_unvalidated {
            let (p, u, _) = self
                .unvalidated
                .pop_front()
                .expect("unvalidated entries are queued");
            if in_state(&self.by_port, p, u, Tier::Unvalidated) {
                self.remove(p);
                self.stats.evicted_unvalidated += 1;
            }
        }
        let Some(e) = &mut self.by_port[usize::from(port) - 1] else {
            return;
        };
        if let State::Pending(b) = e.state {
            e.state = State::Unvalidated(b);
            self.unvalidated.push_back((port, e.ud, now));
            self.stats.pending -= 1;
            self.stats.unvalidated += 1;
        }
    }

    /// Drop the unvalidated peers answered `unvalidated_expiry` ago or earlier.
    fn expire_unvalidated(&mut self, now: Instant) {
        let expiry = self.limits.unvalidated_expiry;
        while let Some(&(p, u, since)) = self.unvalidated.front() {
            if now.saturating_duration_since(since) < expiry {
                break;
            }
            self.unvalidated.pop_front();
            if in_state(&self.by_port, p, u, Tier::Unvalidated) {
                self.remove(p);
                self.stats.expired_unvalidated += 1;
            }
        }
    }

    /// Admit `port` (validated, or named by the application); `false` (counted)
    /// if the table is full of live peers.
    fn promote(&mut self, port: u16, now: Instant) -> bool {
        let idx = usize::from(port) - 1;
        let Some(e) = &mut self.by_port[idx] else {
            return false;
        };
        let was = match e.state {
            State::Admitted { ref mut last } => {
                *last = now;
                return true;
            }
            State::Pending(_) => Tier::Pending,
            State::Unvalidated(_) => Tier::Unvalidated,
        };
        if self.stats.peers as usize >= self.limits.max_peers && !self.evict_idle(now) {
            self.stats.refused_full += 1;
            return false;
        }
        if let Some(e) = &mut self.by_port[idx] {
            e.state = State::Admitted { last: now };
        }
        match was {
            Tier::Pending => self.stats.pending -= 1,
            Tier::Unvalidated => self.stats.unvalidated -= 1,
        }
        self.stats.peers += 1;
        self.stats.admitted += 1;
        true
    }

    /// Evict the admitted peer silent longest, if silent for `evict_idle_after`.
    fn evict_idle(&mut self, now: Instant) -> bool {
        if self.no_eviction_before.is_some_and(|t| now < t) {
            return false;
        }
        let oldest = self
            .by_port
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Some(Entry {
                    state: State::Admitted { last },
                    ..
                }) => Some((i, *last)),
                _ => None,
            })
            .min_by_key(|&(_, last)| last);
        match oldest {
            Some((i, last))
                if now.saturating_duration_since(last) >= self.limits.evict_idle_after =>
            {
                self.remove(i as u16 + 1);
                self.stats.evicted_idle += 1;
                true
            }
            Some((_, last)) => {
                // Activity only moves `last` forward: nobody qualifies before then.
                self.no_eviction_before = Some(last + self.limits.evict_idle_after);
                false
            }
            None => false,
        }
    }

    fn remove(&mut self, port: u16) {
        if let Some(e) = self.by_port[usize::from(port) - 1].take() {
            self.by_ud.remove(&e.ud);
            match e.state {
                State::Pending(_) => self.stats.pending -= 1,
                State::Unvalidated(_) => self.stats.unvalidated -= 1,
                State::Admitted { .. } => self.stats.peers -= 1,
            }
            self.free.push_back(port);
        }
    }

    fn adopt_ud(&mut self, a: SocketAddr, ud: UdAddr) -> UdAddr {
        self.adopt(a, ud);
        ud
    }

    fn adopt(&mut self, a: SocketAddr, ud: UdAddr) -> SocketAddr {
        // Only the application adopts (it names peers by their lossless
        // address); packets never do, so this map is as large as the
        // application makes it.
        self.adopted.insert(a, ud);
        self.adopted_by_ud.insert(ud, (a, None));
        a
    }
}

/// The tiers whose entries sit in a FIFO.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tier {
    Pending,
    Unvalidated,
}

/// Whether `port` still holds `ud` in `tier` (FIFO entries go stale when the
/// peer moves on or is evicted, and the port may since name another peer).
fn in_state(by_port: &[Option<Entry>], port: u16, ud: UdAddr, tier: Tier) -> bool {
    match by_port[usize::from(port) - 1] {
        Some(Entry { ud: u, state, .. }) if u == ud => matches!(
            (state, tier),
            (State::Pending(_), Tier::Pending) | (State::Unvalidated(_), Tier::Unvalidated)
        ),
        _ => false,
    }
}

fn synthetic(ud: UdAddr, port: u16) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(ud.gid.to_ipv6(), port, 0, 0))
}

/// A Version Negotiation or Retry packet (RFC 9000 §17.2.1, §17.2.5): an
/// endpoint sends these without keeping state, so they admit nobody.
fn is_stateless_answer(packet: &[u8]) -> bool {
    // Version 0 is Version Negotiation; long-header type 3 is Retry in QUIC v1.
    matches!(
        crate::quic::cid::long_header(packet),
        Some((0, _)) | Some((1, 3))
    )
}

/// The source [`PeerTable::on_receive`] last found admitted, within one
/// receive batch (one `now`, no other use of the table in between): a run of
/// packets from one admitted peer — a bulk stream — asks the table (two SipHash
/// lookups) once. Peers not yet admitted are accounted per datagram.
#[derive(Debug, Default)]
pub(crate) struct LastSource(Option<(UdAddr, SocketAddr)>);

impl LastSource {
    /// `table.on_receive(ud, datagram, now)`, or its answer for the same
    /// admitted `ud` just before.
    pub(crate) fn on_receive(
        &mut self,
        table: &mut PeerTable,
        ud: UdAddr,
        datagram: &[u8],
        now: Instant,
    ) -> SocketAddr {
        match self.0 {
            Some((last, a)) if last == ud => a,
            _ => {
                let s = table.receive(ud, datagram, now);
                self.0 = s.admitted.then_some((ud, s.addr));
                s.addr
            }
        }
    }
}

#[cfg(test)]
mod tests;
