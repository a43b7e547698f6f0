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
//! from any (GID, QPN). So the table is two-tier (docs/architecture.md, "Peer
//! table"; SECURITY.md):
//! - a packet from an unknown peer makes it **pending**: it gets an address so
//!   quinn-proto can look at the packet, in a small FIFO that evicts its oldest
//!   entry when full — a flood of spoofed sources churns only this tier;
//! - the peer is **admitted** when QUIC sends to it — it has a connection, or
//!   an Initial is being answered — except for the stateless answers (Version
//!   Negotiation, Retry), which hold no state and admit nobody;
//! - an admitted peer is evicted only when the table is full and it has been
//!   silent both ways for [`PeerLimits::evict_idle_after`]: longer than any
//!   idle timeout, so its connections are gone. A live connection's entry is
//!   never evicted; when no entry qualifies, the new admission is refused and
//!   its packet dropped (counted), and the existing connections carry on.
//! - a send to an address the table does not know is a counted drop, never an
//!   I/O error (quinn would take an error for a fatal one and kill the connection).

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use crate::fabric::UdAddr;

/// Bounds of a peer table (both drivers take one in their configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLimits {
    /// Admitted peers (ones QUIC talks to) at most.
    pub max_peers: usize,
    /// Pending peers (seen, not yet answered) at most; the oldest is evicted first.
    pub max_pending: usize,
    /// An admitted peer silent this long may be evicted when the table is full.
    /// Keep it above the transport's idle timeout: then only dead connections lose
    /// their entry.
    pub evict_idle_after: Duration,
}

impl PeerLimits {
    /// Ports are 16 bits: admitted and pending peers share 65 535 of them.
    pub const MAX_TOTAL: usize = u16::MAX as usize;
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            max_peers: 16_384,
            max_pending: 4_096,
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
    /// The bound on admitted peers.
    pub max_peers: u64,
    /// The bound on pending peers.
    pub max_pending: u64,
    /// Peers admitted since the start.
    pub admitted: u64,
    /// Pending peers evicted to make room (a flood of new sources shows here).
    pub evicted_pending: u64,
    /// Admitted peers evicted after being silent for `evict_idle_after`.
    pub evicted_idle: u64,
    /// Admissions refused because every admitted peer was live (packet dropped).
    pub refused_full: u64,
    /// Sends to an address the table does not know (packet dropped).
    pub unknown_destination: u64,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Pending,
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
        Self::new(PeerLimits::default())
    }
}

impl PeerTable {
    /// An empty table with `limits` (clamped so both tiers fit in 65 535 ports).
    pub(crate) fn new(limits: PeerLimits) -> Self {
        let max_pending = limits.max_pending.clamp(1, PeerLimits::MAX_TOTAL / 2);
        let max_peers = limits
            .max_peers
            .clamp(1, PeerLimits::MAX_TOTAL - max_pending);
        let limits = PeerLimits {
            max_peers,
            max_pending,
            ..limits
        };
        PeerTable {
            limits,
            by_ud: HashMap::new(),
            by_port: Vec::new(),
            free: VecDeque::new(),
            fresh: 1..=u16::MAX,
            pending: VecDeque::new(),
            no_eviction_before: None,
            stats: PeerStats {
                max_peers: max_peers as u64,
                max_pending: max_pending as u64,
                ..PeerStats::default()
            },
            adopted: HashMap::new(),
            adopted_by_ud: HashMap::new(),
        }
    }

    /// Counters and sizes.
    pub(crate) fn stats(&self) -> PeerStats {
        self.stats
    }

    /// The address quinn-proto sees for `ud`, a packet from which just arrived:
    /// an unknown peer becomes pending; an admitted one is marked active.
    pub(crate) fn on_receive(&mut self, ud: UdAddr, now: Instant) -> SocketAddr {
        if let Some((a, heard)) = self.adopted_by_ud.get_mut(&ud) {
            *heard = Some(now);
            return *a;
        }
        let port = match self.by_ud.get(&ud) {
            Some(&p) => {
                self.touch(p, now);
                p
            }
            None => self.add_pending(ud),
        };
        if let Some(e) = &mut self.by_port[usize::from(port) - 1] {
            e.heard = Some(now);
        }
        synthetic(ud, port)
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
            None => self.add_pending(ud),
        };
        if self.promote(port, now) {
            synthetic(ud, port)
        } else {
            self.remove(port);
            self.adopt(ud.to_socket_addr(), ud)
        }
    }

    /// The UD peer to send `packet` (the first datagram of a transmit) to, or
    /// `None` (counted) if the address is unknown or the table has no room to
    /// admit it. Admits a pending peer unless the packet is a stateless answer.
    pub(crate) fn on_send(&mut self, a: SocketAddr, packet: &[u8], now: Instant) -> Option<UdAddr> {
        if let Some(ud) = self.adopted.get(&a) {
            return Some(*ud);
        }
        let Some(port) = self.port_of(a) else {
            // The application may dial a peer by its lossless address.
            return match UdAddr::from_socket_addr(a) {
                Ok(ud) if !self.by_ud.contains_key(&ud) => Some(self.adopt_ud(a, ud)),
                _ => {
                    self.stats.unknown_destination += 1;
                    None
                }
            };
        };
        let e = self.by_port[usize::from(port) - 1].expect("port_of checked");
        match e.state {
            State::Admitted { .. } => self.touch(port, now),
            State::Pending if is_stateless_answer(packet) => {}
            State::Pending => {
                if !self.promote(port, now) {
                    return None;
                }
            }
        }
        Some(e.ud)
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

    fn touch(&mut self, port: u16, now: Instant) {
        if let Some(Entry {
            state: State::Admitted { last },
            ..
        }) = &mut self.by_port[usize::from(port) - 1]
        {
            *last = now;
        }
    }

    fn add_pending(&mut self, ud: UdAddr) -> u16 {
        // Compact the FIFO of entries admitted or evicted meanwhile.
        if self.pending.len() >= 2 * self.limits.max_pending {
            let by_port = &self.by_port;
            self.pending.retain(|&(p, u)| is_pending(by_port, p, u));
        }
        while self.stats.pending as usize >= self.limits.max_pending {
            let (p, u) = self
                .pending
                .pop_front()
                .expect("pending entries are queued");
            if is_pending(&self.by_port, p, u) {
                self.remove(p);
                self.stats.evicted_pending += 1;
            }
        }
        let port = match self.fresh.next() {
            Some(p) => p,
            None => self
                .free
                .pop_front()
                .expect("pending + admitted < 65 535 ports"),
        };
        if self.by_port.is_empty() {
            self.by_port.resize(PeerLimits::MAX_TOTAL, None);
        }
        self.by_port[usize::from(port) - 1] = Some(Entry {
            ud,
            state: State::Pending,
            heard: None,
        });
        self.by_ud.insert(ud, port);
        self.pending.push_back((port, ud));
        self.stats.pending += 1;
        port
    }

    /// Make pending `port` admitted; `false` (counted) if the table is full of live peers.
    fn promote(&mut self, port: u16, now: Instant) -> bool {
        let idx = usize::from(port) - 1;
        if matches!(
            self.by_port[idx],
            Some(Entry {
                state: State::Admitted { .. },
                ..
            })
        ) {
            self.touch(port, now);
            return true;
        }
        if self.stats.peers as usize >= self.limits.max_peers && !self.evict_idle(now) {
            self.stats.refused_full += 1;
            return false;
        }
        if let Some(e) = &mut self.by_port[idx] {
            e.state = State::Admitted { last: now };
        }
        self.stats.pending -= 1;
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
                State::Pending => self.stats.pending -= 1,
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

fn is_pending(by_port: &[Option<Entry>], port: u16, ud: UdAddr) -> bool {
    matches!(
        by_port[usize::from(port) - 1],
        Some(Entry { ud: u, state: State::Pending, .. }) if u == ud
    )
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

/// The source [`PeerTable::on_receive`] answered last, within one receive batch
/// (one `now`, no other use of the table in between): a run of packets from
/// one peer — a bulk stream — asks the table (two SipHash lookups) once.
#[derive(Debug, Default)]
pub(crate) struct LastSource(Option<(UdAddr, SocketAddr)>);

impl LastSource {
    /// `table.on_receive(ud, now)`, or its answer for the same `ud` just before.
    pub(crate) fn on_receive(
        &mut self,
        table: &mut PeerTable,
        ud: UdAddr,
        now: Instant,
    ) -> SocketAddr {
        match self.0 {
            Some((last, a)) if last == ud => a,
            _ => {
                let a = table.on_receive(ud, now);
                self.0 = Some((ud, a));
                a
            }
        }
    }
}

#[cfg(test)]
mod tests;
