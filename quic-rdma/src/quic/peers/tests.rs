use std::net::Ipv6Addr;

use super::*;
use crate::fabric::Gid;

fn gid(last: u16) -> Gid {
    Gid::from(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last))
}

/// A QUIC v1 Initial's first bytes (long header, type 0): not a stateless answer.
const INITIAL: [u8; 6] = [0xC0, 0, 0, 0, 1, 8];

#[test]
fn a_run_from_one_source_gets_the_tables_answer() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let (a, b) = (UdAddr::new(gid(7), 0x11, 5), UdAddr::new(gid(8), 0x11, 5));
    let mut last = LastSource::default();
    let got: Vec<SocketAddr> = [a, a, b, b, a]
        .into_iter()
        .map(|ud| last.on_receive(&mut t, ud, now))
        .collect();
    let (sa, sb) = (t.on_receive(a, now), t.on_receive(b, now));
    assert_eq!(got, [sa, sa, sb, sb, sa]);
    assert_ne!(sa, sb);
}

#[test]
fn round_trips_and_is_stable() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let a = UdAddr::new(gid(7), 0x11, 5);
    let b = UdAddr::new(gid(7), 0x12, 5);
    let (sa, sb) = (t.on_receive(a, now), t.on_receive(b, now));
    assert_ne!(sa, sb, "same GID, different QPN: different addresses");
    assert_eq!(t.on_receive(a, now), sa);
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
    assert_eq!(t.on_send(given, &INITIAL, Instant::now()), Some(a));
    assert_eq!(
        t.on_receive(a, Instant::now()),
        given,
        "replies come from the address dialled"
    );
    assert_eq!(
        t.on_send("[fd00::9]:443".parse().unwrap(), &INITIAL, Instant::now()),
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
    let addr = t.on_receive(client, now);
    assert_eq!(
        t.on_send(addr, &INITIAL, now),
        Some(client),
        "answered: admitted"
    );
    for qpn in 0..70_000u32 {
        t.on_receive(UdAddr::new(gid(2), 0x100 + qpn, 5), now);
    }
    assert_eq!(
        t.ud_addr(addr),
        Some(client),
        "the live peer keeps its address"
    );
    assert_eq!(t.on_send(addr, &INITIAL, now), Some(client));
    let s = t.stats();
    assert_eq!(s.peers, 1);
    assert_eq!(s.pending, s.max_pending);
    assert_eq!(s.evicted_pending, 70_000 - s.max_pending);
}

#[test]
fn stateless_answers_admit_nobody() {
    let mut t = PeerTable::default();
    let now = Instant::now();
    let p = UdAddr::new(gid(3), 0x31, 5);
    let a = t.on_receive(p, now);
    let version_negotiation = [0x80, 0, 0, 0, 0, 8];
    let retry = [0xF0, 0, 0, 0, 1, 8];
    assert_eq!(t.on_send(a, &version_negotiation, now), Some(p));
    assert_eq!(t.on_send(a, &retry, now), Some(p));
    assert_eq!((t.stats().peers, t.stats().pending), (0, 1));
    assert_eq!(t.on_send(a, &INITIAL, now), Some(p));
    assert_eq!((t.stats().peers, t.stats().pending), (1, 0));
}

#[test]
fn a_full_table_refuses_new_peers_until_one_is_idle() {
    let limits = PeerLimits {
        max_peers: 4,
        max_pending: 4,
        evict_idle_after: Duration::from_secs(10),
    };
    let mut t = PeerTable::new(limits);
    let t0 = Instant::now();
    let live: Vec<_> = (0..4)
        .map(|i| {
            let ud = UdAddr::new(gid(4), 0x40 + i, 5);
            let a = t.on_receive(ud, t0);
            assert_eq!(t.on_send(a, &INITIAL, t0), Some(ud));
            (ud, a)
        })
        .collect();
    let newcomer = UdAddr::new(gid(5), 0x50, 5);
    let a = t.on_receive(newcomer, t0 + Duration::from_secs(5));
    assert_eq!(t.on_send(a, &INITIAL, t0 + Duration::from_secs(5)), None);
    assert_eq!(t.stats().refused_full, 1);
    // Three peers stay active; the first falls silent.
    let t1 = t0 + Duration::from_secs(11);
    for (ud, a) in &live[1..] {
        assert_eq!(t.on_send(*a, &INITIAL, t1), Some(*ud));
    }
    let a = t.on_receive(newcomer, t1);
    assert_eq!(t.on_send(a, &INITIAL, t1), Some(newcomer));
    let s = t.stats();
    assert_eq!((s.peers, s.evicted_idle, s.refused_full), (4, 1, 1));
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
    let mut t = PeerTable::new(limits);
    let now = Instant::now();
    let mut seen = std::collections::HashSet::new();
    for qpn in 0..1000 {
        let a = t.on_receive(UdAddr::new(gid(6), qpn, 5), now);
        assert!(seen.insert(a.port()), "port {} reused too soon", a.port());
    }
}

#[test]
fn limits_are_clamped_to_the_port_space() {
    let t = PeerTable::new(PeerLimits {
        max_peers: 1 << 20,
        max_pending: 1 << 20,
        ..PeerLimits::default()
    });
    let s = t.stats();
    assert!(s.max_peers + s.max_pending <= PeerLimits::MAX_TOTAL as u64);
    assert!(s.max_peers >= 1 && s.max_pending >= 1);
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
    assert!(t.on_send(named, &INITIAL, later).is_some());
    assert_eq!(t.last_heard(named), None, "sending is not hearing");
    assert_eq!(t.on_receive(a, later), named);
    assert_eq!(t.last_heard(named), Some(later));

    let b = UdAddr::new(gid(8), 0x11, 5);
    let lossless = b.to_socket_addr();
    assert_eq!(t.on_send(lossless, &INITIAL, t0), Some(b));
    assert_eq!(t.last_heard(lossless), None);
    assert_eq!(t.on_receive(b, later), lossless);
    assert_eq!(t.last_heard(lossless), Some(later));
    assert_eq!(t.last_heard(SocketAddr::from(([127, 0, 0, 1], 9))), None);
}
