//! quinn client/server over the `sim` fabric: handshake and verified transfers.

mod common;

use std::time::Instant;

use common::{transfer, Pair};
use quic_rdma::fabric::sim::{Faults, SimConfig};

fn cfg(faults: Faults, seed: u64) -> SimConfig {
    SimConfig {
        faults,
        seed,
        ..SimConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_and_mtu_4096() {
    let p = Pair::new(SimConfig::default());
    let (c, s) = p.connect().await;
    assert_eq!(c.max_datagram_size().is_some(), true);
    transfer(&c, &s, 1 << 20, 1).await;
    // The path MTU quinn uses is the fabric's (no 1472 cap).
    assert_eq!(c.stats().path.current_mtu, 4096);
    assert_eq!(s.stats().path.current_mtu, 4096);
    let st = p.client_sock.stats();
    assert!(st.sent_wrs > 0 && st.recv_packets > 0);
}

async fn big_transfer(faults: Faults, seed: u64) {
    let p = Pair::new(cfg(faults, seed));
    let (c, s) = p.connect().await;
    let t = Instant::now();
    transfer(&c, &s, 256 << 20, seed).await;
    let fs = p.fabric.stats();
    eprintln!(
        "256 MiB in {:?}; fabric {:?}; client {:?}",
        t.elapsed(),
        fs,
        p.client_sock.stats()
    );
    assert_eq!(c.stats().path.current_mtu, 4096);
    if faults.loss > 0.0 {
        assert!(fs.lost > 0, "loss was injected");
        assert!(
            c.stats().path.lost_packets > 0,
            "quinn saw and recovered losses"
        );
    }
    if faults.duplicate > 0.0 {
        assert!(fs.duplicated > 0 && fs.reordered > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_256mib_no_loss() {
    big_transfer(Faults::default(), 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_256mib_1pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.01), 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_256mib_5pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.05), 13).await;
}
