//! `qr demo` end to end: runs the built binary and checks its JSON report.

use std::process::{Command, Output};

use serde_json::Value;

fn qr(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qr"))
        .args(args)
        .output()
        .expect("qr runs")
}

/// Run `qr demo --json <args>`, require success, return the report.
fn demo_json(extra: &[&str]) -> Value {
    let mut args = vec!["demo", "--json", "--bytes", "8M", "--pings", "500"];
    args.extend_from_slice(extra);
    let out = qr(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "qr {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

fn check_common(r: &Value) {
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["transfer"]["sha256_match"], true, "{r:#}");
    assert_eq!(
        r["transfer"]["sha256_sent"],
        r["transfer"]["sha256_received"]
    );
    assert_eq!(r["transfer"]["bytes"], 8u64 << 20);
    assert_eq!(r["transfer"]["bytes_received"], 8u64 << 20);
    assert_eq!(r["mtu"], 4096);
    assert_eq!(r["provider"], "sim");
    assert_eq!(r["tls"]["version"], "TLSv1.3");
    assert_eq!(r["tls"]["certificate_verified"], true);
    assert_eq!(r["ping"]["count"], 500);
    assert!(r["ping"]["rtt_us"]["p50"].as_f64().unwrap() > 0.0);
    assert!(r["sockets"]["client"]["sent_wrs"].as_u64().unwrap() > 0);
    assert!(r["sockets"]["server"]["recv_wrs"].as_u64().unwrap() > 0);
    assert_eq!(r["sockets"]["client"]["mtu_refusals"], 0);
}

#[test]
fn demo_on_ideal_sim() {
    let r = demo_json(&[]);
    check_common(&r);
    assert_eq!(r["fabric"]["lost"], 0);
}

#[test]
fn demo_with_one_percent_loss() {
    let r = demo_json(&["--loss", "1", "--seed", "7"]);
    check_common(&r);
    assert!(r["fabric"]["lost"].as_u64().unwrap() > 0, "{r:#}");
    assert_eq!(r["loss_percent"], 1.0);
}

/// The report names the suite the handshake negotiated, whichever the
/// endpoints prefer (`QR_TLS_CIPHERS`).
#[test]
fn demo_reports_the_negotiated_suite() {
    for (pref, suite) in [
        ("aes128", "TLS13_AES_128_GCM_SHA256"),
        ("aes256", "TLS13_AES_256_GCM_SHA384"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_qr"))
            .args(["demo", "--json", "--bytes", "1M", "--pings", "10"])
            .env("QR_TLS_CIPHERS", pref)
            .output()
            .expect("qr runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{pref}: {stdout}");
        let r: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(r["tls"]["cipher_suite"], suite, "{pref}: {r:#}");
        assert_eq!(r["tls"]["version"], "TLSv1.3");
    }
}

#[test]
fn human_summary_names_the_essentials() {
    let out = qr(&["demo", "--bytes", "1M", "--pings", "10"]);
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "MATCH",
        "Gbit/s",
        "p999",
        "path MTU      4096",
        "WRs per post",
    ] {
        assert!(s.contains(needle), "`{needle}` missing from:\n{s}");
    }
}

#[cfg(not(feature = "verbs"))]
#[test]
fn providers_not_built_in_exit_2_with_a_message() {
    let out = qr(&["demo", "--provider", "verbs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("verbs") && err.contains("not built into this version"),
        "{err}"
    );
}

#[cfg(feature = "verbs")]
#[test]
fn demo_verbs_points_to_serve_and_connect() {
    let out = qr(&["demo", "--provider", "verbs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("qr serve --provider verbs"), "{err}");
}

#[test]
fn soft_demo_refuses_sim_only_options() {
    let out = qr(&["demo", "--provider", "soft", "--loss", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sim"));
}
