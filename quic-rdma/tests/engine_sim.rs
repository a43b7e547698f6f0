//! The engine over the `sim` fabric: the quinn adapter's pair-harness tests
//! (handshake, verified transfers with loss/duplication/reordering, migration)
//! plus the engine's own API: streams, datagrams, accept policies, close.

mod engine_common;

use std::time::Instant;

use engine_common::{moved_gid, transfer, EnginePair};
use quic_rdma::engine::{AcceptPolicy, CloseReason, EngineError, Event};
use quic_rdma::fabric::sim::{Faults, SimConfig};

fn cfg(faults: Faults, seed: u64) -> SimConfig {
    SimConfig {
        faults,
        seed,
        ..SimConfig::default()
    }
}

#[test]
fn handshake_uses_the_fabric_mtu() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    assert_eq!(p.client.conn_stats(c).unwrap().path.current_mtu, 4096);
    assert_eq!(p.server.conn_stats(s).unwrap().path.current_mtu, 4096);
    assert_eq!(p.server.remote_addr(s).unwrap(), p.client.local_addr());
    assert_eq!(p.client.remote_addr(c).unwrap(), p.server.local_addr());
    assert_eq!(p.client.connection_count(), 1);
    let st = p.client.socket_stats();
    assert!(st.sent_wrs > 0 && st.recv_packets > 0);
    assert!(
        p.client.next_deadline().is_some(),
        "idle/keep-alive timers armed"
    );
}

fn big_transfer(faults: Faults, seed: u64, len: u64) {
    let mut p = EnginePair::new(cfg(faults, seed));
    let (c, s) = p.connect();
    let t = Instant::now();
    transfer(&mut p, c, s, len, seed, |_, _| {});
    let fs = p.fabric.stats();
    eprintln!(
        "{} MiB in {:?}; fabric {:?}; client {:?}",
        len >> 20,
        t.elapsed(),
        fs,
        p.client.socket_stats()
    );
    let cs = p.client.conn_stats(c).unwrap();
    assert_eq!(cs.path.current_mtu, 4096);
    if faults.loss > 0.0 {
        assert!(fs.lost > 0, "loss was injected");
        assert!(
            cs.path.lost_packets > 0,
            "quinn-proto saw and recovered losses"
        );
    }
    if faults.duplicate > 0.0 {
        assert!(fs.duplicated > 0 && fs.reordered > 0);
    }
}

#[test]
fn transfer_64mib_no_loss() {
    big_transfer(Faults::default(), 21, 64 << 20);
}

#[test]
fn transfer_64mib_1pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.01), 22, 64 << 20);
}

#[test]
fn transfer_32mib_5pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.05), 23, 32 << 20);
}

#[test]
fn client_migrates_mid_transfer() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let old = p.client.local_addr();
    let len = 32 << 20;
    let mut moved = false;
    transfer(&mut p, c, s, len, 31, |p, sent| {
        if !moved && sent >= len / 2 {
            p.client_qp.set_gid(moved_gid());
            moved = true;
        }
    });
    assert!(moved);
    let new = p.client.local_addr();
    assert_eq!(new.gid, moved_gid());
    assert_ne!(new, old);
    // The server follows the client to its new address.
    assert_eq!(p.server.remote_addr(s).unwrap(), new);
    assert_eq!(p.client.socket_stats().gid_changes, 1);
    assert!(p.client.socket_stats().ah_rebuilt > 0 || p.client.socket_stats().ah_created > 1);
}
