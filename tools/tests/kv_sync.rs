//! Issue 12, must-show (a): a real Redis master → `qr kv-relay upstream` →
//! fabric (`soft`, mutual TLS) → `qr kv-relay downstream` → a real Redis
//! replica. 200 000 keys of mixed types plus values of at least 1 MiB, and
//! writes running through both full syncs; afterwards the datasets are
//! identical (DEBUG DIGEST, DBSIZE, values of every type).
//!
//! Addresses: 127.0.112.1..4, TCP ports 19201..19206.

mod kv_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kv_support::*;

#[test]
fn full_sync_of_mixed_types_with_writes_during_the_sync() {
    let dir = TempDir::new("sync");
    let master = Redis::start(
        &dir,
        "127.0.112.1",
        19201,
        &[
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "64mb",
        ],
    );
    const BIG: usize = 4;
    populate(&master, 200_000, BIG);
    assert_eq!(master.client().ok(&["DBSIZE"]), (200_000 + BIG).to_string());
    let pki = pki(&dir, "127.0.112.3", "127.0.112.4");

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let w = writer(master.addr(), stop.clone(), writes.clone());
    let up = upstream(&dir, &pki, "127.0.112.3", 19203, 19204, &master.addr(), &[]);
    let down = downstream(&dir, &pki, "127.0.112.4", 19205, 19206, "127.0.112.3:19203");
    let before = writes.load(Ordering::Relaxed);
    let replica = Redis::start(
        &dir,
        "127.0.112.2",
        19202,
        &["--replicaof", "127.0.112.4", "19205"],
    );
    let up_ok = wait_until(Duration::from_secs(120), || {
        replica
            .client()
            .info("replication")
            .get("master_link_status")
            .map(String::as_str)
            == Some("up")
    });
    assert!(
        up_ok,
        "replica link never came up\n{}\n{}",
        up.output(),
        down.output()
    );
    let during = writes.load(Ordering::Relaxed) - before;
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    assert!(during > 0, "no writes happened while the replica synced");

    assert_same(&master, &replica, BIG, &[&up, &down]);
    assert_eq!(
        master.client().ok(&["GET", "w:counter"]),
        replica.client().ok(&["GET", "w:counter"])
    );

    // The relays' own account: one full sync each, no errors, lag drained.
    let us = status("127.0.112.3:19204");
    let ds = status("127.0.112.4:19206");
    assert_eq!(us["sync_full"], 1, "{us}");
    assert_eq!(ds["sync_full"], 1, "{ds}");
    assert_eq!(us["malformed"], 0, "{us}");
    // The snapshot crossed whole: what the master sent is what the replica got.
    let src = us["snapshot_source_bytes"].as_u64().unwrap();
    assert!(src > 4 << 20, "{us}");
    assert_eq!(us["snapshot_bytes"], src, "{us}");
    assert_eq!(ds["snapshot_bytes"], src, "{ds}");
    let m = metrics("127.0.112.3:19204");
    for name in [
        "qr_kv_sync_full_total{",
        "qr_kv_backlog_bytes",
        "qr_kv_log_head_bytes",
        "qr_kv_replica_lag_bytes",
        "qr_kv_credit_turnaround_seconds_bucket{",
    ] {
        assert!(m.contains(name), "{name} missing:\n{m}");
    }
    // Each replica row says who it is: upstream, the downstream relay by its
    // certificate name; downstream, the Redis replica by its address and
    // listening port, as Redis's own INFO names a replica.
    let row = |s: &serde_json::Value| {
        let rows = s["replicas"].as_object().expect("replicas");
        assert_eq!(rows.len(), 1, "{s}");
        rows.values().next().cloned().unwrap()
    };
    assert_eq!(row(&us)["peer"], "down", "{us}");
    // Its IP is the connection's source (the kernel picks one on loopback).
    let peer: std::net::SocketAddr = row(&ds)["peer"].as_str().unwrap().parse().unwrap();
    assert!(peer.ip().is_loopback() && peer.port() == 19202, "{ds}");
    assert!(m.contains(",replica=\"down\"}"), "no replica label:\n{m}");
    eprintln!("writes during the sync: {during}; upstream status {us}");
}
