//! The `soft` provider's RoCEv2 UD codec per packet size: encode (BTH, DETH,
//! ImmDt, pad, ICRC), decode, and the ICRC check alone (IPv4 and IPv6).
// criterion_group! expands to an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quic_rdma::fabric::soft::codec::{
    decode, encode, encoded_len, verify_icrc, IcrcContext, IcrcPolicy, IpPair, UdHeader,
};
use quic_rdma::fabric::{DEFAULT_PKEY, DEFAULT_QKEY, ROCEV2_UDP_PORT};

fn header() -> UdHeader {
    UdHeader {
        solicited: false,
        mig_req: true,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: 0x12,
        ack_req: false,
        psn: 77,
        qkey: DEFAULT_QKEY,
        src_qp: 0x11,
        imm: Some(0xABCDE),
    }
}

fn contexts() -> [(&'static str, IcrcContext); 2] {
    [
        (
            "ipv4",
            IcrcContext {
                ip: IpPair::V4 {
                    src: Ipv4Addr::new(127, 0, 0, 1),
                    dst: Ipv4Addr::new(127, 0, 0, 2),
                },
                src_port: 50000,
                dst_port: ROCEV2_UDP_PORT,
            },
        ),
        (
            "ipv6",
            IcrcContext {
                ip: IpPair::V6 {
                    src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                    dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
                },
                src_port: 50000,
                dst_port: ROCEV2_UDP_PORT,
            },
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let h = header();
    for (ip, ctx) in contexts() {
        let mut g = c.benchmark_group(format!("rocev2_codec_{ip}"));
        for len in [64usize, 1200, 4096] {
            let payload = vec![0x5Au8; len];
            let mut out = vec![0u8; encoded_len(len, true)];
            let n = encode(&h, &payload, &ctx, &mut out).unwrap();
            let pkt = out[..n].to_vec();
            assert!(decode(&pkt).is_ok());
            assert!(verify_icrc(&ctx, &pkt, IcrcPolicy::SolveIpv4Id).is_ok());
            g.throughput(Throughput::Bytes(len as u64));
            g.bench_with_input(BenchmarkId::new("encode", len), &len, |b, _| {
                b.iter(|| encode(black_box(&h), black_box(&payload), &ctx, &mut out).unwrap())
            });
            g.bench_with_input(BenchmarkId::new("decode", len), &len, |b, _| {
                b.iter(|| decode(black_box(&pkt)).unwrap().payload.len())
            });
            g.bench_with_input(BenchmarkId::new("verify_icrc", len), &len, |b, _| {
                b.iter(|| verify_icrc(&ctx, black_box(&pkt), IcrcPolicy::SolveIpv4Id).unwrap())
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
