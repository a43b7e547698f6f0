//! Engine groups over `soft` (docs/architecture.md §9): each group's two QPs
//! share one port (one GID, 127.0.150.x), each shard runs on a thread of its
//! own in real time, and two connections, one per shard, carry seeded data
//! verified by sha256 — with no packet landing on the wrong shard.

mod engine_common;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use engine_common::{configs, fill_chunk};
use quic_rdma::engine::{AcceptPolicy, Engine, EngineError, EngineGroup, Event};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::DEFAULT_QKEY;
use sha2::{Digest, Sha256};

/// Bytes per connection.
const LEN: u64 = 3 << 20;
const CHUNK: usize = 64 * 1024;
/// A hang guard, not a timing check.
const DEADLINE: Duration = Duration::from_secs(60);

fn group_on(ip: Ipv4Addr, cfg: quic_rdma::engine::EngineConfig) -> EngineGroup<SoftQp> {
    let port = SoftPort::open(SoftConfig::new(ip.into())).unwrap();
    let qps = (0..2)
        .map(|_| port.create_qp(DEFAULT_QKEY).unwrap())
        .collect();
    EngineGroup::new(qps, cfg).unwrap()
}

/// Poll `e` (yielding when idle) until `step` returns `true`.
fn drive(e: &mut Engine<SoftQp>, mut step: impl FnMut(&mut Engine<SoftQp>, &[Event]) -> bool) {
    let end = Instant::now() + DEADLINE;
    let mut ev = Vec::new();
    while Instant::now() < end {
        ev.clear();
        e.poll(Instant::now(), &mut ev);
        if step(e, &ev) {
            return;
        }
        if ev.is_empty() {
            std::thread::yield_now();
        }
    }
    panic!("shard loop passed its deadline");
}

#[test]
fn two_shards_per_side_on_threads_over_one_soft_port() {
    let (ccfg, scfg) = configs(4096, AcceptPolicy::AcceptAll);
    let server = group_on(Ipv4Addr::new(127, 0, 150, 1), scfg);
    let mut client = group_on(Ipv4Addr::new(127, 0, 150, 2), ccfg);
    let dir = server.addrs();
    assert_eq!(dir[0].gid, dir[1].gid, "one port, one GID");
    assert_ne!(dir[0].qpn, dir[1].qpn);
    let conns: Vec<_> = (0..2)
        .map(|n| {
            client
                .connect(Instant::now(), n, &dir, "localhost")
                .unwrap()
        })
        .collect();
    assert_eq!((conns[0].0, conns[1].0), (0, 1));
    let done = AtomicUsize::new(0);
    let (sent, got) = std::thread::scope(|s| {
        let done = &done;
        let servers: Vec<_> = server
            .into_shards()
            .into_iter()
            .map(|mut e| {
                s.spawn(move || {
                    let (mut stream, mut hash, mut n, mut fin) = (None, Sha256::new(), 0u64, false);
                    let mut buf = vec![0; CHUNK];
                    drive(&mut e, |e, ev| {
                        for x in ev {
                            if let Event::StreamOpened { conn, stream: st } = *x {
                                stream = Some((conn, st));
                            }
                        }
                        while let (Some((c, st)), false) = (stream, fin) {
                            match e.read(c, st, &mut buf) {
                                Ok(r) => {
                                    hash.update(&buf[..r.len]);
                                    n += r.len as u64;
                                    if r.fin {
                                        fin = true;
                                        done.fetch_add(1, Ordering::Release);
                                    }
                                }
                                Err(EngineError::WouldBlock) => break,
                                Err(err) => panic!("read: {err}"),
                            }
                        }
                        done.load(Ordering::Acquire) == 2
                    });
                    assert_eq!(e.connection_count(), 1, "one connection per server shard");
                    let r = e.routing_stats();
                    assert_eq!((r.wrong_shard, r.imm_mismatch), (0, 0));
                    assert!(e.socket_stats().recv_packets > 500);
                    (n, <[u8; 32]>::from(hash.finalize()))
                })
            })
            .collect();
        let clients: Vec<_> = client
            .into_shards()
            .into_iter()
            .zip(conns.iter().map(|c| c.1))
            .enumerate()
            .map(|(i, (mut e, conn))| {
                s.spawn(move || {
                    let (mut stream, mut hash, mut sent, mut chunk_i) =
                        (None, Sha256::new(), 0u64, 0u64);
                    let mut chunk = vec![0; CHUNK];
                    let (mut off, mut filled, mut fin) = (0, 0, false);
                    drive(&mut e, |e, ev| {
                        if stream.is_none() && ev.contains(&Event::Connected { conn }) {
                            stream = Some(e.open_uni(conn).unwrap());
                        }
                        let Some(st) = stream else { return false };
                        while sent < LEN {
                            if off == filled {
                                let n = (LEN - sent).min(CHUNK as u64) as usize;
                                fill_chunk(&mut chunk[..n], 7 + i as u64, chunk_i);
                                hash.update(&chunk[..n]);
                                (chunk_i, off, filled) = (chunk_i + 1, 0, n);
                            }
                            match e.write(conn, st, &chunk[off..filled]) {
                                Ok(w) => (off, sent) = (off + w, sent + w as u64),
                                Err(EngineError::WouldBlock) => break,
                                Err(err) => panic!("write: {err}"),
                            }
                        }
                        if sent == LEN && !fin {
                            e.finish(conn, st).unwrap();
                            fin = true;
                        }
                        done.load(Ordering::Acquire) == 2
                    });
                    assert_eq!(e.routing_stats().wrong_shard, 0);
                    (sent, <[u8; 32]>::from(hash.finalize()))
                })
            })
            .collect();
        let join = |v: Vec<std::thread::ScopedJoinHandle<'_, (u64, [u8; 32])>>| {
            v.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        };
        let got = join(servers);
        (join(clients), got)
    });
    // Client shard n's connection went to server shard n.
    for (c, s) in sent.iter().zip(&got) {
        assert_eq!(c.0, LEN);
        assert_eq!(s.0, LEN, "byte count");
        assert_eq!(s.1, c.1, "sha256 of what arrived equals what was sent");
    }
    assert_ne!(
        got[0].1, got[1].1,
        "the two connections carried different data"
    );
}
