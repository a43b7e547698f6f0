//! The UD socket over `sim`: the hardware semantics of docs/architecture.md §2 held one by one.

use std::net::{Ipv4Addr, Ipv6Addr};

use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::{
    AhAttr, Gid, Memory, Mtu, Region, SendFlags, SendWr, Sge, UdAddr, UdQueuePair,
};
use quic_rdma::socket::{SocketConfig, SocketError, UdSocket};

mod conformance;

/// How long the conformance checks wait for `sim`: nothing. With no delay
/// fault a send is delivered (or dropped) inside `post_send`, so whatever is
/// not there when it returns never comes.
const SYNCHRONOUS: std::time::Duration = std::time::Duration::ZERO;

fn g6(n: u16) -> Gid {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into()
}

fn sock(f: &SimFabric, gid: Gid, opts: SimQpOptions, cfg: SocketConfig) -> UdSocket<SimQp> {
    UdSocket::new(f.create_qp(gid, opts).unwrap(), cfg).unwrap()
}

fn pair(cfg: SimConfig) -> (SimFabric, UdSocket<SimQp>, UdSocket<SimQp>) {
    let f = SimFabric::new(cfg);
    let a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    (f, a, b)
}

/// Receive everything waiting: (src, ecn, payload) of each datagram.
fn drain(s: &mut UdSocket<SimQp>) -> Vec<(UdAddr, u8, Vec<u8>)> {
    let mut v = Vec::new();
    s.recv(usize::MAX, |r| v.push((r.src, r.ecn, r.data.to_vec())));
    v
}

/// A short-header QUIC-looking datagram of `len` bytes: DCID starting 11 22 33
/// (routing key 0x11223), then `tag`.
fn datagram(len: usize, tag: u8) -> Vec<u8> {
    let mut d = vec![tag; len];
    d[..4].copy_from_slice(&[0x40, 0x11, 0x22, 0x33]);
    d
}

#[test]
fn delivers_with_source_gid_qpn_and_ecn() {
    let (_f, mut a, mut b) = pair(SimConfig::default());
    a.send(b.local_addr(), 0b10, &datagram(1200, 7), None)
        .unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0,
        a.local_addr(),
        "source GID from the GRH, QPN from the completion"
    );
    assert_eq!(got[0].1, 0b10, "ECT(0) carried in the GRH traffic class");
    assert_eq!(got[0].2, datagram(1200, 7));
}

#[test]
fn ipv4_gids_use_the_ipv4_grh_layout() {
    let f = SimFabric::new(SimConfig::default());
    let ga: Gid = Ipv4Addr::new(10, 0, 0, 1).into();
    let gb: Gid = Ipv4Addr::new(10, 0, 0, 2).into();
    let mut a = sock(&f, ga, SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, gb, SimQpOptions::default(), SocketConfig::default());
    a.send(b.local_addr(), 0b01, &datagram(1500, 3), None)
        .unwrap();
    let got = drain(&mut b);
    assert_eq!(got[0].0.gid, ga);
    assert!(got[0].0.gid.is_ipv4());
    assert_eq!(got[0].1, 0b01);
    assert_eq!(b.stats().drop_bad_grh, 0);
}

#[test]
fn gso_batch_is_one_post_with_one_wr_per_segment() {
    let (_f, mut a, mut b) = pair(SimConfig::default());
    let mut buf = Vec::new();
    for i in 0..10u8 {
        buf.extend_from_slice(&datagram(4096, i));
    }
    buf.extend_from_slice(&datagram(100, 99)); // short last segment
    a.send(b.local_addr(), 0, &buf, Some(4096)).unwrap();
    let st = a.stats();
    assert_eq!(st.sent_wrs, 11);
    assert_eq!(st.send_posts, 1, "one doorbell for the whole batch");
    let got = drain(&mut b);
    assert_eq!(got.len(), 11);
    assert_eq!(got[10].2, datagram(100, 99));
    for (i, g) in got[..10].iter().enumerate() {
        assert_eq!(g.2, datagram(4096, i as u8));
    }
}

#[test]
fn small_packets_go_inline_and_large_do_not() {
    let (_f, mut a, mut b) = pair(SimConfig::default());
    assert_eq!(
        a.inline_max(),
        64,
        "min(threshold 64, granted max_inline 188)"
    );
    a.send(b.local_addr(), 0, &datagram(40, 1), None).unwrap();
    a.send(b.local_addr(), 0, &datagram(64, 2), None).unwrap();
    a.send(b.local_addr(), 0, &datagram(65, 3), None).unwrap();
    assert_eq!(a.stats().inline_sends, 2);
    let got = drain(&mut b);
    assert_eq!(
        got.iter().map(|g| g.2.len()).collect::<Vec<_>>(),
        [40, 64, 65]
    );
}

#[test]
fn inline_never_exceeds_the_granted_max_inline() {
    let f = SimFabric::new(SimConfig {
        max_inline: 32,
        ..SimConfig::default()
    });
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    assert_eq!(a.inline_max(), 32);
    a.send(b.local_addr(), 0, &datagram(40, 1), None).unwrap();
    assert_eq!(a.stats().inline_sends, 0);
    assert_eq!(drain(&mut b).len(), 1);
}

#[test]
fn oversized_send_is_refused_not_silently_dropped() {
    let (_f, mut a, mut b) = pair(SimConfig::default());
    let err = a
        .send(b.local_addr(), 0, &datagram(4097, 1), None)
        .unwrap_err();
    assert!(
        matches!(
            err,
            SocketError::Oversize {
                len: 4097,
                mtu: 4096
            }
        ),
        "{err}"
    );
    let err = a
        .send(b.local_addr(), 0, &datagram(8192, 1), Some(4097))
        .unwrap_err();
    assert!(matches!(err, SocketError::Oversize { .. }));
    assert_eq!(a.stats().mtu_refusals, 2);
    assert_eq!(a.stats().sent_wrs, 0);
    assert!(drain(&mut b).is_empty());
}

#[test]
fn the_fabric_itself_drops_oversize_silently_and_completes_success() {
    // What the socket protects against: hardware semantics at the provider level.
    let f = SimFabric::new(SimConfig::default());
    let mut qp = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let peer = f.create_qp(g6(2), SimQpOptions::default()).unwrap();
    let mut mem = Memory::new();
    let mut r = Region::new(8192);
    qp.register(&mut r).unwrap();
    let lkey = r.lkey().unwrap();
    let region = mem.push(r);
    let ah = qp.create_ah(&AhAttr::new(g6(2), 0)).unwrap();
    let wr = SendWr {
        wr_id: 9,
        sge: Sge {
            region,
            offset: 0,
            len: 5000,
            lkey,
        },
        ah,
        remote_qpn: peer.attr().qpn,
        remote_qkey: peer.attr().qkey,
        imm: None,
        flags: SendFlags {
            signaled: true,
            inline: false,
        },
    };
    qp.post_send(&mem, &[wr]).unwrap();
    let mut wc = [quic_rdma::fabric::Completion::send(0); 1];
    assert_eq!(qp.poll_send_cq(&mut wc), 1);
    assert_eq!(wc[0].status, quic_rdma::fabric::WcStatus::Success);
    assert_eq!(qp.drops().oversize_sent, 1);
    assert_eq!(f.stats().delivered, 0);
}

/// A `Vec`-backed region is sent from in place, up to what was written; once
/// its memory moves, or once it is deregistered, a WR into it fails with a
/// protection error (and the QP enters the error state), as on hardware.
#[test]
fn a_vec_region_sends_in_place_until_it_moves_or_is_deregistered() {
    let f = SimFabric::new(SimConfig::default());
    let mut qp = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let mut peer = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    let mut mem = Memory::new();
    let mut r = Region::new_vec(4 * 4096);
    qp.register(&mut r).unwrap();
    let lkey = r.lkey().unwrap();
    let region = mem.push(r);
    let data = datagram(3000, 0xAB);
    mem.region_mut(region)
        .unwrap()
        .vec_mut()
        .unwrap()
        .extend_from_slice(&data);
    let ah = qp.create_ah(&AhAttr::new(g6(2), 0)).unwrap();
    let wr = SendWr {
        wr_id: 1,
        sge: Sge {
            region,
            offset: 0,
            len: 3000,
            lkey,
        },
        ah,
        remote_qpn: peer.local_addr().qpn,
        remote_qkey: peer.local_addr().qkey,
        imm: None,
        flags: SendFlags {
            signaled: true,
            inline: false,
        },
    };
    let mut wc = [quic_rdma::fabric::Completion::send(0); 1];
    qp.post_send(&mem, &[wr]).unwrap();
    assert_eq!(qp.poll_send_cq(&mut wc), 1);
    assert_eq!(wc[0].status, quic_rdma::fabric::WcStatus::Success);
    assert_eq!(drain(&mut peer)[0].2, data);
    // Deregistered: the lkey resolves nowhere.
    let mut gone = Region::new_vec(4096);
    qp.register(&mut gone).unwrap();
    let gone_lkey = gone.lkey().unwrap();
    qp.deregister(&mut gone).unwrap();
    assert_eq!(gone.lkey(), None);
    assert!(qp.deregister(&mut gone).is_err(), "not registered any more");
    gone.set_lkey(Some(gone_lkey));
    gone.vec_mut().unwrap().extend_from_slice(&data);
    let gone = mem.push(gone);
    let stale = SendWr {
        wr_id: 2,
        sge: Sge {
            region: gone,
            lkey: gone_lkey,
            ..wr.sge
        },
        ..wr
    };
    qp.post_send(&mem, &[stale]).unwrap();
    assert_eq!(qp.poll_send_cq(&mut wc), 1);
    assert_eq!(wc[0].status, quic_rdma::fabric::WcStatus::LocProtErr);
    qp.recover().unwrap();
    // Moved (the lent Vec reallocated): its registered memory is gone.
    mem.region_mut(region)
        .unwrap()
        .vec_mut()
        .unwrap()
        .reserve(8 * 4096);
    assert!(!mem.region(region).unwrap().intact());
    qp.post_send(&mem, &[SendWr { wr_id: 3, ..wr }]).unwrap();
    assert_eq!(qp.poll_send_cq(&mut wc), 1);
    assert_eq!(wc[0].status, quic_rdma::fabric::WcStatus::LocProtErr);
    assert!(drain(&mut peer).is_empty(), "nothing sent from either");
}

#[test]
fn mtu_1024_without_segmentation_gives_the_clear_jumbo_frames_error() {
    let f = SimFabric::new(SimConfig {
        mtu: Mtu::M1024,
        ..SimConfig::default()
    });
    let qp = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let cfg = SocketConfig {
        segmentation: false,
        ..SocketConfig::default()
    };
    let err = UdSocket::new(qp, cfg).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SocketError::MtuTooSmall { active: 1024 }));
    assert!(msg.contains("1200") && msg.contains("jumbo"), "{msg}");
}

#[test]
fn privileged_qkey_is_refused_with_the_fix() {
    let f = SimFabric::new(SimConfig::default());
    let err = f
        .create_qp(
            g6(1),
            SimQpOptions {
                qkey: 0x8000_0000,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("below 0x80000000"), "{err}");
}

#[test]
fn wrong_qkey_wrong_pkey_and_unknown_qpn_are_dropped_and_counted() {
    let f = SimFabric::new(SimConfig::default());
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    let to_b = b.local_addr();
    a.send(
        UdAddr {
            qkey: to_b.qkey ^ 1,
            ..to_b
        },
        0,
        &datagram(100, 1),
        None,
    )
    .unwrap();
    a.send(
        UdAddr {
            qpn: 0xAB_CDEF,
            ..to_b
        },
        0,
        &datagram(100, 2),
        None,
    )
    .unwrap();
    let mut other_partition = sock(
        &f,
        g6(3),
        SimQpOptions {
            pkey: 0x8001,
            ..Default::default()
        },
        SocketConfig::default(),
    );
    other_partition
        .send(to_b, 0, &datagram(100, 3), None)
        .unwrap();
    // And one good packet, which must be the only one delivered.
    a.send(to_b, 0, &datagram(100, 4), None).unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].2, datagram(100, 4));
    let d = b.stats().provider;
    assert_eq!((d.bad_qkey, d.bad_pkey, d.unknown_qpn), (1, 1, 1), "{d:?}");
}

/// The socket knows nothing of QUIC: immediate data, present or not, matching
/// a CID or not, is handed up as it came (the drivers check it: `routing`).
#[test]
fn immediate_data_is_handed_up_as_it_came() {
    let f = SimFabric::new(SimConfig::default());
    let mut raw = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    let mut mem = Memory::new();
    let mut r = Region::new(4096);
    raw.register(&mut r).unwrap();
    let lkey = r.lkey().unwrap();
    let d = datagram(200, 0xAB); // DCID 11 22 33 .. -> routing key 0x11223
    r.slice_mut(0, 200).unwrap().copy_from_slice(&d);
    let region = mem.push(r);
    let ah = raw.create_ah(&AhAttr::new(g6(2), 0)).unwrap();
    let mk = |imm, wr_id| SendWr {
        wr_id,
        sge: Sge {
            region,
            offset: 0,
            len: 200,
            lkey,
        },
        ah,
        remote_qpn: b.local_addr().qpn,
        remote_qkey: b.local_addr().qkey,
        imm,
        flags: SendFlags {
            signaled: true,
            inline: false,
        },
    };
    raw.post_send(
        &mem,
        &[mk(Some(0x12345), 1), mk(None, 2), mk(Some(0x11223), 3)],
    )
    .unwrap();
    let mut imms = Vec::new();
    b.recv(usize::MAX, |r| imms.push(r.imm));
    assert_eq!(imms, [Some(0x12345), None, Some(0x11223)]);
}

#[test]
fn no_posted_receive_drops_and_counts() {
    let f = SimFabric::new(SimConfig::default());
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let small = SocketConfig {
        recv_depth: 8,
        ..SocketConfig::default()
    };
    let mut b = sock(&f, g6(2), SimQpOptions::default(), small);
    for i in 0..20u8 {
        a.send(b.local_addr(), 0, &datagram(1200, i), None).unwrap();
    }
    assert_eq!(drain(&mut b).len(), 8);
    assert_eq!(b.stats().provider.no_recv_posted, 12);
    // Reposted: traffic flows again.
    a.send(b.local_addr(), 0, &datagram(1200, 1), None).unwrap();
    assert_eq!(drain(&mut b).len(), 1);
}

#[test]
fn selective_signaling_retires_earlier_sends() {
    let (_f, mut a, b) = pair(SimConfig::default());
    for i in 0..100u8 {
        a.send(b.local_addr(), 0, &datagram(2000, i), None).unwrap();
    }
    a.reap_sends();
    let st = a.stats();
    assert_eq!(st.signaled_sends, 100 / 16);
    assert_eq!(st.send_completions, 100 / 16);
    // Only the sends after the last signaled one are still held.
    assert_eq!(a.sends_in_flight(), 100 % 16);
}

#[test]
fn migrated_peer_gets_its_new_gids_ah_and_an_evicted_one_dies_after_its_sends() {
    let f = SimFabric::new(SimConfig::default());
    let cfg = SocketConfig {
        ah_capacity: 1,
        ..SocketConfig::default()
    };
    let mut a = sock(&f, g6(1), SimQpOptions::default(), cfg);
    let b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    let old = b.local_addr();
    // Three unsignaled sends reference the old AH.
    for i in 0..3u8 {
        a.send(old, 0, &datagram(2000, i), None).unwrap();
    }
    assert_eq!(a.sends_in_flight(), 3);
    // The peer moves to a new GID (same QPN, Q_Key): the new GID's AH is built,
    // and (capacity 1) the old one is evicted — but alive while its sends are.
    b.queue_pair().handle().set_gid(g6(9));
    let new = UdAddr { gid: g6(9), ..old };
    a.send(new, 0, &datagram(2000, 9), None).unwrap();
    let st = a.stats();
    assert_eq!((st.ah_created, st.ah_rebuilt, st.ah_destroyed), (2, 0, 0));
    assert_eq!(
        a.ah_counts(),
        (1, 1),
        "old AH retired but alive: 3 sends in flight"
    );
    // Keep sending until a signaled completion retires the old sends.
    for i in 0..20u8 {
        a.send(new, 0, &datagram(2000, i), None).unwrap();
    }
    a.reap_sends();
    let st = a.stats();
    assert_eq!(st.ah_destroyed, 1, "destroyed once its sends completed");
    assert_eq!(a.ah_counts(), (1, 0));
    assert_eq!(
        f.stats().ah_destroy_in_use,
        0,
        "never destroyed under an in-flight send"
    );
}

#[test]
fn our_own_gid_change_rebuilds_every_ah() {
    let f = SimFabric::new(SimConfig::default());
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    a.send(b.local_addr(), 0, &datagram(1200, 1), None).unwrap();
    a.queue_pair().handle().set_gid(g6(7));
    a.handle_events();
    assert_eq!(a.local_addr().gid, g6(7));
    assert_eq!(a.stats().gid_changes, 1);
    assert_eq!(a.stats().ah_rebuilt, 1);
    a.send(b.local_addr(), 0, &datagram(1200, 2), None).unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].0.gid, g6(7), "new source GID on the wire");
    assert_eq!(a.stats().ah_created, 2);
}

#[test]
fn scarce_slots_and_a_short_send_queue_never_deadlock() {
    let f = SimFabric::new(SimConfig {
        max_send_wr: 32,
        ..SimConfig::default()
    });
    let small = SocketConfig {
        send_slots: 8,
        ..Default::default()
    };
    let mut a = sock(&f, g6(1), SimQpOptions::default(), small);
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    // One at a time, and as GSO batches as large as the slot pool, back to back.
    for i in 0..64u8 {
        a.send(b.local_addr(), 0, &datagram(2000, i), None).unwrap();
    }
    assert_eq!(a.max_segments(), 8, "the slot pool bounds one send");
    for round in 0..3u8 {
        let mut batch = Vec::new();
        for i in 0..8u8 {
            batch.extend_from_slice(&datagram(2000, round * 8 + i));
        }
        a.send(b.local_addr(), 0, &batch, Some(2000)).unwrap();
    }
    assert_eq!(a.stats().would_block, 0);
    a.reap_sends();
    assert!(
        a.sends_in_flight() < 8,
        "signaled early when slots ran short"
    );
    // A send larger than the pool could never be posted whole: refused, nothing posted.
    let too_big = datagram(2000, 0).repeat(20);
    let before = a.stats().sent_wrs;
    assert!(matches!(
        a.send(b.local_addr(), 0, &too_big, Some(2000)),
        Err(SocketError::TooManySegments {
            segments: 20,
            max: 8
        })
    ));
    assert_eq!(a.stats().sent_wrs, before);
    let got = drain(&mut b);
    assert_eq!(got.len(), 88);
    assert_eq!(got[87].2, datagram(2000, 23));
}

#[test]
fn the_socket_recovers_a_failed_qp_with_its_qpn_and_every_buffer() {
    let f = SimFabric::new(SimConfig::default());
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    let window = b.recv_window() as u64;
    a.send(b.local_addr(), 0, &datagram(1200, 1), None).unwrap();
    assert_eq!(drain(&mut b).len(), 1);
    let qpn = b.local_addr().qpn;
    // Sends of b's not yet retired when it fails are lost with it.
    for i in 0..5 {
        b.send(a.local_addr(), 0, &datagram(1200, 10 + i), None)
            .unwrap();
    }
    b.queue_pair().handle().fail();
    // What arrives while b is failed is dropped.
    a.send(b.local_addr(), 0, &datagram(1200, 2), None).unwrap();
    assert!(drain(&mut b).is_empty());
    let st = b.stats();
    assert_eq!(st.qp_recoveries, 1, "{st:?}");
    assert_eq!(st.provider.no_recv_posted, 1, "{st:?}");
    assert_eq!(b.local_addr().qpn, qpn);
    assert_eq!(b.sends_in_flight(), 0, "unretired sends were taken back");
    assert_eq!(
        st.recv_wrs_posted,
        2 * window,
        "the receive window was posted anew: {st:?}"
    );
    // Working both ways again.
    a.send(b.local_addr(), 0, &datagram(1200, 3), None).unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].2, datagram(1200, 3));
    b.send(a.local_addr(), 0, &datagram(1200, 4), None).unwrap();
    let got = drain(&mut a);
    assert_eq!(got.last().map(|g| g.2.clone()), Some(datagram(1200, 4)));
    assert_eq!(b.stats().qp_recovery_failures, 0);
}

/// Two QPs on a fresh fabric, for the conformance suite.
fn sim_qps(_check: usize) -> Option<(SimQp, SimQp, SimFabric)> {
    let f = SimFabric::new(SimConfig::default());
    let a = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let b = f.create_qp(g6(2), SimQpOptions::default()).unwrap();
    Some((a, b, f))
}

conformance::suite!(sim_qps, SYNCHRONOUS);

/// Under the caller's clock a delayed packet travels until the caller moves
/// time past its due instant, and not a moment earlier; time never goes back.
#[test]
fn a_manual_clock_delivers_a_delayed_packet_when_time_reaches_it() {
    let start = std::time::Instant::now();
    let ms = std::time::Duration::from_millis(1);
    let cfg = SimConfig {
        faults: Faults {
            delay: ms,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let f = SimFabric::manual(cfg, start);
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, g6(2), SimQpOptions::default(), SocketConfig::default());
    a.send(b.local_addr(), 0, &datagram(1200, 1), None).unwrap();
    assert_eq!((f.in_flight(), f.next_due()), (1, Some(start + ms)));
    assert_eq!(f.advance(start + ms / 2), Some(start + ms));
    assert!(drain(&mut b).is_empty(), "not due yet");
    assert_eq!(f.advance(start + ms), None);
    let got = drain(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].2, datagram(1200, 1));
    assert_eq!(f.advance(start), None);
    assert_eq!(f.now(), start + ms, "time does not go back");
    let st = f.stats();
    assert_eq!((st.sent, st.delivered), (1, 1));
}

/// Send `n` datagrams from `a` to `b` back to back (b does not poll meanwhile).
fn burst(a: &mut UdSocket<SimQp>, b: &UdSocket<SimQp>, n: usize) {
    for i in 0..n {
        a.send(b.local_addr(), 0, &datagram(200, i as u8), None)
            .unwrap();
    }
}

#[test]
fn the_receive_window_starts_small_and_doubles_when_the_receiver_falls_behind() {
    let f = SimFabric::new(SimConfig::default());
    let cfg = SocketConfig {
        recv_depth: 64,
        recv_start: 16,
        // Every consumed receive is posted again at once, so each burst
        // finds the whole window posted.
        repost_batch: 1,
        ..SocketConfig::default()
    };
    let mut a = sock(&f, g6(1), SimQpOptions::default(), SocketConfig::default());
    let mut b = sock(&f, g6(2), SimQpOptions::default(), cfg.clone());
    assert_eq!(b.recv_window(), 16);
    // By default the whole depth is posted, whatever the depth (here 4096,
    // above the default depth).
    let all = SocketConfig::sized_for(16 << 20, 4096);
    let c = sock(&f, g6(3), SimQpOptions::default(), all);
    assert_eq!(c.config().recv_depth, 4096);
    assert_eq!((c.recv_window(), c.stats().recv_wrs_posted), (4096, 4096));
    assert_eq!(b.stats().recv_wrs_posted, 16, "only the window is posted");
    // A receiver that keeps up never grows it.
    for _ in 0..100 {
        burst(&mut a, &b, 1);
        assert_eq!(drain(&mut b).len(), 1);
    }
    assert_eq!((b.recv_window(), b.stats().recv_window_grows), (16, 0));
    // A burst past the window: what finds no receive is lost (UD), and the
    // poll that found the queue (nearly) empty doubles the window.
    burst(&mut a, &b, 20);
    assert_eq!(drain(&mut b).len(), 16);
    let st = b.stats();
    assert_eq!(st.provider.no_recv_posted, 4, "{st:?}");
    assert_eq!((b.recv_window(), st.recv_window_grows), (32, 1));
    // Now 20 fit, with more than a quarter left posted: no growth.
    burst(&mut a, &b, 20);
    assert_eq!(drain(&mut b).len(), 20);
    assert_eq!((b.recv_window(), b.stats().recv_window_grows), (32, 1));
    // It grows to recv_depth and no further.
    burst(&mut a, &b, 100);
    assert_eq!(drain(&mut b).len(), 32);
    assert_eq!(b.recv_window(), 64);
    burst(&mut a, &b, 100);
    assert_eq!(drain(&mut b).len(), 64);
    let st = b.stats();
    assert_eq!((b.recv_window(), st.recv_window_grows), (64, 2));
    assert_eq!(st.provider.no_recv_posted, 4 + 68 + 36, "{st:?}");
}
