//! Issue 25, item 1: PSYNC2 end to end. The real master is stopped with
//! `SHUTDOWN SAVE` and restarted on the same port and directory: it comes
//! back under a new replication id, keeping the old one as `master_replid2`
//! up to `second_repl_offset`, so a direct replica would resume partially.
//! Behind the relays the replica must too: the upstream relay resumes from
//! the master (`+CONTINUE <new id>`), carries the old id and where it ended
//! across the fabric, and the downstream relay answers the replica's
//! `PSYNC <old id> <offset>` with `+CONTINUE <new id>`. Afterwards the
//! replica's dataset equals the master's (DEBUG DIGEST), the replica logged
//! one full sync only (the first), the restarted master counted no full
//! sync, and neither relay's full-sync count rose.
//!
//! Addresses: 127.0.112.100..103, TCP ports 19330..19335.

mod kv_support;

use std::time::Duration;

use kv_support::*;

const MASTER_ARGS: &[&str] = &[
    "--repl-diskless-sync-delay",
    "0",
    "--repl-backlog-size",
    "64mb",
];

#[test]
fn replica_behind_the_relays_resumes_partially_after_a_master_restart() {
    let dir = TempDir::new("master-restart");
    let mut master = Redis::start(&dir, "127.0.112.100", 19330, MASTER_ARGS);
    populate(&master, 20_000, 1);
    let pki = pki(&dir, "127.0.112.101", "127.0.112.102");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.101",
        19331,
        19332,
        &master.addr(),
        &[],
    );
    let down = downstream(
        &dir,
        &pki,
        "127.0.112.102",
        19333,
        19334,
        "127.0.112.101:19331",
    );
    let replica = Redis::start(
        &dir,
        "127.0.112.103",
        19335,
        &["--replicaof", "127.0.112.102", "19333"],
    );
    let mut c = master.client();
    for i in 0..500 {
        c.ok(&["SET", &format!("before:{i}"), &i.to_string()]);
    }
    assert_same(&master, &replica, 1, &[&up, &down]);
    let old_id = master.client().info("replication")["master_replid"].clone();
    let logs = || {
        format!(
            "{}\n{}\n{}",
            up.output(),
            down.output(),
            replica.proc.output()
        )
    };

    // SHUTDOWN SAVE: the connection closes without a reply; wait for the
    // process to exit, then start it again on the same port and directory.
    let mut c = master.client();
    c.send(&[b"SHUTDOWN", b"SAVE"]);
    assert!(
        wait_until(Duration::from_secs(30), || !master.proc.alive()),
        "the master did not shut down\n{}",
        master.proc.output()
    );
    master = Redis::start(&dir, "127.0.112.100", 19330, MASTER_ARGS);
    let mi = master.client().info("replication");
    assert_eq!(mi["master_replid2"], old_id, "{mi:?}");
    assert_ne!(mi["master_replid"], old_id, "{mi:?}");

    let mut c = master.client();
    for i in 0..500 {
        c.ok(&["SET", &format!("after:{i}"), &i.to_string()]);
    }
    c.ok(&["INCR", "after:counter"]);
    assert_same(&master, &replica, 1, &[&up, &down]);
    // The replica follows the new id, with the old one as its replid2.
    let ri = replica.client().info("replication");
    assert_eq!(
        ri["master_replid"],
        mi["master_replid"],
        "{ri:?}\n{}",
        logs()
    );
    assert_eq!(ri["master_replid2"], old_id, "{ri:?}");

    // Partial everywhere: the restarted master served the upstream relay by
    // PSYNC, the replica logged one full sync (the first) and accepted a
    // partial one after the restart.
    assert_eq!(master.stat("sync_full"), 0, "{}", logs());
    assert_eq!(master.stat("sync_partial_ok"), 1, "{}", logs());
    let log = replica.proc.output();
    assert_eq!(log.matches("Full resync from master").count(), 1, "{log}");
    assert!(
        log.contains("Master accepted a Partial Resynchronization"),
        "{}",
        logs()
    );
    let us = status("127.0.112.101:19332");
    let ds = status("127.0.112.102:19334");
    assert_eq!(us["sync_full"], 1, "{us}");
    assert_eq!(ds["sync_full"], 1, "{ds}");
    assert!(ds["sync_partial_ok"].as_u64() >= Some(1), "{ds}");
    assert!(
        up.output().contains("the master's replication id is now"),
        "{}",
        up.output()
    );
    // The downstream relay's own INFO tells the same history.
    let di = Client::connect("127.0.112.102:19333")
        .unwrap()
        .info("replication");
    assert_eq!(di["master_replid"], mi["master_replid"], "{di:?}");
    assert_eq!(di["master_replid2"], old_id, "{di:?}");
    assert_eq!(di["second_repl_offset"], mi["second_repl_offset"], "{di:?}");
}
