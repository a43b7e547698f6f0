//! Engine groups over `sim` (docs/architecture.md §9): connections spread over
//! shards, each shard's packets land on its own QP, and a packet sent to the
//! wrong shard's QP is counted and dropped without an answer. Deterministic:
//! one thread, the harness's virtual clock.

mod engine_common;

use std::time::Instant;

use engine_common::{configs, gid, Sink, Source, MAX_ITERS};
use quic_rdma::engine::{AcceptPolicy, ConnHandle, EngineGroup, Event};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::quic;
use quic_rdma::socket::{SocketConfig, UdSocket};

const SERVER_KEYS: [u32; 2] = [0x5e001, 0x5e002];
const CLIENT_KEYS: [u32; 2] = [0xc1001, 0xc1002];

/// One connection: (client shard, client handle), (server shard, server handle).
type Placed = ((usize, ConnHandle), (usize, ConnHandle));

/// A client group and a server group of two shards each, on one fabric on
/// virtual time, all four engines polled by one loop.
struct Groups {
    fabric: SimFabric,
    client: EngineGroup<SimQp>,
    server: EngineGroup<SimQp>,
    now: Instant,
    /// Events of the last step: [client shard][event], [server shard][event].
    cev: [Vec<Event>; 2],
    sev: [Vec<Event>; 2],
}

impl Groups {
    fn new() -> Self {
        let fabric = SimFabric::manual(SimConfig::default(), Instant::now());
        let (ccfg, scfg) = configs(4096, AcceptPolicy::AcceptAll);
        // Each group's QPs share one port (GID), as one NIC's would.
        let qps = |g| {
            (0..2)
                .map(|_| fabric.create_qp(g, SimQpOptions::default()).unwrap())
                .collect::<Vec<_>>()
        };
        let server = EngineGroup::with_keys(qps(gid(1, false)), scfg, SERVER_KEYS.into()).unwrap();
        let client = EngineGroup::with_keys(qps(gid(2, false)), ccfg, CLIENT_KEYS.into()).unwrap();
        let now = fabric.now();
        Groups {
            fabric,
            client,
            server,
            now,
            cev: Default::default(),
            sev: Default::default(),
        }
    }

    /// Poll every shard once; in virtual time, a poll that moved nothing is
    /// followed by a jump to the next due instant (as `EnginePair::step`).
    fn step(&mut self) {
        if !self.poll_all() {
            let next = [
                self.fabric.next_due(),
                self.client.shard_mut(0).next_deadline(),
                self.client.shard_mut(1).next_deadline(),
                self.server.shard_mut(0).next_deadline(),
                self.server.shard_mut(1).next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min();
            if let Some(t) = next {
                self.now = self.now.max(t);
                self.poll_all();
            }
        }
    }

    fn poll_all(&mut self) -> bool {
        let before = self.fabric.stats();
        self.fabric.advance(self.now);
        let mut moved = false;
        for (e, ev) in self.client.shards_mut().iter_mut().zip(&mut self.cev) {
            ev.clear();
            e.poll(self.now, ev);
            moved |= !ev.is_empty();
        }
        for (e, ev) in self.server.shards_mut().iter_mut().zip(&mut self.sev) {
            ev.clear();
            e.poll(self.now, ev);
            moved |= !ev.is_empty();
        }
        self.fabric.advance(self.now);
        let after = self.fabric.stats();
        moved || (after.sent, after.delivered) != (before.sent, before.delivered)
    }

    /// Open connections 0 and 1 and handshake both: per connection, the
    /// (client shard, client handle) and (server shard, server handle).
    fn connect_two(&mut self) -> [Placed; 2] {
        let dir = self.server.addrs();
        let c: Vec<(usize, ConnHandle)> = (0..2)
            .map(|n| self.client.connect(self.now, n, &dir, "localhost").unwrap())
            .collect();
        let mut connected = [false; 2];
        let mut accepted: Vec<(usize, ConnHandle)> = Vec::new();
        for _ in 0..MAX_ITERS {
            self.step();
            for (i, &(shard, h)) in c.iter().enumerate() {
                connected[i] |= self.cev[shard].contains(&Event::Connected { conn: h });
            }
            for (shard, ev) in self.sev.iter().enumerate() {
                for e in ev {
                    if let Event::Connected { conn } = e {
                        accepted.push((shard, *conn));
                    }
                }
            }
            if connected == [true; 2] && accepted.len() == 2 {
                accepted.sort_by_key(|a| a.0);
                return [(c[0], accepted[0]), (c[1], accepted[1])];
            }
        }
        panic!("handshakes did not finish");
    }
}

/// Upload `len` bytes on each connection at once (client → server, one
/// stream each); every server shard answers with the sha256 it computed,
/// which must equal what its client sent.
fn transfer_both(g: &mut Groups, conns: &[Placed; 2], len: u64) {
    let mut src = Vec::new();
    let mut replies = Vec::new();
    for (i, &((cs, c), _)) in conns.iter().enumerate() {
        let e = g.client.shard_mut(cs);
        let stream = e.open_bi(c).unwrap();
        let mut s = Source::new(stream, len, 100 + i as u64);
        s.pump(e, c);
        src.push(s);
        replies.push(Sink::new(stream, true));
    }
    let mut sinks: [Option<Sink>; 2] = [None, None];
    let mut answered = [false; 2];
    for _ in 0..MAX_ITERS {
        g.step();
        for (i, &((cs, c), (ss, s))) in conns.iter().enumerate() {
            for ev in &g.sev[ss] {
                if let Event::StreamOpened { conn, stream } = *ev {
                    if conn == s {
                        sinks[i] = Some(Sink::new(stream, false));
                    }
                }
            }
            src[i].pump(g.client.shard_mut(cs), c);
            if let Some(k) = &mut sinks[i] {
                let e = g.server.shard_mut(ss);
                k.pump(e, s);
                if k.fin && !answered[i] {
                    let mut a = k.received.to_be_bytes().to_vec();
                    a.extend_from_slice(&k.digest());
                    assert_eq!(e.write(s, k.stream, &a).unwrap(), 40);
                    e.finish(s, k.stream).unwrap();
                    answered[i] = true;
                }
            }
            replies[i].pump(g.client.shard_mut(cs), c);
        }
        if replies.iter().all(|r| r.fin) {
            for (r, s) in replies.iter().zip(&src) {
                let got = r.data.as_ref().unwrap();
                assert_eq!(u64::from_be_bytes(got[..8].try_into().unwrap()), len);
                assert_eq!(&got[8..], &s.digest()[..], "sha256 end to end");
            }
            return;
        }
    }
    panic!("transfers did not finish");
}

#[test]
fn two_connections_land_on_two_shards_and_never_on_the_wrong_one() {
    let mut g = Groups::new();
    let conns = g.connect_two();
    // Connection n: client shard n → server shard n, one connection each.
    assert_eq!(conns[0].0 .0, 0);
    assert_eq!(conns[1].0 .0, 1);
    assert_eq!(conns[0].1 .0, 0, "connection 0 accepted by server shard 0");
    assert_eq!(conns[1].1 .0, 1, "connection 1 accepted by server shard 1");
    assert_eq!(g.server.connections_per_shard(), vec![1, 1]);
    assert_eq!(g.client.connections_per_shard(), vec![1, 1]);

    transfer_both(&mut g, &conns, 4 << 20);

    // Every packet each shard received carried its own key.
    for (grp, min_packets) in [(&g.client, 10), (&g.server, 1000)] {
        for i in 0..2 {
            let e = grp.shard(i);
            let got = e.socket_stats().recv_packets;
            assert!(got > min_packets, "shard {i} did the work: {got} packets");
            assert_eq!(e.routing_stats().wrong_shard, 0, "shard {i}");
            assert_eq!(e.routing_stats().imm_mismatch, 0, "shard {i}");
        }
        assert_eq!(grp.wrong_shard(), 0);
    }
}

/// A short-header QUIC datagram for a connection of the shard with `key`:
/// the DCID starts with the key (docs/architecture.md §3), the rest is noise
/// long enough that an endpoint not knowing the CID owes a stateless reset.
fn stray_datagram(key: u32) -> Vec<u8> {
    let mut d = vec![
        0x40,
        (key >> 12) as u8,
        (key >> 4) as u8,
        (key as u8) << 4 | 0x7,
    ];
    d.extend((0..120u8).map(|i| i.wrapping_mul(37)));
    d
}

#[test]
fn a_packet_on_the_wrong_shard_is_counted_and_dropped_unanswered() {
    let mut g = Groups::new();
    let conns = g.connect_two();
    let dir = g.server.addrs();
    // A sender that knows the convention (immediate = DCID key) but posts to
    // the wrong QPN: shard 0's key, shard 1's QP.
    let stray_qp = g
        .fabric
        .create_qp(gid(3, false), SimQpOptions::default())
        .unwrap();
    let mut stray = UdSocket::new(stray_qp, SocketConfig::default()).unwrap();
    let pkt = stray_datagram(SERVER_KEYS[0]);
    // What reaches the stray sender over a few steps: only an answer to it.
    let answers = |g: &mut Groups, stray: &mut UdSocket<SimQp>| {
        let mut got = 0;
        for _ in 0..8 {
            g.step();
            got += stray.recv(32, |_| {});
        }
        got
    };
    quic::send(&mut stray, dir[1], 0, &pkt, None).unwrap();
    assert_eq!(
        answers(&mut g, &mut stray),
        0,
        "dropped before quinn-proto: no stateless reset from the wrong shard"
    );
    assert_eq!(g.server.shard(1).routing_stats().wrong_shard, 1);
    assert_eq!(g.server.shard(0).routing_stats().wrong_shard, 0);
    // As a plain SEND (no immediate data) the DCID's key decides the same way.
    stray.send_with_imm(dir[1], 0, None, &pkt, None).unwrap();
    assert_eq!(answers(&mut g, &mut stray), 0);
    assert_eq!(g.server.shard(1).routing_stats().wrong_shard, 2);

    // Control: the shard owning the key has no connection with this CID
    // either, and it does answer (a stateless reset, RFC 9000 §10.3): the
    // check, not chance, kept shard 1 silent.
    quic::send(&mut stray, dir[0], 0, &pkt, None).unwrap();
    assert!(
        answers(&mut g, &mut stray) >= 1,
        "the owning shard answered the unknown CID"
    );
    assert_eq!(g.server.shard(0).routing_stats().wrong_shard, 0);

    // The connections were never disturbed: both still carry verified data.
    transfer_both(&mut g, &conns, 1 << 20);
    assert_eq!(g.server.wrong_shard(), 2);
    assert_eq!(g.client.wrong_shard(), 0);
}

#[test]
fn group_misconfigurations_name_the_fix() {
    let fabric = SimFabric::new(SimConfig::default());
    let qp = || {
        fabric
            .create_qp(gid(9, false), SimQpOptions::default())
            .unwrap()
    };
    let cfg = quic_rdma::engine::EngineConfig::default();
    let err =
        |r: Result<EngineGroup<SimQp>, quic_rdma::engine::EngineError>| r.unwrap_err().to_string();
    assert!(err(EngineGroup::new(vec![], cfg.clone())).contains("at least one queue pair"));
    assert!(err(EngineGroup::with_keys(
        vec![qp(), qp()],
        cfg.clone(),
        vec![7, 7]
    ))
    .contains("give each its own"));
    assert!(err(EngineGroup::with_keys(
        vec![qp()],
        cfg.clone(),
        vec![1 << 20]
    ))
    .contains("20 bits"));
    let mut g = EngineGroup::new(vec![qp(), qp(), qp()], cfg).unwrap();
    let k = g.keys().to_vec();
    assert!(k[0] != k[1] && k[1] != k[2] && k[0] != k[2], "{k:x?}");
    assert!(g
        .connect(Instant::now(), 0, &[], "localhost")
        .unwrap_err()
        .to_string()
        .contains("addrs()"));
}
