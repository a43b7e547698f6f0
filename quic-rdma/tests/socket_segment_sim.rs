//! Segmentation for small fabric MTUs over `sim` (docs/architecture.md §6,
//! "Segmented datagrams"): a datagram larger than the active MTU goes as
//! parts and comes out whole; a lost part loses the datagram, counted; time
//! is the caller's (a manual sim clock), so the reassembly timeout is
//! deterministic.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use quic_rdma::fabric::sim::{Faults, SimClock, SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::{Gid, Mtu, UdAddr};
use quic_rdma::socket::{ReassemblyConfig, SocketConfig, UdSocket};

fn g6(n: u16) -> Gid {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into()
}

fn pair_with(
    mtu: Mtu,
    faults: Faults,
    cfg: SocketConfig,
) -> (SimFabric, UdSocket<SimQp>, UdSocket<SimQp>, Instant) {
    let start = Instant::now();
    let f = SimFabric::new(SimConfig {
        mtu,
        faults,
        clock: SimClock::Manual { start },
        ..SimConfig::default()
    });
    let a = UdSocket::new(
        f.create_qp(g6(1), SimQpOptions::default()).unwrap(),
        cfg.clone(),
    )
    .unwrap();
    let b = UdSocket::new(f.create_qp(g6(2), SimQpOptions::default()).unwrap(), cfg).unwrap();
    (f, a, b, start)
}

fn pair(mtu: Mtu) -> (SimFabric, UdSocket<SimQp>, UdSocket<SimQp>, Instant) {
    pair_with(mtu, Faults::default(), SocketConfig::default())
}

/// A short-header QUIC-looking datagram of `len` bytes (routing key 0x11223),
/// the rest a pattern tagged `tag`.
fn datagram(len: usize, tag: u8) -> Vec<u8> {
    let mut d: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect();
    d[..4].copy_from_slice(&[0x40, 0x11, 0x22, 0x33]);
    d
}

fn drain_at(s: &mut UdSocket<SimQp>, now: Instant) -> Vec<(UdAddr, Option<u32>, Vec<u8>)> {
    let mut v = Vec::new();
    s.recv_at(now, usize::MAX, |r| v.push((r.src, r.imm, r.data.to_vec())));
    v
}

#[test]
fn a_1024_fabric_carries_2040_byte_datagrams_in_two_parts() {
    let (_f, mut a, mut b, t0) = pair(Mtu::M1024);
    assert_eq!((a.fabric_mtu(), a.mtu()), (1024, 2040));
    assert!(a.segments() && a.mtu() >= 1200, "RFC 9000 §14");
    let d = datagram(2040, 1);
    a.send_with_imm(b.local_addr(), 0b10, Some(0x11223), &d, None)
        .unwrap();
    // A datagram that fits goes whole, as without segmentation.
    a.send_with_imm(b.local_addr(), 0b10, Some(0x11223), &d[..1000], None)
        .unwrap();
    let got = drain_at(&mut b, t0);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], (a.local_addr(), Some(0x11223), d.clone()));
    assert_eq!(got[1].2, d[..1000]);
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.seg_datagrams_sent, sa.seg_parts_sent, sa.sent_wrs),
        (1, 2, 3)
    );
    assert_eq!(
        (sb.seg_parts_received, sb.seg_reassembled, sb.recv_packets),
        (2, 1, 2)
    );
    assert_eq!(sb.recv_bytes, 2040 + 1000);
}

#[test]
fn every_small_mtu_round_trips_a_gso_transmit() {
    for (mtu, parts) in [(Mtu::M256, 8), (Mtu::M512, 4), (Mtu::M1024, 2)] {
        let (_f, mut a, mut b, t0) = pair(mtu);
        let seg = a.mtu();
        // Five full datagrams and a short last one, as quinn hands a GSO batch.
        let mut batch = Vec::new();
        for k in 0..5 {
            batch.extend_from_slice(&datagram(seg, k));
        }
        batch.extend_from_slice(&datagram(700, 9));
        a.send_with_imm(b.local_addr(), 0, Some(0x11223), &batch, Some(seg))
            .unwrap();
        let got = drain_at(&mut b, t0);
        assert_eq!(got.len(), 6, "{mtu:?}");
        for (k, (_, _, data)) in got.iter().take(5).enumerate() {
            assert_eq!(*data, datagram(seg, k as u8), "{mtu:?} datagram {k}");
        }
        assert_eq!(got[5].2, datagram(700, 9));
        // The 700-byte one fits a 1024 MTU whole; at 512 and 256 it is cut.
        let last_parts = if 700 > mtu.bytes() {
            700usize.div_ceil(mtu.bytes() - 4)
        } else {
            0
        };
        let s = a.stats();
        assert_eq!(s.seg_parts_sent as usize, 5 * parts + last_parts, "{mtu:?}");
        assert_eq!(
            s.seg_datagrams_sent as usize,
            5 + usize::from(last_parts > 0)
        );
        assert_eq!(b.stats().seg_reassembled, s.seg_datagrams_sent);
    }
}

#[test]
fn the_zero_copy_transmit_path_is_segmented_by_copy() {
    let (_f, mut a, mut b, t0) = pair(Mtu::M1024);
    let d = datagram(1900, 4);
    let buf = a.take_tx_buf().expect("a transmit buffer");
    a.tx_vec(&buf).extend_from_slice(&d);
    a.tx_vec(&buf).extend_from_slice(&d);
    a.send_tx_buf(buf, b.local_addr(), 0, Some(0x11223), 3800, Some(1900))
        .unwrap();
    let got = drain_at(&mut b, t0);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|g| g.2 == d));
    assert_eq!(a.stats().seg_parts_sent, 4);
}

#[test]
fn a_lost_part_loses_the_datagram_and_is_counted_when_the_timeout_passes() {
    let (f, mut a, mut b, t0) = pair_with(Mtu::M1024, Faults::lossy(0.2), SocketConfig::default());
    let n = 400;
    let sent: Vec<Vec<u8>> = (0..n).map(|k| datagram(2040, k as u8)).collect();
    for d in &sent {
        a.send_with_imm(b.local_addr(), 0, Some(0x11223), d, None)
            .unwrap();
        a.reap_sends();
    }
    let got = drain_at(&mut b, t0);
    for (_, _, data) in &got {
        assert!(sent.contains(data), "only whole datagrams that were sent");
    }
    let timeout = ReassemblyConfig::default().timeout;
    f.advance(t0 + timeout);
    assert!(drain_at(&mut b, t0 + timeout).is_empty());
    let s = b.stats();
    // Each datagram came out whole, or is counted lost once a part of it
    // arrived; one whose two parts were both lost left no trace.
    assert_eq!(s.seg_reassembled as usize, got.len());
    assert!(s.seg_expired > 0 && got.len() < n, "20 % loss loses some");
    // Both parts of each datagram came, or one did and the datagram was
    // dropped: timed out, or evicted by a newer one beyond the 16 a peer
    // may have in progress (the oldest — a lost part's — goes first).
    assert_eq!(
        s.seg_parts_received,
        2 * s.seg_reassembled + s.seg_expired + s.seg_evicted,
        "every part accounted for"
    );
    assert_eq!(s.seg_malformed, 0);
}

#[test]
fn duplicated_and_reordered_parts_reassemble_once() {
    let faults = Faults {
        duplicate: 0.3,
        reorder: 0.3,
        reorder_delay: Duration::from_millis(1),
        ..Faults::default()
    };
    let (f, mut a, mut b, t0) = pair_with(Mtu::M512, faults, SocketConfig::default());
    let sent: Vec<Vec<u8>> = (0..200).map(|k| datagram(1000 + k * 5, k as u8)).collect();
    let mut got = Vec::new();
    // One datagram every 20 µs of virtual time, the receiver keeping up: a
    // held-back part is overtaken by 50 datagrams' worth of others.
    let mut now = t0;
    for d in &sent {
        a.send_with_imm(b.local_addr(), 0, Some(0x11223), d, None)
            .unwrap();
        a.reap_sends();
        now += Duration::from_micros(20);
        f.advance(now);
        got.extend(drain_at(&mut b, now));
    }
    now += Duration::from_millis(2);
    f.advance(now);
    got.extend(drain_at(&mut b, now));
    let count = |d: &Vec<u8>| got.iter().filter(|g| g.2 == *d).count();
    let counts: Vec<usize> = sent.iter().map(count).collect();
    assert!(
        counts.iter().all(|&c| c == 1),
        "each datagram exactly once: {counts:?} {:?}",
        b.stats()
    );
    let s = b.stats();
    assert!(s.seg_duplicates > 0);
    assert_eq!((s.seg_malformed, s.seg_expired, s.seg_evicted), (0, 0, 0));
}
