//! `compare --quick --only image` (the image workload, 8 MiB) runs in
//! the test command: docker-registry (started by the workload itself), a
//! `qr registry-agent` and `qr node-agent` as processes of their own over
//! `soft`, the raw QUIC transfer and the direct HTTPS GET, every repeat's four
//! cells sha256-checked. The JSON must parse into the report schema with the
//! image section complete; the Markdown must carry its table. No timing is
//! asserted, only that each cell measured something.
//!
//! Addresses: the image workload's own block (127.0.140.x, ports
//! 19900–19949, `benches/src/image.rs`); the raw cell is the
//! `quinn-adapter/soft` row in two processes, as in `compare_quick.rs`,
//! which is another test binary (cargo runs test binaries one at a time).

use std::path::PathBuf;
use std::process::Command;

use quic_rdma_benches::report::{Report, SCHEMA};

/// Whether `prog` is on `PATH`.
fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(prog).is_file()))
}

/// The `qr` binary the workload runs: `$QR`, else next to `compare`.
fn qr() -> PathBuf {
    if let Some(p) = std::env::var_os("QR") {
        return PathBuf::from(p);
    }
    let compare = PathBuf::from(env!("CARGO_BIN_EXE_compare"));
    let qr = compare.with_file_name("qr");
    assert!(
        qr.is_file(),
        "{} is missing: the image workload runs `qr` as its agents; build it first with \
         `cargo build --release -p quic-rdma-tools` (or set QR=/path/to/qr)",
        qr.display()
    );
    qr
}

#[test]
fn compare_quick_image_row_runs_and_verifies() {
    for (prog, pkg) in [("docker-registry", "docker-registry"), ("curl", "curl")] {
        assert!(
            have(prog),
            "{prog} is not installed: the image workload needs it (apt-get install {pkg}; \
             .ci/run installs it)"
        );
    }
    let qr = qr();
    let out = std::env::temp_dir().join(format!("compare-image-quick-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--quick", "--only", "image", "--out"])
        .arg(&out)
        .env("QR", &qr)
        .status()
        .expect("run compare");
    // compare exits non-zero if any repeat failed or a sha256 did not match.
    assert!(
        status.success(),
        "compare --quick --only image failed: {status}"
    );

    let json = std::fs::read_to_string(out.join("compare.json")).expect("compare.json");
    let r: Report = serde_json::from_str(&json).expect("JSON matches the report schema");
    assert_eq!(r.schema, SCHEMA);
    assert!(r.quick);
    assert!(r.rows.is_empty(), "--only image runs no bulk/rtt rows");
    let img = r.image.as_ref().expect("the report has an image section");
    assert_eq!(img.bytes, 8 << 20, "--quick uses an 8 MiB blob");
    assert_eq!(img.raw_row, "quinn-adapter/soft");
    assert!(img.errors.is_empty(), "{:?}", img.errors);
    assert_eq!(img.runs.len(), r.params.repeats);
    for (i, run) in img.runs.iter().enumerate() {
        assert!(run.sha256_ok(), "repeat {i}: a sha256 did not match");
        assert_eq!(run.raw.bytes, img.bytes, "repeat {i}: raw cell size");
        assert!(run.raw.secs > 0.0);
        for (name, get) in [
            ("direct", run.direct),
            ("cold", run.cold.get),
            ("warm", run.warm.get),
        ] {
            assert!(
                get.first_byte_s > 0.0 && get.first_byte_s <= get.total_s,
                "repeat {i} {name}: curl timings {get:?}"
            );
            // curl's own CPU, from getrusage of the reaped child.
            assert!(get.curl_cpu.total_s() > 0.0, "repeat {i} {name}: curl CPU");
        }
        // The CPU-bound ceilings come from every path's measured CPU. Which
        // path costs more is the benchmark's finding at full size, not
        // asserted here: the agents' CPU is read from /proc in clock ticks
        // (10 ms), too coarse to order paths of ~70 ms at 8 MiB (one CI run
        // measured cold and warm within 10 µs of each other).
        let cpu = run.path_cpu_per_gib(img.bytes);
        assert!(
            cpu.iter().all(|c| c.is_finite() && *c > 0.0),
            "repeat {i}: every path's CPU measured: {cpu:?}"
        );
        for c in run.cpu_ceiling(img.bytes, img.cpus) {
            assert!(c.is_finite() && c > 0.0, "repeat {i}: ceiling {c}");
        }
        // The agents did the work as processes of their own.
        for (name, a) in [("cold", &run.cold), ("warm", &run.warm)] {
            assert!(
                a.node_agent_cpu.total_s() > 0.0,
                "repeat {i} {name}: node agent CPU"
            );
            assert!(
                a.node_agent_cpu_first_byte.total_s() <= a.node_agent_cpu.total_s() + 1e-9,
                "repeat {i} {name}: CPU to first byte above the whole GET's"
            );
        }
        assert!(
            run.cold.registry_agent_cpu.total_s() > 0.0,
            "repeat {i}: the cold registry agent pulled through"
        );
    }
    assert_eq!(img.ratios().len(), img.runs.len());
    assert!(img
        .median(|r, _| r.direct.total_s / r.warm.get.total_s)
        .is_some_and(|x| x > 0.0));
    assert!(img.cpus >= 1);
    // The image throughput goals carry their CPU-bound ceiling.
    for goal in ["agents cold (last byte)", "agents warm (last byte)"] {
        assert!(
            r.targets
                .iter()
                .any(|t| t.name.contains(goal) && t.ceiling.is_some()),
            "{goal}: no ceiling in {:?}",
            r.targets
        );
    }
    // The judged goals are in the report, each with a measurement.
    for goal in ["÷ direct HTTPS GET", "time to first byte"] {
        assert!(
            r.targets
                .iter()
                .any(|t| t.name.contains(goal) && t.measured.is_some()),
            "{goal}: {:?}",
            r.targets
        );
    }

    let md = std::fs::read_to_string(out.join("compare.md")).expect("compare.md");
    assert!(md.contains("## Image layers: 8 MiB blob"), "{md}");
    assert!(md.contains("| median |"));
    assert!(!md.contains("MISMATCH"));
    let _ = std::fs::remove_dir_all(&out);
}
