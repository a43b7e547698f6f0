//! The UD socket over `sim`: send + receive of one packet (64 B inline, 1200 B,
//! 4096 B), and the address-handle cache hit vs. miss on the send path.
// criterion_group! expands to an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::Ipv6Addr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::{Gid, UdAddr, DEFAULT_QKEY};
use quic_rdma::socket::{SocketConfig, UdSocket};

fn gid(n: u16) -> Gid {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into()
}

fn socket(f: &SimFabric, n: u16, cfg: SocketConfig) -> UdSocket<SimQp> {
    UdSocket::new(f.create_qp(gid(n), SimQpOptions::default()).unwrap(), cfg).unwrap()
}

/// A short-header QUIC-looking datagram (its CID bytes give the routing key).
fn datagram(len: usize) -> Vec<u8> {
    let mut d = vec![0xA7u8; len];
    d[0] = 0x40;
    d
}

fn send_recv(c: &mut Criterion) {
    let mut g = c.benchmark_group("socket_send_recv");
    for len in [64usize, 1200, 4096] {
        let f = SimFabric::new(SimConfig::default());
        let mut a = socket(&f, 1, SocketConfig::default());
        let mut b = socket(&f, 2, SocketConfig::default());
        let dest = b.local_addr();
        let d = datagram(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &len, |bn, _| {
            bn.iter(|| {
                a.send(dest, 0b10, black_box(&d), None).unwrap();
                let mut got = 0;
                while got == 0 {
                    got = b.recv(1, |r| {
                        black_box(r.data);
                    });
                }
            })
        });
        assert_eq!(b.stats().recv_errors, 0);
    }
    g.finish();
}

fn ah_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("ah_cache_send");
    let d = datagram(64);
    // Destinations no port has: the fabric drops them after the send completes,
    // so only the send path (and its AH lookup) is measured.
    let peers: Vec<UdAddr> = (0..64)
        .map(|i| UdAddr::new(gid(1000 + i), 0x99, DEFAULT_QKEY))
        .collect();
    {
        let f = SimFabric::new(SimConfig::default());
        let mut s = socket(&f, 1, SocketConfig::default());
        // Warm the cache so every measured send (criterion's test mode runs
        // the routine once) is a hit.
        s.send(peers[0], 0b10, &d, None).unwrap();
        let hits_before = s.stats().ah_hits;
        g.bench_function("hit_one_peer", |bn| {
            bn.iter(|| s.send(peers[0], 0b10, black_box(&d), None).unwrap())
        });
        assert!(s.stats().ah_hits > hits_before);
        assert_eq!(s.stats().ah_created, 1);
    }
    {
        // 64 peers through an 8-entry cache, round robin: every send misses,
        // creates an AH and retires the least recently used one.
        let f = SimFabric::new(SimConfig::default());
        let cfg = SocketConfig {
            ah_capacity: 8,
            ..SocketConfig::default()
        };
        let mut s = socket(&f, 1, cfg);
        let mut i = 0;
        let mut sends = 0u64;
        g.bench_function("miss_64_peers_8_entries", |bn| {
            bn.iter(|| {
                i = (i + 1) % peers.len();
                sends += 1;
                s.send(peers[i], 0b10, black_box(&d), None).unwrap()
            })
        });
        assert_eq!(s.stats().ah_created, sends, "every send should miss");
        assert_eq!(s.stats().ah_hits, 0);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = send_recv, ah_cache
}
criterion_main!(benches);
