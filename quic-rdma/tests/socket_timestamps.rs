//! Completion time stamps (docs/architecture.md §2, *Completion time
//! stamps*): off by default; on `sim` deterministic stamps on the fabric's
//! virtual clock, on `soft` host-monotonic stamps inside the exchange's
//! wall-clock window.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{Gid, StampClock, Timestamp, UdQueuePair, DEFAULT_QKEY};
use quic_rdma::socket::{SocketConfig, UdSocket};

/// Every send signaled, so each send's completion (and stamp) is its own.
fn cfg() -> SocketConfig {
    SocketConfig {
        signal_every: 1,
        ..SocketConfig::default()
    }
}

fn g6(n: u16) -> Gid {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into()
}

fn sim_pair(f: &SimFabric) -> (UdSocket<SimQp>, UdSocket<SimQp>) {
    let s = |n| UdSocket::new(f.create_qp(g6(n), SimQpOptions::default()).unwrap(), cfg()).unwrap();
    (s(1), s(2))
}

/// Receive everything waiting: (payload tag, stamp).
fn drain<Q: UdQueuePair>(s: &mut UdSocket<Q>) -> Vec<(u8, Option<Timestamp>)> {
    let mut v = Vec::new();
    s.recv(usize::MAX, |r| v.push((r.data[4], r.timestamp)));
    v
}

/// A short-header QUIC-looking datagram tagged `tag` at byte 4.
fn datagram(tag: u8) -> Vec<u8> {
    let mut d = vec![tag; 300];
    d[..4].copy_from_slice(&[0x40, 0x11, 0x22, 0x33]);
    d
}

#[test]
fn off_by_default_no_stamps() {
    let f = SimFabric::new(SimConfig::default());
    let (mut a, mut b) = sim_pair(&f);
    a.send(b.local_addr(), 0, &datagram(1), None).unwrap();
    a.reap_sends();
    assert_eq!(drain(&mut b), vec![(1, None)]);
    assert_eq!(a.last_send_timestamp(), None);
}

#[test]
fn sim_stamps_are_the_fabrics_virtual_time() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let faults = Faults {
        delay: ms(5),
        ..Faults::default()
    };
    let f = SimFabric::manual(
        SimConfig {
            faults,
            ..SimConfig::default()
        },
        t0,
    );
    let (mut a, mut b) = sim_pair(&f);
    assert_eq!(a.enable_timestamps().unwrap(), StampClock::SimFabric);
    assert_eq!(b.enable_timestamps().unwrap(), StampClock::SimFabric);
    let at = |t| {
        Some(Timestamp {
            at: t,
            clock: StampClock::SimFabric,
        })
    };

    // Sent at t0, delivered 5 ms later on the virtual clock.
    a.send(b.local_addr(), 0, &datagram(1), None).unwrap();
    a.reap_sends();
    assert_eq!(a.last_send_timestamp(), at(t0));
    assert_eq!(f.advance(t0 + ms(1)), Some(t0 + ms(5)));
    assert_eq!(drain(&mut b), vec![], "still on the wire");
    f.advance(t0 + ms(5));

    // A second datagram sent at 1 s arrives at 1.005 s; the receiver is
    // starved (does not poll) until 3 s: the stamps still say when each
    // arrived, not when it was polled.
    f.advance(t0 + ms(1000));
    a.send(b.local_addr(), 0, &datagram(2), None).unwrap();
    a.reap_sends();
    assert_eq!(a.last_send_timestamp(), at(t0 + ms(1000)));
    f.advance(t0 + ms(1005));
    f.advance(t0 + ms(3000));
    assert_eq!(
        drain(&mut b),
        vec![(1, at(t0 + ms(5))), (2, at(t0 + ms(1005)))]
    );
}

#[test]
fn soft_stamps_are_monotonic_within_the_exchange() {
    let open = |ip: [u8; 4]| {
        SoftPort::open(SoftConfig::new(std::net::Ipv4Addr::from(ip).into()).with_port(0)).unwrap()
    };
    let (pa, pb) = (open([127, 93, 0, 1]), open([127, 93, 0, 2]));
    pa.set_peer_port(pb.gid(), pb.local_addr().port());
    pb.set_peer_port(pa.gid(), pa.local_addr().port());
    let sock = |p: &SoftPort| -> UdSocket<SoftQp> {
        UdSocket::new(p.create_qp(DEFAULT_QKEY).unwrap(), cfg()).unwrap()
    };
    let (mut a, mut b) = (sock(&pa), sock(&pb));
    assert_eq!(a.enable_timestamps().unwrap(), StampClock::HostMonotonic);
    assert_eq!(b.enable_timestamps().unwrap(), StampClock::HostMonotonic);

    let before = Instant::now();
    let mut sent = Vec::new();
    let mut got = Vec::new();
    for tag in 1..=5u8 {
        a.send(b.local_addr(), 0, &datagram(tag), None).unwrap();
        a.reap_sends();
        sent.push(a.last_send_timestamp().expect("send stamped"));
        // Wait for it (a hang guard, not a timing check).
        let end = Instant::now() + Duration::from_secs(10);
        while got.len() < usize::from(tag) && Instant::now() < end {
            got.extend(drain(&mut b));
        }
    }
    let after = Instant::now();
    let tags: Vec<u8> = got.iter().map(|g| g.0).collect();
    assert_eq!(tags, vec![1, 2, 3, 4, 5], "every datagram arrived in order");
    let recvd: Vec<Timestamp> = got.iter().map(|g| g.1.expect("receive stamped")).collect();
    for (s, r) in sent.iter().zip(&recvd) {
        assert_eq!(
            (s.clock, r.clock),
            (StampClock::HostMonotonic, StampClock::HostMonotonic)
        );
        assert!(
            before <= s.at && s.at <= after,
            "send stamp outside the exchange"
        );
        assert!(
            before <= r.at && r.at <= after,
            "receive stamp outside the exchange"
        );
        assert!(s.at <= r.at, "received before it was sent: {s:?} {r:?}");
    }
    assert!(
        sent.windows(2).all(|w| w[0].at <= w[1].at),
        "send stamps go back"
    );
    assert!(
        recvd.windows(2).all(|w| w[0].at <= w[1].at),
        "receive stamps go back"
    );
}

/// Stamping is a property of the queue pair: it survives the error state
/// and the socket's recovery (Error → Reset → RTS), as a CQ's flags would.
#[test]
fn stamps_survive_qp_recovery() {
    let t0 = Instant::now();
    let f = SimFabric::manual(SimConfig::default(), t0);
    let (mut a, mut b) = sim_pair(&f);
    b.enable_timestamps().unwrap();
    a.send(b.local_addr(), 0, &datagram(1), None).unwrap();
    assert_eq!(drain(&mut b).len(), 1);
    b.queue_pair().handle().fail();
    a.send(b.local_addr(), 0, &datagram(2), None).unwrap();
    assert!(drain(&mut b).is_empty(), "dropped while failed");
    assert_eq!(b.stats().qp_recoveries, 1);
    let t1 = t0 + Duration::from_secs(2);
    f.advance(t1);
    a.send(b.local_addr(), 0, &datagram(3), None).unwrap();
    let got = drain(&mut b);
    assert_eq!(
        got,
        vec![(
            3,
            Some(Timestamp {
                at: t1,
                clock: StampClock::SimFabric
            })
        )]
    );
}
