//! GRH parse (IPv4 and IPv6 layouts): run once per received packet.
// criterion_group! expands to an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use quic_rdma::fabric::{Gid, Grh, GrhLayout, GRH_LEN};

fn area(layout: GrhLayout) -> [u8; GRH_LEN] {
    let (s, d): (Gid, Gid) = match layout {
        GrhLayout::Ipv4 => (
            Ipv4Addr::new(10, 0, 0, 1).into(),
            Ipv4Addr::new(10, 0, 0, 2).into(),
        ),
        GrhLayout::Ipv6 => (
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(),
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(),
        ),
    };
    let g = Grh {
        sgid: s,
        dgid: d,
        traffic_class: 0b10,
        flow_label: 0xABCDE,
        hop_limit: 64,
        ip_payload_len: 1200 + 8 + 28,
    };
    let mut a = [0u8; GRH_LEN];
    g.write(&mut a, layout);
    a
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("grh_parse");
    for (name, layout) in [("ipv4", GrhLayout::Ipv4), ("ipv6", GrhLayout::Ipv6)] {
        let a = area(layout);
        assert!(Grh::parse(&a, layout).is_ok());
        g.bench_function(name, |b| {
            b.iter(|| Grh::parse(black_box(&a), black_box(layout)))
        });
    }
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
