//! Issue 25, item 5: a relay stopped with SIGTERM (what systemd, Kubernetes
//! and `kill` send) closes its QUIC connections before it exits, so the
//! other relay ends the session at once instead of after its idle timeout
//! (5 s here); the process exits 0. Data is checked first (DEBUG DIGEST) so
//! the session is a live one.
//!
//! Addresses: 127.0.113.120..123, TCP ports 19360..19366.

mod kv_support;

use std::process::Command;
use std::time::{Duration, Instant};

use kv_support::*;

#[test]
fn a_downstream_relay_stopped_with_sigterm_closes_its_session_at_once() {
    let dir = TempDir::new("kv-stop");
    let master = Redis::start(&dir, "127.0.113.120", 19360, &[]);
    populate(&master, 2_000, 0);
    let pki = pki(&dir, "127.0.113.121", "127.0.113.122");
    let up = upstream(
        &dir,
        &pki,
        "127.0.113.121",
        19361,
        19362,
        &master.addr(),
        &[],
    );
    let mut down = downstream(
        &dir,
        &pki,
        "127.0.113.122",
        19363,
        19364,
        "127.0.113.121:19361",
    );
    let replica = Redis::start(
        &dir,
        "127.0.113.123",
        19366,
        &["--replicaof", "127.0.113.122", "19363"],
    );
    assert_same(&master, &replica, 0, &[&up, &down]);
    let sessions = || {
        status("127.0.113.121:19362")["replicas"]
            .as_object()
            .map_or(0, |m| m.len())
    };
    assert_eq!(sessions(), 1, "{}", up.output());

    let stopped = Instant::now();
    let ok = Command::new("kill")
        .args(["-TERM", &down.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    assert!(
        wait_until(Duration::from_secs(5), || !down.alive()),
        "the downstream relay did not exit on SIGTERM:\n{}",
        down.output()
    );
    assert_eq!(down.exit_code(), Some(0), "{}", down.output());
    // The upstream relay hears the close, well before its 5 s idle timeout.
    assert!(
        wait_until(Duration::from_secs(3), || sessions() == 0),
        "the upstream relay still holds the session {:?} after SIGTERM:\n{}",
        stopped.elapsed(),
        up.output()
    );
    assert!(
        down.output()
            .contains("SIGTERM: closing the link to the upstream relay"),
        "{}",
        down.output()
    );
}
