//! The C latency client (`examples/qr_latency.h`, what `examples/latency.c`
//! runs) against a server written in Rust straight on `quic_rdma::engine`, in
//! one process: over `sim` (the C client's engine and the Rust server share the
//! fabric) and over `soft` (real RoCEv2 packets over UDP on loopback). The C
//! client checks every response equals its request; the server's SHA-256 of
//! what it received must equal that of what the client sent.

use std::sync::Mutex;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{Mtu, UdQueuePair, DEFAULT_QKEY};
use quic_rdma_ffi::qr_fabric;
use quic_rdma_ffi_host::{c_latency_client, sent_request_digest, EchoServer, SelfSigned, MSG};

const ITERS: i64 = 20_000;

/// Both sides busy-poll: one run at a time on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// Run the C client from `client_gid` on `fabric` against the Rust server on `qp`.
fn run(provider: &str, fabric: &qr_fabric, qp: impl UdQueuePair + 'static, client_gid: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tls = SelfSigned::localhost();
    let server = EchoServer::spawn(qp, &tls).expect("Rust engine server starts");
    let r = c_latency_client(fabric, client_gid, server.addr(), tls.cert_der(), ITERS)
        .unwrap_or_else(|rc| panic!("C latency client over {provider} failed: {rc}"));
    let report = server.stop().expect("server ran");
    println!(
        "provider={provider} peer=rust-engine iterations={} rtt p50={:.2} us p99={:.2} us p999={:.2} us max={:.2} us",
        r.iterations, r.p50_us, r.p99_us, r.p999_us, r.max_us
    );
    assert_eq!(r.iterations as i64, ITERS);
    assert!(
        0.0 < r.p50_us && r.p50_us <= r.p99_us && r.p99_us <= r.p999_us && r.p999_us <= r.max_us,
        "{r:?}"
    );
    assert_eq!(report.connections, 1, "{report:?}");
    let warmup = ITERS / 10 + 100;
    assert_eq!(
        report.bytes,
        ((warmup + ITERS) as usize * MSG) as u64,
        "{report:?}"
    );
    assert_eq!(
        report.sha256,
        sent_request_digest(ITERS),
        "server received other bytes than the C client sent"
    );
}

#[test]
fn c_latency_client_against_rust_engine_over_sim() {
    let fabric = qr_fabric::from_sim(SimFabric::new(SimConfig::default()));
    let sim = fabric.as_sim().expect("a sim fabric");
    let qp = sim
        .create_qp(
            "fd00::51".parse::<std::net::Ipv6Addr>().unwrap().into(),
            SimQpOptions::default(),
        )
        .unwrap();
    run("sim", &fabric, qp, "fd00::52");
}

#[test]
fn c_latency_client_against_rust_engine_over_soft() {
    let port = SoftPort::open(SoftConfig::new("127.0.0.61".parse().unwrap()))
        .expect("soft port on 127.0.0.61");
    let qp = port.create_qp(DEFAULT_QKEY).unwrap();
    run("soft", &qr_fabric::soft(Mtu::M4096), qp, "127.0.0.62");
}
