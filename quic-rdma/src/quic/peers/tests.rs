use std::net::Ipv6Addr;

use super::*;
use crate::fabric::Gid;

fn gid(last: u16) -> Gid {
    Gid::from(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last))
}

/// A long-header packet of `len` bytes: `first` byte, QUIC v1, the CIDs.
fn long(first: u8, dcid: &[u8], scid: &[u8], len: usize) -> Vec<u8> {
    let mut p = vec![first, 0, 0, 0, 1, dcid.len() as u8];
    p.extend_from_slice(dcid);
    p.push(scid.len() as u8);
    p.extend_from_slice(scid);
    p.resize(len.max(p.len()), 0);
    p
}

/// A client's first Initial (1 200 bytes, the least RFC 9000 §14.1 allows).
fn client_initial() -> Vec<u8> {
    long(0xC0, &[0xAA; 8], &[0xCC; 8], 1200)
}

/// The server's Initial in answer, naming `scid` as its connection ID.
fn server_initial(scid: &[u8], len: usize) -> Vec<u8> {
    long(0xC0, &[0xCC; 8], scid, len)
}

/// The client's second flight: a Handshake packet to the server's CID.
fn client_handshake(server_cid: &[u8]) -> Vec<u8> {
    long(0xE0, server_cid, &[0xCC; 8], 200)
}

const SERVER_CID: [u8; 12] = [0x5E; 12];

/// A short-header datagram (as a stateless reset or a 1-RTT packet looks).
const SHORT: [u8; 40] = [0x40; 40];

/// The handshake of a real client at `ud`: it sends an Initial, we answer,
/// it answers to our CID. Returns its address, now admitted.
fn handshake(t: &mut PeerTable, ud: UdAddr, now: Instant) -> SocketAddr {
    let a = t.on_receive(ud, &client_initial(), now);
    let reply = server_initial(&SERVER_CID, 1200);
    assert_eq!(t.on_send(a, &reply, None, now), Some((ud, 1200)));
    assert_eq!(t.on_receive(ud, &client_handshake(&SERVER_CID), now), a);
    a
}

#[test]
fn a_run_from_one_source_gets_the_tables_answer() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let (a, b) = (UdAddr::new(gid(7), 0x11, 5), UdAddr::new(gid(8), 0x11, 5));
    let mut last = LastSource::default();
    let got: Vec<SocketAddr> = [a, a, b, b, a]
        .into_iter()
        .map(|ud| last.on_receive(&mut t, ud, &SHORT, now))
        .collect();
    let (sa, sb) = (t.on_receive(a, &SHORT, now), t.on_receive(b, &SHORT, now));
    assert_eq!(got, [sa, sa, sb, sb, sa]);
    assert_ne!(sa, sb);
}

#[test]
fn a_run_from_a_peer_not_yet_admitted_is_charged_per_datagram() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let p = UdAddr::new(gid(7), 0x11, 5);
    let mut last = LastSource::default();
    let a = last.on_receive(&mut t, p, &client_initial(), now);
    for _ in 0..2 {
        assert_eq!(last.on_receive(&mut t, p, &client_initial(), now), a);
    }
    // Three Initials heard: 3 × 3 × 1 200 bytes may go back, each datagram
    // charged 4 bytes of immediate data: eight of 1 200 bytes.
    let big = server_initial(&SERVER_CID, 10_800);
    assert_eq!(t.on_send(a, &big, Some(1200), now), Some((p, 9600)));
    assert_eq!(
        t.on_send(a, &server_initial(&SERVER_CID, 1200), None, now),
        None
    );
}

#[test]
fn round_trips_and_is_stable() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let a = UdAddr::new(gid(7), 0x11, 5);
    let b = UdAddr::new(gid(7), 0x12, 5);
    let (sa, sb) = (t.on_receive(a, &SHORT, now), t.on_receive(b, &SHORT, now));
    assert_ne!(sa, sb, "same GID, different QPN: different addresses");
    assert_eq!(t.on_receive(a, &SHORT, now), sa);
    assert_eq!(t.ud_addr(sa), Some(a));
    assert_eq!(t.ud_addr(sb), Some(b));
    if let SocketAddr::V6(v6) = sa {
        assert_eq!((v6.flowinfo(), v6.scope_id()), (0, 0));
    }
    assert_eq!(t.ud_addr("[fd00::8]:1".parse().unwrap()), None);
}

#[test]
fn lossless_addresses_named_by_the_application_are_kept() {
    let mut t = PeerTable::default();
    let a = UdAddr::new(gid(9), 0x21, 5);
    let given = a.to_socket_addr();
    let initial = client_initial();
    assert_eq!(
        t.on_send(given, &initial, None, Instant::now()),
        Some((a, 1200))
    );
    assert_eq!(
        t.on_receive(a, &SHORT, Instant::now()),
        given,
        "replies come from the address dialled"
    );
    assert_eq!(
        t.on_send(
            "[fd00::9]:443".parse().unwrap(),
            &initial,
            None,
            Instant::now()
        ),
        None,
        "not the RoCEv2 port: not a UD address"
    );
    assert_eq!(t.stats().unknown_destination, 1);
}

/// A flood of spoofed sources churns only the pending tier: however many
/// distinct sources send (70 000 here, more than there are ports), an admitted
/// client keeps its entry and its address.
#[test]
fn a_flood_of_sources_never_evicts_an_admitted_peer() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let client = UdAddr::new(gid(1), 0x11, 5);
    let addr = handshake(&mut t, client, now);
    assert_eq!(t.stats().peers, 1, "validated: admitted");
    for qpn in 0..70_000u32 {
        t.on_receive(UdAddr::new(gid(2), 0x100 + qpn, 5), &client_initial(), now);
    }
    assert_eq!(
        t.ud_addr(addr),
        Some(client),
        "the live peer keeps its address"
    );
    assert_eq!(t.on_send(addr, &SHORT, None, now), Some((client, 40)));
    let s = t.stats();
    assert_eq!(s.peers, 1);
    assert_eq!(s.pending, s.max_pending);
    assert_eq!(s.evicted_pending, 70_000 - s.max_pending);
}

/// Answered spoofed Initials fill only the unvalidated tier: it stays within
/// its bound, evicting its oldest, and an admitted client is untouched.
#[test]
fn answered_floods_churn_only_the_unvalidated_tier() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let client = UdAddr::new(gid(1), 0x11, 5);
    let addr = handshake(&mut t, client, now);
    for qpn in 0..5_000u32 {
        let a = t.on_receive(UdAddr::new(gid(2), 0x100 + qpn, 5), &client_initial(), now);
        assert!(t
            .on_send(a, &server_initial(&SERVER_CID, 1200), None, now)
            .is_some());
    }
    let s = t.stats();
    assert_eq!((s.peers, s.admitted), (1, 1), "no spoofed source admitted");
    assert_eq!(s.unvalidated, s.max_unvalidated);
    assert_eq!(s.evicted_unvalidated, 5_000 - s.max_unvalidated);
    assert_eq!(t.ud_addr(addr), Some(client));
}

#[test]
fn unvalidated_peers_expire() {
    let limits = PeerLimits {
        unvalidated_expiry: Duration::from_secs(2),
        ..PeerLimits::default()
    };
    let mut t = PeerTable::new(limits, 4096);
    let t0 = Instant::now();
    for qpn in 0..10u32 {
        let a = t.on_receive(UdAddr::new(gid(2), qpn, 5), &client_initial(), t0);
        t.on_send(a, &server_initial(&SERVER_CID, 1200), None, t0);
    }
    assert_eq!(t.stats().unvalidated, 10);
    t.on_receive(
        UdAddr::new(gid(3), 1, 5),
        &SHORT,
        t0 + Duration::from_secs(1),
    );
    assert_eq!(t.stats().unvalidated, 10, "not yet");
    t.on_receive(
        UdAddr::new(gid(3), 2, 5),
        &SHORT,
        t0 + Duration::from_secs(2),
    );
    let s = t.stats();
    assert_eq!((s.unvalidated, s.expired_unvalidated), (0, 10));
}

/// RFC 9000 §8.1: at most three times the bytes received, and (so the RoCEv2
/// headers cannot multiply) at most three times the bytes on the wire.
#[test]
fn an_unvalidated_peer_gets_at_most_three_times_what_it_sent() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let p = UdAddr::new(gid(3), 0x31, 5);
    let a = t.on_receive(p, &client_initial(), now);
    // quinn-proto fills a datagram to the MTU while any budget is left.
    assert_eq!(
        t.on_send(a, &server_initial(&SERVER_CID, 4096), None, now),
        None
    );
    // A batch of 1 200-byte datagrams (each charged 1 204 with the immediate
    // data): two go, the rest are held back.
    let batch = server_initial(&SERVER_CID, 4800);
    assert_eq!(t.on_send(a, &batch, Some(1200), now), Some((p, 2400)));
    assert_eq!(
        t.on_send(a, &server_initial(&SERVER_CID, 1200), None, now),
        None
    );
    let s = t.stats();
    assert_eq!((s.unvalidated, s.peers), (1, 0));
    assert_eq!(s.amplification_drops, 1 + 2 + 1);
    // It sends more: more may go.
    t.on_receive(p, &client_initial(), now);
    assert_eq!(t.on_send(a, &SHORT, None, now), Some((p, 40)));
}

/// RFC 9000 §8.1: a peer that uses a connection ID we chose (and sent only
/// to its address) received our packet there; nothing else validates it.
#[test]
fn only_our_connection_id_validates_an_address() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let p = UdAddr::new(gid(3), 0x31, 5);
    let a = t.on_receive(p, &client_initial(), now);
    t.on_send(a, &server_initial(&SERVER_CID, 1200), None, now);
    t.on_receive(p, &client_handshake(&[0x77; 12]), now);
    t.on_receive(p, &SHORT, now);
    assert_eq!(
        t.stats().peers,
        0,
        "a guessed CID or a short header proves nothing"
    );
    t.on_receive(p, &client_handshake(&SERVER_CID), now);
    let s = t.stats();
    assert_eq!((s.peers, s.unvalidated), (1, 0));
    let big = vec![0x40; 65_000];
    assert_eq!(t.on_send(a, &big, Some(4096), now), Some((p, 65_000)));
}

/// A Retry holds no state but names a CID: the client's Initial that comes
/// back to it (with the token) validates the address straight from pending.
#[test]
fn the_initial_after_a_retry_validates_the_address() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let p = UdAddr::new(gid(3), 0x31, 5);
    let a = t.on_receive(p, &client_initial(), now);
    let retry = long(0xF0, &[0xCC; 8], &SERVER_CID, 100);
    assert_eq!(t.on_send(a, &retry, None, now), Some((p, 100)));
    assert_eq!((t.stats().pending, t.stats().unvalidated), (1, 0));
    t.on_receive(p, &long(0xC0, &SERVER_CID, &[0xCC; 8], 1200), now);
    assert_eq!((t.stats().pending, t.stats().peers), (0, 1));
}

#[test]
fn stateless_answers_leave_a_peer_pending() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let p = UdAddr::new(gid(3), 0x31, 5);
    let a = t.on_receive(p, &client_initial(), now);
    let version_negotiation = [0x80, 0, 0, 0, 0, 8];
    let retry = [0xF0, 0, 0, 0, 1, 8];
    assert_eq!(t.on_send(a, &version_negotiation, None, now), Some((p, 6)));
    assert_eq!(t.on_send(a, &retry, None, now), Some((p, 6)));
    assert_eq!((t.stats().unvalidated, t.stats().pending), (0, 1));
    assert!(t.on_send(a, &SHORT, None, now).is_some());
    assert_eq!((t.stats().unvalidated, t.stats().pending), (1, 0));
}

#[test]
fn the_driver_and_quic_itself_can_vouch_for_an_address() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let (p, q) = (UdAddr::new(gid(3), 0x31, 5), UdAddr::new(gid(3), 0x32, 5));
    let a = t.on_receive(p, &client_initial(), now);
    assert!(t.confirm(a, now), "a token or a completed handshake");
    assert_eq!(t.stats().peers, 1);
    assert!(!t.confirm("[fd00::3]:9".parse().unwrap(), now));
    // quinn-proto asking for far more than its limit allows to an unvalidated
    // address has validated the path itself (RFC 9000 §8.2).
    let b = t.on_receive(q, &client_initial(), now);
    assert_eq!(
        t.on_send(b, &server_initial(&SERVER_CID, 4096), None, now),
        None
    );
    let burst = vec![0x40; 4 * 4096];
    assert_eq!(t.on_send(b, &burst, Some(4096), now), Some((q, 4 * 4096)));
    assert_eq!(t.stats().peers, 2);
}

#[test]
fn a_full_table_keeps_new_peers_unvalidated_until_one_is_idle() {
    let limits = PeerLimits {
        max_peers: 4,
        max_pending: 4,
        evict_idle_after: Duration::from_secs(10),
        ..PeerLimits::default()
    };
    let mut t = PeerTable::new(limits, 4096);
    let t0 = Instant::now();
    let live: Vec<_> = (0..4)
        .map(|i| {
            let ud = UdAddr::new(gid(4), 0x40 + i, 5);
            (ud, handshake(&mut t, ud, t0))
        })
        .collect();
    let newcomer = UdAddr::new(gid(5), 0x50, 5);
    let t5 = t0 + Duration::from_secs(5);
    handshake(&mut t, newcomer, t5);
    let s = t.stats();
    assert_eq!((s.peers, s.unvalidated, s.refused_full), (4, 1, 1));
    // Three peers stay active; the first falls silent.
    let t1 = t0 + Duration::from_secs(11);
    for (ud, a) in &live[1..] {
        assert_eq!(t.on_send(*a, &SHORT, None, t1), Some((*ud, 40)));
    }
    let a = t.on_receive(newcomer, &client_handshake(&SERVER_CID), t1);
    let s = t.stats();
    assert_eq!((s.peers, s.evicted_idle, s.refused_full), (4, 1, 1));
    assert_eq!(
        t.on_send(a, &vec![0; 20_000], Some(4096), t1),
        Some((newcomer, 20_000))
    );
    assert_eq!(t.ud_addr(live[0].1), None, "the silent peer was evicted");
    for (ud, a) in &live[1..] {
        assert_eq!(t.ud_addr(*a), Some(*ud), "active peers kept");
    }
}

#[test]
fn freed_ports_are_reused_oldest_first() {
    let limits = PeerLimits {
        max_peers: 1,
        max_pending: 1,
        ..PeerLimits::default()
    };
    let mut t = PeerTable::new(limits, 4096);
    let now = Instant::now();
    let mut seen = std::collections::HashSet::new();
    for qpn in 0..1000 {
        let a = t.on_receive(UdAddr::new(gid(6), qpn, 5), &SHORT, now);
        assert!(seen.insert(a.port()), "port {} reused too soon", a.port());
    }
}

#[test]
fn limits_are_clamped_to_the_port_space() {
    let t = PeerTable::new(
        PeerLimits {
            max_peers: 1 << 20,
            max_pending: 1 << 20,
            max_unvalidated: 1 << 20,
            ..PeerLimits::default()
        },
        4096,
    );
    let s = t.stats();
    assert!(s.max_peers + s.max_pending + s.max_unvalidated <= PeerLimits::MAX_TOTAL as u64);
    assert!(s.max_peers >= 1 && s.max_pending >= 1 && s.max_unvalidated >= 1);
}

/// Liveness judges a peer by when its packets were *read*: sending to a peer
/// does not make it heard, and an adopted (lossless) address is tracked too.
#[test]
fn last_heard_counts_receives_only() {
    let mut t = PeerTable::default();
    let t0 = Instant::now();
    let a = UdAddr::new(gid(7), 0x11, 5);
    let named = t.admit(a, t0);
    assert_eq!(t.last_heard(named), None, "named, never heard");
    let later = t0 + Duration::from_millis(40);
    assert!(t.on_send(named, &SHORT, None, later).is_some());
    assert_eq!(t.last_heard(named), None, "sending is not hearing");
    assert_eq!(t.on_receive(a, &SHORT, later), named);
    assert_eq!(t.last_heard(named), Some(later));

    let b = UdAddr::new(gid(8), 0x11, 5);
    let lossless = b.to_socket_addr();
    assert!(t.on_send(lossless, &SHORT, None, t0).is_some());
    assert_eq!(t.last_heard(lossless), None);
    assert_eq!(t.on_receive(b, &SHORT, later), lossless);
    assert_eq!(t.last_heard(lossless), Some(later));
    assert_eq!(t.last_heard(SocketAddr::from(([127, 0, 0, 1], 9))), None);
}
