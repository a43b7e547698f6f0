//! `compare --quick` runs and writes well-formed outputs: the JSON parses into
//! the report schema with every row, every cell present, every bulk transfer's
//! sha256 matched (threads, two processes, and the standalone peers); the
//! Markdown and SVG are there. No timing is asserted.

use std::process::Command;

use quic_rdma_benches::report::{Report, SCHEMA};

#[test]
fn compare_quick_writes_a_complete_report() {
    let out = std::env::temp_dir().join(format!("compare-quick-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--quick", "--out"])
        .arg(&out)
        .status()
        .expect("run compare");
    assert!(status.success(), "compare --quick failed: {status}");

    let json = std::fs::read_to_string(out.join("compare.json")).expect("compare.json");
    let raw: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    for key in ["schema", "quick", "machine", "params", "rows", "targets"] {
        assert!(raw.get(key).is_some(), "JSON lacks {key}");
    }
    let r: Report = serde_json::from_value(raw).expect("JSON matches the report schema");
    assert_eq!(r.schema, SCHEMA);
    assert!(r.quick);
    assert!(r.params.repeats >= 3);
    let names: Vec<&str> = r.rows.iter().map(|x| x.name.as_str()).collect();
    for want in [
        "engine/sim",
        "quinn-adapter/sim",
        "quinn-proto/ideal",
        "engine/soft",
        "quinn-adapter/soft",
        "engine/soft-1024",
        "quinn-adapter/soft-1024",
        "quinn/udp",
        "quinn/udp-4096",
        "tcp+rustls",
        "tcp",
        "raw-ud/sim",
        "raw-ud/soft",
        "quinn/udp-4096+spin",
        "tcp+rustls+spin",
        "tcp+spin",
    ] {
        assert!(names.contains(&want), "row {want} missing from {names:?}");
    }
    let crosses: std::collections::HashMap<String, bool> = quic_rdma_benches::rows::all_rows()
        .iter()
        .map(|x| (x.name(), x.crosses_processes()))
        .collect();
    let rtt_only: std::collections::HashMap<String, bool> = quic_rdma_benches::rows::all_rows()
        .iter()
        .map(|x| (x.name(), x.rtt_only()))
        .collect();
    for row in &r.rows {
        assert!(row.errors.is_empty(), "{}: {:?}", row.name, row.errors);
        if rtt_only[row.name.as_str()] {
            // The latency floor and the busy-polled peers: RTT at both
            // placements (and as two processes where they cross), nothing else.
            assert!(
                row.bulk.is_none() && row.handshakes.is_none(),
                "{}",
                row.name
            );
            assert_eq!(row.rtt.len(), 2, "{}: both placements", row.name);
            assert_eq!(
                row.rtt_processes.is_some(),
                crosses[row.name.as_str()],
                "{}",
                row.name
            );
            for x in row.rtt.iter().chain(&row.rtt_processes) {
                assert_eq!(x.runs.len(), r.params.repeats, "{}", row.name);
                assert!(x.runs.iter().all(|run| run.iters == r.params.rtt_iters));
            }
            continue;
        }
        let bulk = row
            .bulk
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no bulk", row.name));
        assert_eq!(bulk.runs.len(), r.params.repeats, "{}", row.name);
        for run in &bulk.runs {
            assert!(run.sha256_ok, "{}: sha256 mismatch", row.name);
            assert_eq!(run.bytes, r.params.bulk_bytes);
            assert!(run.secs > 0.0);
        }
        assert!(bulk.sha256_ok);
        assert!(bulk.gbit_s.min <= bulk.gbit_s.median && bulk.gbit_s.median <= bulk.gbit_s.max);
        // Every row whose fabric can cross processes also ran as two processes.
        let in_process_only = !crosses[row.name.as_str()];
        match &row.bulk_processes {
            Some(b) => {
                assert!(!in_process_only, "{}: cannot cross processes", row.name);
                assert_eq!(b.runs.len(), r.params.repeats, "{}", row.name);
                assert!(b.sha256_ok, "{}: two-process sha256", row.name);
                assert!(b.runs.iter().all(|x| x.client_cpu.total_s() > 0.0));
            }
            None => assert!(in_process_only, "{}: no two-process bulk", row.name),
        }
        assert_eq!(row.rtt.len(), 2, "{}: both placements", row.name);
        // The same rows ran RTT and handshakes as two processes too.
        assert_eq!(
            row.rtt_processes.is_some(),
            !in_process_only,
            "{}: RTT as two processes",
            row.name
        );
        assert_eq!(
            row.handshakes_processes.is_some(),
            !in_process_only,
            "{}: handshakes as two processes",
            row.name
        );
        for x in row.rtt.iter().chain(&row.rtt_processes) {
            assert_eq!(x.runs.len(), r.params.repeats);
            for run in &x.runs {
                assert_eq!(run.iters, r.params.rtt_iters);
                assert!(run.p50_us <= run.p99_us && run.p99_us <= run.p999_us);
            }
        }
        let hs = row
            .handshakes
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no handshakes", row.name));
        for hs in std::iter::once(hs).chain(&row.handshakes_processes) {
            assert_eq!(hs.runs.len(), r.params.repeats);
            assert!(hs
                .runs
                .iter()
                .all(|h| h.count == r.params.handshakes as u64 && h.secs > 0.0));
        }
    }
    // The standalone peers ran in the same repeats, verified.
    let sa: Vec<&str> = r.standalone.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(sa, ["peer-quinn-udp", "peer-tcp-rustls"]);
    for x in &r.standalone {
        assert!(x.errors.is_empty(), "{}: {:?}", x.name, x.errors);
        let b = x.bulk_processes.as_ref().expect("standalone bulk");
        assert_eq!(b.runs.len(), r.params.repeats);
        assert!(b.sha256_ok, "{}: sha256", x.name);
    }
    assert!(!r.targets.is_empty());

    let md = std::fs::read_to_string(out.join("compare.md")).expect("compare.md");
    assert!(md.contains("| row |"));
    for n in &names {
        assert!(md.contains(n), "markdown lacks {n}");
    }
    // The latency distributions: one HdrHistogram text per row and placement,
    // every sample counted, and the percentile plot.
    let hgrm = std::fs::read_to_string(out.join("latency").join("raw-ud_soft@separate_cores.hgrm"))
        .expect("raw-ud/soft's histogram");
    let total = r.params.rtt_iters * r.params.repeats;
    assert!(
        hgrm.contains(&format!("Total count    = {total:>12}")),
        "{hgrm}"
    );
    let plot = std::fs::read_to_string(out.join("latency.svg")).expect("latency.svg");
    assert!(plot.contains("raw-ud/soft") && plot.contains("<polyline"));
    let svg = std::fs::read_to_string(out.join("compare.svg")).expect("compare.svg");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), 1);
    let _ = std::fs::remove_dir_all(&out);
}
