//! Certificate rotation without a restart (issue 28, "Logs. Reloading"): an
//! upstream KV relay re-reads `--cert`/`--key`/`--ca` on SIGHUP. The test
//! rotates it from CA A to CA B while a downstream relay holds a live
//! session: that session goes on (no reconnect, later writes still reach its
//! replica), a downstream relay that trusts only CA B — refused before the
//! rotation — now syncs, and `/metrics` shows the reload and the new
//! certificate's expiry. Broken files on a second SIGHUP are refused and
//! counted, and the relay keeps serving with the certificate it had. The
//! relay logs `--log-format json`: every line of its log parses as JSON.
//!
//! Addresses: 127.0.113.130..135, TCP ports 19370..19379.

mod kv_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kv_support::*;
use quic_rdma_tools::metric::sample;
use quic_rdma_tools::pki::Mtls;

const UP_IP: &str = "127.0.113.131";
const UP_METRICS: &str = "127.0.113.131:19372";

fn cert(dir: &Path, leaves: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qr"));
    cmd.arg("cert").arg("--dir").arg(dir);
    for l in leaves {
        cmd.args(["--leaf", l]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Copy `name`.pem and `name`-key.pem from `from` into `to` as `as_`, the
/// way an operator (or cert-manager) replaces files: write beside, rename.
fn install(from: &Path, name: &str, to: &Path, as_: &str) {
    for (src, dst) in [
        (format!("{name}.pem"), format!("{as_}.pem")),
        (format!("{name}-key.pem"), format!("{as_}-key.pem")),
    ] {
        let tmp = to.join(format!(".{dst}.new"));
        std::fs::copy(from.join(src), &tmp).unwrap();
        std::fs::rename(&tmp, to.join(dst)).unwrap();
    }
}

fn cas(to: &Path, from: &[&Path]) {
    let pem: String = from
        .iter()
        .map(|d| std::fs::read_to_string(d.join("ca.pem")).unwrap())
        .collect();
    std::fs::write(to.join(".ca.new"), pem).unwrap();
    std::fs::rename(to.join(".ca.new"), to.join("ca.pem")).unwrap();
}

fn hangup(p: &Proc) {
    let ok = Command::new("kill")
        .args(["-HUP", &p.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn metric(addr: &str, name: &str) -> f64 {
    let text = metrics(addr);
    sample(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

fn not_after(dir: &Path, name: &str) -> f64 {
    let m = Mtls::from_pem_files(
        &dir.join(format!("{name}.pem")),
        &dir.join(format!("{name}-key.pem")),
        &dir.join("ca.pem"),
    )
    .unwrap();
    m.not_after().duration_since(UNIX_EPOCH).unwrap().as_secs() as f64
}

#[test]
fn sighup_rotates_the_certificate_and_keeps_live_sessions() {
    let dir = TempDir::new("tls-reload");
    let master = Redis::start(&dir, "127.0.113.130", 19370, &[]);
    populate(&master, 2_000, 0);

    // Two CAs, each with an upstream leaf for the same address; A also
    // issues downstream 1's, B downstream 2's.
    let (a, b) = (dir.path("ca-a"), dir.path("ca-b"));
    cert(&a, &[&format!("up={UP_IP}"), "down=127.0.113.132"]);
    cert(&b, &[&format!("up={UP_IP}"), "down=127.0.113.133"]);
    // The upstream relay's files (what it rereads), starting on A.
    let live = dir.path("live");
    std::fs::create_dir_all(&live).unwrap();
    install(&a, "up", &live, "up");
    cas(&live, &[&a]);
    // Downstream 2 trusts only B.
    let only_b = dir.path("only-b");
    std::fs::create_dir_all(&only_b).unwrap();
    install(&b, "down", &only_b, "down");
    cas(&only_b, &[&b]);

    let json = ["--log-format", "json"];
    let up = upstream(&dir, &live, UP_IP, 19371, 19372, &master.addr(), &json);
    let upstream_service = format!("{UP_IP}:19371");
    let down1 = downstream(&dir, &a, "127.0.113.132", 19373, 19374, &upstream_service);
    let replica1 = Redis::start(
        &dir,
        "127.0.113.134",
        19378,
        &["--replicaof", "127.0.113.132", "19373"],
    );
    assert_same(&master, &replica1, 0, &[&up, &down1]);
    let expiry_a = not_after(&live, "up");
    assert_eq!(
        metric(
            UP_METRICS,
            "qr_tls_certificate_expiration_timestamp_seconds"
        ),
        expiry_a
    );
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    assert!(expiry_a > now.as_secs_f64());

    // Before the rotation downstream 2 is refused: its handshakes fail.
    let down2 = downstream(
        &dir,
        &only_b,
        "127.0.113.133",
        19375,
        19376,
        &upstream_service,
    );
    let replica2 = Redis::start(
        &dir,
        "127.0.113.135",
        19379,
        &["--replicaof", "127.0.113.133", "19375"],
    );
    assert!(
        wait_until(Duration::from_secs(20), || metric(
            "127.0.113.131:19372",
            "qr_kv_link_errors_total{role=\"upstream\"}"
        ) > 0.0),
        "downstream 2 was not refused before the rotation:\n{}\n{}",
        up.output(),
        down2.output()
    );
    assert_eq!(
        replica2.client().info("replication")["master_link_status"],
        "down"
    );

    // Rotate: B's certificate; trust both CAs (downstream 1 may redial).
    install(&b, "up", &live, "up");
    cas(&live, &[&a, &b]);
    let expiry_b = not_after(&live, "up");
    hangup(&up);
    assert!(
        wait_until(Duration::from_secs(10), || metric(
            UP_METRICS,
            "qr_tls_reloads_total"
        ) == 1.0),
        "no reload:\n{}",
        up.output()
    );
    assert_eq!(
        metric(
            UP_METRICS,
            "qr_tls_certificate_expiration_timestamp_seconds"
        ),
        expiry_b
    );
    assert!(up.output().contains("SIGHUP: reloaded"), "{}", up.output());

    // Downstream 2 gets in; downstream 1's session never broke.
    master.client().ok(&["SET", "after-rotation", "yes"]);
    assert_same(&master, &replica2, 0, &[&up, &down2]);
    assert_same(&master, &replica1, 0, &[&up, &down1]);
    assert_eq!(
        replica1.client().ok(&["GET", "after-rotation"]),
        "yes",
        "the live session lost a write"
    );
    assert_eq!(
        metric(
            "127.0.113.132:19374",
            "qr_kv_reconnects_total{role=\"downstream\"}"
        ),
        0.0,
        "downstream 1 reconnected: the rotation broke its session\n{}",
        down1.output()
    );
    assert_eq!(
        metric(UP_METRICS, "qr_kv_sync_full_total{role=\"upstream\"}"),
        2.0,
        "one full sync per downstream relay, none again for downstream 1"
    );

    // A key that is not the certificate's: refused, counted, the relay
    // goes on with B.
    std::fs::copy(a.join("up-key.pem"), live.join("up-key.pem")).unwrap();
    hangup(&up);
    assert!(
        wait_until(Duration::from_secs(10), || metric(
            UP_METRICS,
            "qr_tls_reload_failures_total"
        ) == 1.0),
        "the broken files were not refused:\n{}",
        up.output()
    );
    assert!(
        up.output().contains("kept the certificate in use"),
        "{}",
        up.output()
    );
    assert_eq!(metric(UP_METRICS, "qr_tls_reloads_total"), 1.0);
    assert_eq!(
        metric(
            UP_METRICS,
            "qr_tls_certificate_expiration_timestamp_seconds"
        ),
        expiry_b
    );
    master.client().ok(&["SET", "after-refusal", "still"]);
    assert_same(&master, &replica1, 0, &[&up, &down1]);
    assert_same(&master, &replica2, 0, &[&up, &down2]);

    // Its log (`--log-format json`) is JSON lines only, one per event, the
    // reloads and the syncs among them with their level, target and fields.
    let events: Vec<serde_json::Value> = up
        .output()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let has = |level: &str, target: &str, text: &str| {
        events.iter().any(|v| {
            v["level"] == level
                && v["target"] == target
                && v["timestamp"].is_string()
                && v["message"].as_str().is_some_and(|m| m.contains(text))
        })
    };
    assert!(has("INFO", "qr::tls", "SIGHUP: reloaded"), "{events:#?}");
    assert!(
        has("ERROR", "qr::tls", "kept the certificate in use"),
        "{events:#?}"
    );
    assert!(
        has("INFO", "qr::kv", "full resync from the master"),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .filter(|v| v["target"] == "qr::kv")
            .all(|v| v["role"] == "upstream"),
        "{events:#?}"
    );
}
