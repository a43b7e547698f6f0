//! Replicas authenticate to the downstream relay as to a Redis master
//! (`masterauth`): a stranger's `PSYNC ? -1` gets `-NOAUTH` and no
//! snapshot, a wrong password `-WRONGPASS` and a closed link, a real Redis
//! replica with the password syncs the whole dataset, one without it gets
//! nothing; an open relay on a non-loopback address is refused at start.
//! Addresses: 127.0.112.70..73, TCP ports 19270..19276.

mod kv_support;

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use kv_support::*;

/// Everything the relay sends on `c` until it closes the link (at most 10 s).
fn rest_of(mut c: Client) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    out
}

#[test]
fn replicas_must_authenticate_to_the_downstream_relay() {
    let dir = TempDir::new("kv-auth");
    let master = Redis::start(
        &dir,
        "127.0.112.70",
        19270,
        &["--repl-diskless-sync-delay", "0"],
    );
    populate(&master, 2_000, 0);
    let pki = pki(&dir, "127.0.112.71", "127.0.112.72");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.71",
        19271,
        19272,
        &master.addr(),
        &[],
    );
    let secret = dir.path("replica-password");
    std::fs::write(&secret, "s3cret-Pw\n").unwrap();
    let down = downstream_with(
        &dir,
        &pki,
        "127.0.112.72",
        19273,
        19274,
        "127.0.112.71:19271",
        &["--replica-password-file", secret.to_str().unwrap()],
    );
    let relay = "127.0.112.72:19273";

    // A stranger asks for the dataset: refused before any snapshot.
    let mut c = Client::connect(relay).unwrap();
    c.send(&[b"PSYNC", b"?", b"-1"]);
    let got = rest_of(c);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("-NOAUTH"), "{text}");
    assert!(!text.contains("FULLRESYNC"), "{text}");
    assert!(got.len() < 100, "{} bytes sent to a stranger", got.len());

    // A PING before AUTH is answered -NOAUTH (what a Redis replica expects
    // of a master with a password); a wrong password closes the link.
    let mut c = Client::connect(relay).unwrap();
    assert!(c.cmd(&["PING"]).text().starts_with("NOAUTH"));
    assert!(c.cmd(&["AUTH", "guess"]).text().starts_with("WRONGPASS"));
    assert!(rest_of(c).is_empty(), "the link stays open after WRONGPASS");

    // A real replica with the password syncs everything.
    let replica = Redis::start(
        &dir,
        "127.0.112.73",
        19275,
        &[
            "--replicaof",
            "127.0.112.72",
            "19273",
            "--masterauth",
            "s3cret-Pw",
        ],
    );
    assert_same(&master, &replica, 0, &[&up, &down]);

    // One without it gets nothing, and each attempt is counted.
    let bare = Redis::start(
        &dir,
        "127.0.112.73",
        19276,
        &["--replicaof", "127.0.112.72", "19273"],
    );
    assert!(
        wait_until(Duration::from_secs(20), || {
            status("127.0.112.72:19274")["auth_failures"].as_u64() >= Some(4)
        }),
        "{}",
        status("127.0.112.72:19274")
    );
    assert_ne!(
        bare.client()
            .info("replication")
            .get("master_link_status")
            .map(String::as_str),
        Some("up")
    );
    assert_eq!(bare.client().ok(&["DBSIZE"]), "0");
}

#[test]
fn an_open_relay_on_a_non_loopback_address_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_qr"))
        .args(["kv-relay", "downstream", "--ip", "127.0.112.72"])
        .args([
            "--upstream",
            "127.0.112.71:19271",
            "--listen",
            "0.0.0.0:19277",
        ])
        .args([
            "--cert",
            "/nonexistent",
            "--key",
            "/nonexistent",
            "--ca",
            "/nonexistent",
        ])
        .env_remove("QR_KV_REPLICA_PASSWORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--replica-password-file"), "{err}");
    assert!(err.contains("--allow-unauthenticated-replicas"), "{err}");
    // Nothing was listening.
    assert!(TcpStream::connect("127.0.0.1:19277").is_err());
}
