//! `soft` between separate processes on loopback addresses (127.0.0.x, each its
//! own GID): `qr demo --provider soft` (which runs `qr serve --once` as a child)
//! and `qr serve` + `qr connect` run by the test.

mod common;

use std::time::{Duration, Instant};

use common::{check_soft_report, json_of, qr, wait_for_file, Guard, TempDir};
use serde_json::Value;

#[test]
fn demo_soft_two_processes_256_mib_on_loopback() {
    let t = Instant::now();
    let out = qr()
        .args([
            "demo",
            "--provider",
            "soft",
            "--json",
            "--bytes",
            "256M",
            "--pings",
            "200",
            "--server-ip",
            "127.0.0.41",
            "--client-ip",
            "127.0.0.42",
            "--timeout",
            "300",
        ])
        .output()
        .unwrap();
    let r = json_of("qr demo --provider soft", &out);
    check_soft_report(&r, 256 << 20);
    assert_eq!(r["endpoints"]["server"]["gid"], "::ffff:127.0.0.41");
    assert_eq!(r["endpoints"]["client"]["gid"], "::ffff:127.0.0.42");
    assert_eq!(r["endpoints"]["server"]["udp_port"], 4791);
    assert_eq!(r["ping"]["count"], 200);
    // The server process reported its side: it received every byte.
    let s = &r["sockets"]["server"];
    assert!(s["recv_bytes"].as_u64().unwrap() >= 256 << 20, "{r:#}");
    assert_eq!(r["soft"]["server"]["rx_bad_icrc"], 0, "{r:#}");
    assert_eq!(r["soft"]["server"]["rx_decode_errors"], 0, "{r:#}");
    eprintln!(
        "256 MiB over soft between processes: {:.3} Gbit/s, test {:.1} s",
        r["transfer"]["gbit_per_s"].as_f64().unwrap(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn demo_soft_human_summary() {
    let out = qr()
        .args([
            "demo",
            "--provider",
            "soft",
            "--bytes",
            "1M",
            "--pings",
            "10",
            "--server-ip",
            "127.0.0.46",
            "--client-ip",
            "127.0.0.47",
        ])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{s}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "provider `soft`",
        "server ::ffff:127.0.0.46",
        "MATCH",
        "soft port (RoCEv2/UDP)",
        "rx bad ICRC",
    ] {
        assert!(s.contains(needle), "`{needle}` missing from:\n{s}");
    }
}

#[test]
fn serve_and_connect_verify_the_certificate() {
    let dir = TempDir::new("serve-connect");
    let (cert_a, cert_b) = (dir.path("a.pem"), dir.path("b.der"));
    // Server A keeps serving; B exists only to make a certificate A does not have.
    let a = Guard::spawn(
        qr().args(["serve", "--json", "--ip", "127.0.0.43", "--cert-out"])
            .arg(&cert_a),
    );
    let b = Guard::spawn(
        qr().args([
            "serve",
            "--ip",
            "127.0.0.45",
            "--service-port",
            "18516",
            "--cert-out",
        ])
        .arg(&cert_b),
    );
    wait_for_file(&cert_a, Duration::from_secs(10));
    wait_for_file(&cert_b, Duration::from_secs(10));
    drop(b);
    assert!(std::fs::read_to_string(&cert_a)
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));

    // The wrong certificate: the handshake fails, nothing is transferred.
    let out = qr()
        .args([
            "connect",
            "127.0.0.43:18515",
            "--ip",
            "127.0.0.44",
            "--bytes",
            "1M",
            "--cert",
        ])
        .arg(&cert_b)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("handshake") && err.to_lowercase().contains("certificate"),
        "{err}"
    );

    // The right one (PEM): the workload runs.
    let out = qr()
        .args([
            "connect",
            "127.0.0.43:18515",
            "--ip",
            "127.0.0.44",
            "--bytes",
            "16M",
            "--pings",
            "100",
            "--json",
            "--cert",
        ])
        .arg(&cert_a)
        .output()
        .unwrap();
    let r = json_of("qr connect", &out);
    check_soft_report(&r, 16 << 20);
    assert_eq!(r["tls"]["server_name"], "127.0.0.43");
    assert_eq!(r["sockets"]["server"], Value::Null);

    // The server printed one line per connection: the refused one, then ours.
    std::thread::sleep(Duration::from_millis(300));
    let out = a.kill_output();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ok: Vec<&Value> = lines.iter().filter(|l| l["ok"] == true).collect();
    assert_eq!(ok.len(), 1, "{lines:#?}");
    assert_eq!(ok[0]["bytes_received"], 16u64 << 20);
    assert_eq!(ok[0]["sha256_received"], r["transfer"]["sha256_sent"]);
    assert_eq!(ok[0]["client"]["gid"], "::ffff:127.0.0.44");
}

#[test]
fn sim_is_not_a_multi_process_provider() {
    let dir = TempDir::new("sim-serve");
    let out = qr()
        .args([
            "serve",
            "--provider",
            "sim",
            "--ip",
            "127.0.0.48",
            "--cert-out",
        ])
        .arg(dir.path("cert.der"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in-process"));
}
