//! Received datagrams the application does not read in time: the engine's
//! bounded queue drops the oldest, counts them ([`Engine::datagram_stats`],
//! [`Engine::datagrams_dropped`]) and says so ([`Event::DatagramsDropped`]),
//! where quinn-proto alone dropped them silently (issue 29, C API gap 2).

mod engine_common;

use std::time::Instant;

use engine_common::{configs, EnginePair};
use quic_rdma::engine::{AcceptPolicy, ConnHandle, EngineConfig, Event};
use quic_rdma::fabric::sim::{SimConfig, SimFabric};

/// Sends `n` numbered datagrams of `len` bytes to a server holding `buffer`
/// bytes of them that reads none until all arrived; returns the survivors'
/// sequence numbers, the sum of the drop events' counts, the pair and the
/// server's connection.
fn unread(n: u32, len: usize, buffer: usize) -> (Vec<u32>, u64, EnginePair, ConnHandle) {
    let cfg = SimConfig::default();
    let (ccfg, scfg) = configs(cfg.mtu.bytes(), AcceptPolicy::AcceptAll);
    let scfg = EngineConfig {
        datagram_recv_buffer: buffer,
        ..scfg
    };
    let fabric = SimFabric::manual(cfg, Instant::now());
    let mut p = EnginePair::from_configs(fabric, ccfg, scfg);
    let (c, s) = p.connect();
    let mut msg = vec![0u8; len];
    let (mut sent, mut signalled) = (0u32, 0u64);
    p.run_until(|p| {
        while sent < n {
            msg[..4].copy_from_slice(&sent.to_le_bytes());
            if p.client.send_datagram(c, &msg).is_err() {
                break;
            }
            sent += 1;
        }
        for ev in &p.sev {
            if let Event::DatagramsDropped { conn, count } = *ev {
                assert_eq!(conn, s);
                assert!(count > 0);
                signalled += count;
            }
        }
        p.server.datagram_stats(s).unwrap().received == u64::from(n)
    });
    let mut buf = vec![0u8; len];
    let mut got = Vec::new();
    while let Ok(k) = p.server.recv_datagram(s, &mut buf) {
        assert_eq!(k, len);
        got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
    }
    (got, signalled, p, s)
}

#[test]
fn unread_datagrams_are_dropped_oldest_first_counted_and_signalled() {
    // quinn-proto's default: 4 MiB, 32 bytes of overhead per datagram.
    let (got, signalled, p, s) = unread(5000, 1000, 4 << 20);
    assert_eq!(got.len(), (4 << 20) / 1032, "as many as the buffer holds");
    assert_eq!(signalled, 5000 - got.len() as u64);
    let first = signalled as u32;
    assert!(
        got.iter().copied().eq(first..5000),
        "the newest survive, in order"
    );
    let s = p.server.datagram_stats(s).unwrap();
    assert_eq!(
        (s.received, s.delivered, s.dropped, s.queued),
        (5000, got.len() as u64, signalled, 0)
    );
    assert_eq!(p.server.datagrams_dropped(), signalled);
}

#[test]
fn a_larger_buffer_keeps_them_all() {
    let (got, signalled, p, _) = unread(5000, 1000, 16 << 20);
    assert_eq!((got.len(), signalled), (5000, 0));
    assert_eq!(p.server.datagrams_dropped(), 0);
}
