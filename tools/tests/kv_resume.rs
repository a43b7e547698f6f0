//! Issue 12, must-show (b): the fabric link is cut mid-stream — the
//! downstream relay is killed (SIGKILL) while writes flow, and restarted —
//! and the real replica resumes by partial resync: it asks the restarted
//! relay for its own replid and offset, the relay asks the upstream relay,
//! whose backlog holds them, and answers `+CONTINUE`. The real master never
//! sees a new full sync (its `sync_full` stays where it was) and the datasets
//! end identical.
//!
//! Addresses: 127.0.112.11..18, TCP ports 19211..19216 and 19260..19265.

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

/// The other end of the cut: the upstream relay is killed and restarted. It
/// kept the replication id and the offset its replicas had applied (`--dir`),
/// so the new process asks the real master to continue from there (`PSYNC`:
/// the master's `sync_partial_ok` grows, `sync_full` does not), and the
/// replica behind the downstream relay resumes with `+CONTINUE` again.
///
/// Addresses: 127.0.112.15..18, TCP ports 19260..19265.
#[test]
fn upstream_relay_restart_resumes_from_the_master_by_psync() {
    let dir = TempDir::new("resume-up");
    let master = Redis::start(
        &dir,
        "127.0.112.15",
        19260,
        &[
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "64mb",
        ],
    );
    populate(&master, 20_000, 1);
    let pki = pki(&dir, "127.0.112.17", "127.0.112.18");
    let mut up = upstream(
        &dir,
        &pki,
        "127.0.112.17",
        19262,
        19263,
        &master.addr(),
        &[],
    );
    let down = downstream(
        &dir,
        &pki,
        "127.0.112.18",
        19264,
        19265,
        "127.0.112.17:19262",
    );
    let replica = Redis::start(
        &dir,
        "127.0.112.16",
        19261,
        &["--replicaof", "127.0.112.18", "19264"],
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
    // Long enough for the relay to record where the replica is (every second).
    std::thread::sleep(Duration::from_millis(2500));
    up.kill();
    std::thread::sleep(Duration::from_millis(500));
    let up2 = upstream(
        &dir,
        &pki,
        "127.0.112.17",
        19262,
        19263,
        &master.addr(),
        &[],
    );
    // The downstream relay notices the old connection is dead (idle
    // timeout), the replica reconnects, and all resume.
    let resumed = wait_until(Duration::from_secs(60), || {
        status("127.0.112.17:19263")["sync_partial_ok"].as_u64() >= Some(1)
    });
    assert!(resumed, "{}\n{}", up2.output(), down.output());
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();

    assert_same(&master, &replica, 1, &[&up2, &down]);
    assert_eq!(master.stat("sync_full"), full_before, "{}", up2.output());
    assert!(master.stat("sync_partial_ok") > partial_before);
    assert!(
        up2.output().contains("partial resync from the master"),
        "{}",
        up2.output()
    );
    let us = status("127.0.112.17:19263");
    assert_eq!(us["sync_full"], 0, "{us}");
    let log = replica.proc.output();
    assert!(
        log.contains("Master accepted a Partial Resynchronization"),
        "{log}"
    );
    assert_eq!(log.matches("Full resync from master").count(), 1, "{log}");
}
