//! Issue 12, must-show (c): three real replicas behind one upstream relay —
//! two behind one downstream relay (two sessions on one QUIC connection), one
//! behind another — each at its own offset, each identical to the master.
//! The master uses disk-based sync here, so the `$<length>` RDB framing is
//! the one exercised (kv_sync.rs covers the diskless `$EOF:` form).
//!
//! Addresses: 127.0.112.20..28, TCP ports 19220..19229.

mod kv_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kv_support::*;

#[test]
fn three_replicas_behind_one_upstream_relay() {
    let dir = TempDir::new("fanout");
    let master = Redis::start(
        &dir,
        "127.0.112.20",
        19220,
        &["--repl-diskless-sync", "no", "--repl-backlog-size", "64mb"],
    );
    populate(&master, 30_000, 2);
    let pki = pki(&dir, "127.0.112.21", "127.0.112.22");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.21",
        19221,
        19222,
        &master.addr(),
        &[],
    );
    let down_a = downstream(
        &dir,
        &pki,
        "127.0.112.22",
        19223,
        19224,
        "127.0.112.21:19221",
    );
    let down_b = downstream(
        &dir,
        &pki,
        "127.0.112.23",
        19225,
        19226,
        "127.0.112.21:19221",
    );

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let w = writer(master.addr(), stop.clone(), writes.clone());
    let replicas = [
        Redis::start(
            &dir,
            "127.0.112.24",
            19227,
            &["--replicaof", "127.0.112.22", "19223"],
        ),
        Redis::start(
            &dir,
            "127.0.112.25",
            19228,
            &["--replicaof", "127.0.112.22", "19223"],
        ),
        Redis::start(
            &dir,
            "127.0.112.26",
            19229,
            &["--replicaof", "127.0.112.23", "19225"],
        ),
    ];
    for r in &replicas {
        assert!(
            wait_until(Duration::from_secs(90), || r
                .client()
                .info("replication")
                .get("master_link_status")
                .map(String::as_str)
                == Some("up")),
            "replica {} never came up\n{}\n{}",
            r.addr(),
            down_a.output(),
            down_b.output()
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    for r in &replicas {
        assert_same(&master, r, 2, &[&up, &down_a, &down_b]);
    }
    // One full sync from the real master fed all three.
    assert_eq!(master.stat("sync_full"), 1);
    let us = status("127.0.112.21:19222");
    assert_eq!(us["sync_full"], 3, "{us}");
    assert_eq!(us["replicas"].as_object().unwrap().len(), 3, "{us}");
    assert_eq!(status("127.0.112.22:19224")["sync_full"], 2);
    assert_eq!(status("127.0.112.23:19226")["sync_full"], 1);
}
