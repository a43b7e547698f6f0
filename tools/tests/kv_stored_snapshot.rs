//! Issue 25, defect 4: a restarted upstream relay keeps its snapshot. The
//! relay links each finished snapshot into `--dir` with a record of its
//! replication id, position, length and SHA-256; after a SIGKILL and a
//! restart it checks the copy and, while the real master's backlog still
//! reaches its position, starts there: the replica already behind the relays
//! resumes partially and a new replica's full sync is served from the kept
//! snapshot — the real master does no new full sync (its `sync_full` stays).
//! A kept snapshot changed on disk is refused (counted, logged, removed) and
//! a new one fetched: corrupt data at rest is never served.
//!
//! Addresses: 127.0.119.11..16, TCP ports 19600..19607.

mod kv_support;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use kv_support::*;

const UP_IP: &str = "127.0.119.13";
const DOWN_IP: &str = "127.0.119.14";
const UP_PORT: u16 = 19602;
const UP_METRICS: &str = "127.0.119.13:19603";

fn link_up(r: &Redis) -> bool {
    r.client()
        .info("replication")
        .get("master_link_status")
        .map(String::as_str)
        == Some("up")
}

fn up(dir: &TempDir, pki: &std::path::Path, master: &Redis) -> Proc {
    upstream(dir, pki, UP_IP, UP_PORT, 19603, &master.addr(), &[])
}

#[test]
fn a_restarted_upstream_serves_the_snapshot_it_kept_and_refuses_a_changed_one() {
    let dir = TempDir::new("stored-snapshot");
    let master = Redis::start(
        &dir,
        "127.0.119.11",
        19600,
        &[
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "64mb",
        ],
    );
    populate(&master, 20_000, 1);
    let pki = pki(&dir, UP_IP, DOWN_IP);
    let mut up1 = up(&dir, &pki, &master);
    let down = downstream(
        &dir,
        &pki,
        DOWN_IP,
        19604,
        19605,
        &format!("{UP_IP}:{UP_PORT}"),
    );
    let first = Redis::start(
        &dir,
        "127.0.119.12",
        19601,
        &["--replicaof", DOWN_IP, "19604"],
    );
    assert!(
        wait_until(Duration::from_secs(60), || link_up(&first)),
        "{}",
        dump(&[&up1, &down])
    );
    let kept = dir.path(&format!("up-{UP_PORT}/stored-snapshot.rdb"));
    assert!(
        kept.exists(),
        "no kept snapshot in --dir\n{}",
        dump(&[&up1, &down])
    );
    let full_before = master.stat("sync_full");

    // Writes move the replica past the snapshot's position; the relay saves
    // where it is (every second), then dies without cleaning up.
    //
    // Paced: the kept snapshot serves a full sync only while the relay's
    // backlog (64 MiB) still holds the log from its position, so everything
    // written until the second replica is in sync must fit. An unpaced writer
    // makes ~6 MB/s here and fills it in ~10 s, about what the test spends
    // (the downstream noticing the killed relay by its idle timeout, the
    // resume) before the second replica even starts: then fetching a new
    // snapshot from the master would be right. 2000 rounds/s (~400 kB/s) fit
    // for the longest this can take (2.5 s + 20 s for the restarted relay to
    // listen + 60 s + 60 s: ~56 MB).
    let stop = Arc::new(AtomicBool::new(false));
    let w = paced_writer(
        master.addr(),
        stop.clone(),
        Arc::new(AtomicU64::new(0)),
        2000,
    );
    std::thread::sleep(Duration::from_millis(2500));
    up1.kill();
    let up2 = up(&dir, &pki, &master);
    assert!(
        wait_until(Duration::from_secs(60), || {
            status(UP_METRICS)["sync_partial_ok"].as_u64() >= Some(1)
        }),
        "the replica did not resume through the restarted relay\n{}",
        dump(&[&up1, &up2, &down])
    );
    let us = status(UP_METRICS);
    assert_eq!(
        us["stored_snapshot_restored"],
        1,
        "{us}\n{}",
        dump(&[&up1, &up2, &down])
    );
    assert_eq!(
        us["stored_snapshot_refused"],
        0,
        "{us}\n{}",
        dump(&[&up1, &up2, &down])
    );

    // A new replica needs a full sync: the kept snapshot and the log after it.
    let second = Redis::start(
        &dir,
        "127.0.119.15",
        19606,
        &["--replicaof", DOWN_IP, "19604"],
    );
    assert!(
        wait_until(Duration::from_secs(60), || link_up(&second)),
        "{}",
        dump(&[&up1, &up2, &down])
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    w.join().unwrap();
    assert_same(&master, &first, 1, &[&up1, &up2, &down]);
    assert_same(&master, &second, 1, &[&up1, &up2, &down]);
    assert_eq!(
        master.stat("sync_full"),
        full_before,
        "the master was asked for a new snapshot\n{}",
        dump(&[&up1, &up2, &down])
    );
    let us = status(UP_METRICS);
    assert_eq!(us["sync_full"], 1, "{us}\n{}", dump(&[&up2, &down]));
    assert!(
        first
            .proc
            .output()
            .contains("Master accepted a Partial Resynchronization"),
        "{}",
        first.proc.output()
    );
    let m = metrics(UP_METRICS);
    assert!(
        m.contains("qr_kv_stored_snapshot_restored_total{role=\"upstream\"} 1\n"),
        "{m}"
    );

    // A byte of the kept snapshot changes at rest: the next restart refuses
    // it and a new replica gets a fresh snapshot from the master instead.
    let mut up2 = up2;
    up2.kill();
    let mut bytes = std::fs::read(&kept).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&kept, &bytes).unwrap();
    let up3 = up(&dir, &pki, &master);
    assert!(
        wait_until(Duration::from_secs(20), || {
            status(UP_METRICS)["stored_snapshot_refused"].as_u64() == Some(1)
        }),
        "{}",
        dump(&[&up3, &down])
    );
    assert!(
        up3.output().contains("does not match the SHA-256"),
        "{}",
        dump(&[&up3, &down])
    );
    let third = Redis::start(
        &dir,
        "127.0.119.16",
        19607,
        &["--replicaof", DOWN_IP, "19604"],
    );
    assert!(
        wait_until(Duration::from_secs(60), || link_up(&third)),
        "{}",
        dump(&[&up3, &down])
    );
    assert_same(&master, &third, 1, &[&up3, &down]);
    assert_eq!(
        master.stat("sync_full"),
        full_before + 1,
        "{}",
        dump(&[&up3, &down])
    );
    assert_eq!(
        status(UP_METRICS)["stored_snapshot_restored"],
        0,
        "{}",
        dump(&[&up3, &down])
    );
}
