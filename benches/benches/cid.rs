//! Connection IDs with a routing key: generation, validation, and reading the
//! key of a datagram's destination CID (run once per packet on both paths).
// criterion_group! expands to an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use quic_rdma::quic::{key_of_datagram, RoutingCidGenerator, DEFAULT_CID_LEN};
use quinn_proto::ConnectionIdGenerator;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("cid");
    let mut gen = RoutingCidGenerator::new(0xABCDE, DEFAULT_CID_LEN);
    g.bench_function("generate", |b| b.iter(|| black_box(gen.generate_cid())));
    let cid = gen.generate_cid();
    g.bench_function("validate", |b| b.iter(|| gen.validate(black_box(&cid))));
    let mut short = vec![0x40];
    short.extend_from_slice(&cid);
    short.resize(1200, 0);
    let mut long = vec![0xC0, 0, 0, 0, 1, cid.len() as u8];
    long.extend_from_slice(&cid);
    long.resize(1200, 0);
    g.bench_function("key_of_datagram/short", |b| {
        b.iter(|| key_of_datagram(black_box(&short)))
    });
    g.bench_function("key_of_datagram/long", |b| {
        b.iter(|| key_of_datagram(black_box(&long)))
    });
    g.finish();
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
