//! Issue 12, must-show (d): a replica that falls beyond the upstream relay's
//! backlog gets a clean full resync. The real replica is stopped (SIGSTOP)
//! while far more is written than the backlog (1 MiB) and every buffer in
//! between can hold; its session leaves the backlog and ends; resumed, the
//! replica reconnects asking for its old offset, which nobody can serve: the
//! upstream relay fetches a fresh snapshot from the master and the replica
//! is fully resynchronised, identical to the master.
//!
//! Addresses: 127.0.112.40..43, TCP ports 19240..19246.

mod kv_support;

use std::process::Command;
use std::time::Duration;

use kv_support::*;

fn signal(pid: u32, sig: &str) {
    let s = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(s.success());
}

#[test]
fn replica_beyond_the_backlog_gets_a_full_resync() {
    let dir = TempDir::new("backlog");
    let master = Redis::start(
        &dir,
        "127.0.112.40",
        19240,
        &[
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "64mb",
        ],
    );
    populate(&master, 10_000, 1);
    let pki = pki(&dir, "127.0.112.42", "127.0.112.43");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.42",
        19242,
        19243,
        &master.addr(),
        &["--backlog", "1M", "--window", "1M"],
    );
    let down = downstream(
        &dir,
        &pki,
        "127.0.112.43",
        19244,
        19245,
        "127.0.112.42:19242",
    );
    let replica = Redis::start(
        &dir,
        "127.0.112.41",
        19241,
        &["--replicaof", "127.0.112.43", "19244"],
    );
    let link_up = || {
        replica
            .client()
            .info("replication")
            .get("master_link_status")
            .map(String::as_str)
            == Some("up")
    };
    assert!(
        wait_until(Duration::from_secs(60), link_up),
        "{}",
        down.output()
    );
    assert_same(&master, &replica, 1, &[&up, &down]);
    let full_before = master.stat("sync_full");

    signal(replica.proc.pid(), "-STOP");
    // 96 MiB of writes: beyond the backlog, the credit window, the session
    // queues and the kernel's socket buffers together.
    let mut c = master.client();
    let v = vec![b'v'; 16 << 10];
    for round in 0..6 {
        for i in 0..1024 {
            let k = format!("fill:{round}:{i}");
            c.send(&[b"SET", k.as_bytes(), &v]);
        }
        for _ in 0..1024 {
            assert!(!matches!(c.read(), Reply::Error(_)));
        }
    }
    let us = status("127.0.112.42:19243");
    assert!(us["backlog_bytes"].as_u64().unwrap() <= 1 << 20, "{us}");
    signal(replica.proc.pid(), "-CONT");

    assert_same(&master, &replica, 1, &[&up, &down]);
    let log = replica.proc.output();
    assert!(
        log.matches("Full resync from master").count() >= 2,
        "the replica was not fully resynchronised:\n{log}"
    );
    // The upstream relay fetched a fresh snapshot for it: one more full sync at the master.
    assert!(master.stat("sync_full") > full_before);
    let us = status("127.0.112.42:19243");
    assert!(us["sync_partial_err"].as_u64().unwrap() >= 1, "{us}");
    assert_eq!(us["sync_full"], 2, "{us}");
}
