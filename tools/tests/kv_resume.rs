//! Issue 12, must-show (b): the fabric link is cut mid-stream — the
//! downstream relay is killed (SIGKILL) while writes flow, and restarted —
//! and the real replica resumes by partial resync: it asks the restarted
//! relay for its own replid and offset, the relay asks the upstream relay,
//! whose backlog holds them, and answers `+CONTINUE`. The real master never
//! sees a new full sync (its `sync_full` stays where it was) and the datasets
//! end identical.
//!
//! Addresses: 127.0.112.11..14, TCP ports 19211..19216.

mod kv_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kv_support::*;

#[test]
fn replica_resumes_by_partial_resync_after_the_relay_is_killed() {
    let dir = TempDir::new("resume");
    let master = Redis::start(
        &dir,
        "127.0.112.11",
        19211,
        &[
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "64mb",
        ],
    );
    populate(&master, 20_000, 1);
    let pki = pki(&dir, "127.0.112.13", "127.0.112.14");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.13",
        19213,
        19214,
        &master.addr(),
        &[],
    );
    let mut down = downstream(
        &dir,
        &pki,
        "127.0.112.14",
        19215,
        19216,
        "127.0.112.13:19213",
    );
    let replica = Redis::start(
        &dir,
        "127.0.112.12",
        19212,
        &["--replicaof", "127.0.112.14", "19215"],
    );
    let link_up = |r: &Redis| {
        r.client()
            .info("replication")
            .get("master_link_status")
            .map(String::as_str)
            == Some("up")
    };
    assert!(
        wait_until(Duration::from_secs(60), || link_up(&replica)),
        "{}",
        down.output()
    );
    let full_before = master.stat("sync_full");
    let partial_before = master.stat("sync_partial_ok");

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let w = writer(master.addr(), stop.clone(), writes.clone());
    std::thread::sleep(Duration::from_millis(700));
    // Cut: the relay dies with commands in flight on both sides of it.
    down.kill();
    let at_cut = writes.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1500));
    let down2 = downstream(
        &dir,
        &pki,
        "127.0.112.14",
        19215,
        19216,
        "127.0.112.13:19213",
    );
    assert!(
        wait_until(Duration::from_secs(60), || link_up(&replica)),
        "replica did not reconnect\n{}\n{}",
        down2.output(),
        replica.proc.output()
    );
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    assert!(
        writes.load(Ordering::Relaxed) > at_cut,
        "no writes after the cut"
    );

    assert_same(&master, &replica, 1, &[&up, &down2]);
    let log = replica.proc.output();
    assert!(
        log.contains("Master accepted a Partial Resynchronization"),
        "the replica did not resume partially:\n{log}"
    );
    // Neither the real master nor the relays did a second full sync.
    assert_eq!(master.stat("sync_full"), full_before);
    assert_eq!(master.stat("sync_partial_ok"), partial_before);
    let ds = status("127.0.112.14:19216");
    assert_eq!(ds["sync_partial_ok"], 1, "{ds}");
    assert_eq!(ds["sync_full"], 0, "{ds}");
    let us = status("127.0.112.13:19214");
    assert_eq!(us["sync_full"], 1, "{us}");
    assert_eq!(us["sync_partial_ok"], 1, "{us}");
}
