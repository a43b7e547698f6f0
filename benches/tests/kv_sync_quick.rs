//! `kv-sync --quick` on a small dataset runs in the test command: a real
//! Redis master, a direct replica and replicas behind `qr kv-relay upstream`
//! → `soft` → `qr kv-relay downstream`. It checks what the benchmark's
//! figures rest on, not its timings: every phase ends with the digests of
//! master and replicas equal (the binary fails otherwise), every cell was
//! measured, and a replica whose link is cut resumes by partial resync both
//! directly and through the relays.
//!
//! Addresses: the benchmark's own block (127.0.112.80..86, TCP ports
//! 19280..19299, `benches/src/bin/kv-sync.rs`).

use std::path::PathBuf;
use std::process::Command;

fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(prog).is_file()))
}

#[test]
fn kv_sync_quick_measures_every_phase_and_resumes_partially() {
    for prog in ["redis-server", "redis-benchmark"] {
        assert!(
            have(prog),
            "{prog} is not installed: kv-sync needs it (apt-get install redis-server \
             redis-tools; .ci/run installs them)"
        );
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kv-sync"));
    let qr = match std::env::var_os("QR") {
        Some(p) => PathBuf::from(p),
        None => bin.with_file_name("qr"),
    };
    assert!(
        qr.is_file(),
        "{} is missing: kv-sync runs `qr` as its relays; build it first with \
         `cargo build --release -p quic-rdma-tools` (or set QR=/path/to/qr)",
        qr.display()
    );
    let out = std::env::temp_dir().join(format!("kv-sync-quick-{}.json", std::process::id()));
    let status = Command::new(&bin)
        .args(["--gib", "0.02", "--repeats", "1", "--quick", "--out"])
        .arg(&out)
        .arg("--qr")
        .arg(&qr)
        .status()
        .expect("run kv-sync");
    assert!(status.success(), "kv-sync --quick failed: {status}");
    let text = std::fs::read_to_string(&out).expect("kv-sync wrote its JSON");
    let _ = std::fs::remove_file(&out);
    let r: serde_json::Value = serde_json::from_str(&text).expect("JSON");

    let f = &r["full_sync"];
    assert_eq!(f["digests_identical"], true);
    for cell in ["direct_tcp_s", "relay_soft_cold_s", "relay_soft_warm_s"] {
        let v = f[cell].as_array().unwrap_or_else(|| panic!("{cell}: {f}"));
        assert_eq!(v.len(), 1, "{cell}: one value per repeat");
        assert!(
            v.iter().all(|x| x.as_f64().is_some_and(|s| s > 0.0)),
            "{cell}: {v:?}"
        );
    }
    let c = &r["catch_up_after_burst"];
    let bursts = c["burst_bytes"].as_array().expect("burst_bytes");
    assert_eq!(bursts.len(), 3, "three bursts: {c}");
    // 120 values of 100 kB each, plus the protocol around them.
    assert!(
        bursts.iter().all(|b| b.as_f64().is_some_and(|n| n >= 12e6)),
        "{c}"
    );
    for side in ["direct_tcp_s", "relay_soft_s"] {
        assert_eq!(c[side].as_array().map(Vec::len), Some(3), "{side}: {c}");
    }
    let lag = &r["lag_under_load"];
    for side in ["direct_tcp", "relay_soft"] {
        assert!(
            lag[side]["samples"].as_u64().is_some_and(|n| n > 0),
            "{side}: {lag}"
        );
    }
    // Three cut links each: Redis resumes a direct replica partially, and a
    // replica behind the relays must resume the same way.
    let p = &r["partial_resync"];
    assert_eq!(p["links_cut"], 3);
    assert_eq!(p["direct_partial"].as_f64(), Some(3.0), "{p}");
    assert_eq!(p["relays_partial"].as_f64(), Some(3.0), "{p}");
    assert_eq!(p["direct_full"].as_f64(), Some(0.0), "{p}");
    assert_eq!(p["relays_full"].as_f64(), Some(0.0), "{p}");
}
