//! `compare`: every transport, same machine, same payloads, one run.
//!
//! ```text
//! compare [--quick] [--out DIR] [--rows NAME,NAME] [--repeats N]
//!         [--bulk-bytes N] [--rtt-iters N] [--handshakes N]
//! ```
//! Writes `compare.json`, `compare.md` and `compare.svg` into DIR
//! (default `benches/results/`). Exits non-zero if any cell failed or any bulk
//! transfer's sha256 did not match.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use quic_rdma_benches::affinity::Placement;
use quic_rdma_benches::report::{
    load_avg, BulkReport, HandshakeReport, Machine, Params, Report, RowReport, RttReport, RttRun,
    SCHEMA,
};
use quic_rdma_benches::rows::{all_rows, BulkParams};

struct Args {
    quick: bool,
    out: PathBuf,
    rows: Option<Vec<String>>,
    params: Params,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut quick = false;
    let mut out = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/results"));
    let mut rows = None;
    let (mut repeats, mut bulk, mut rtt, mut hs) = (None, None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = PathBuf::from(val()?),
            "--rows" => rows = Some(val()?.split(',').map(str::to_string).collect()),
            "--repeats" => repeats = Some(val()?.parse()?),
            "--bulk-bytes" => bulk = Some(parse_size(&val()?)?),
            "--rtt-iters" => rtt = Some(val()?.parse()?),
            "--handshakes" => hs = Some(val()?.parse()?),
            "-h" | "--help" => {
                println!("compare [--quick] [--out DIR] [--rows NAME,NAME] [--repeats N] [--bulk-bytes N[K|M|G]] [--rtt-iters N] [--handshakes N]");
                std::process::exit(0);
            }
            // `cargo bench` passes --bench to every bench target's binary.
            "--bench" => {}
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let params = Params {
        bulk_bytes: bulk.unwrap_or(if quick { 32 << 20 } else { 1 << 30 }),
        rtt_iters: rtt.unwrap_or(if quick { 2_000 } else { 100_000 }),
        handshakes: hs.unwrap_or(if quick { 20 } else { 1_000 }),
        repeats: repeats.unwrap_or(3),
    };
    Ok(Args {
        quick,
        out,
        rows,
        params,
    })
}

/// `123`, `64K`, `64M`, `1G` (binary units).
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    Ok(num.parse::<u64>()? << shift)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let p = args.params;
    let t0 = Instant::now();
    let started_unix = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let machine = Machine::probe();
    let rows: Vec<_> = all_rows()
        .into_iter()
        .filter(|r| {
            args.rows
                .as_ref()
                .is_none_or(|want| want.contains(&r.name()))
        })
        .collect();
    anyhow::ensure!(!rows.is_empty(), "no row selected");
    eprintln!(
        "compare: {} rows, {} repeats, bulk {} MiB, rtt {} iters, {} handshakes; load {:?}",
        rows.len(),
        p.repeats,
        p.bulk_bytes >> 20,
        p.rtt_iters,
        p.handshakes,
        machine.load_before
    );
    struct Acc {
        bulk: Vec<quic_rdma_benches::rows::BulkOutcome>,
        rtt: [Vec<RttRun>; 2],
        hs: Vec<quic_rdma_benches::rows::HandshakeOutcome>,
        errors: Vec<String>,
    }
    let mut acc: Vec<Acc> = rows
        .iter()
        .map(|_| Acc {
            bulk: vec![],
            rtt: [vec![], vec![]],
            hs: vec![],
            errors: vec![],
        })
        .collect();
    let places = [Placement::SeparateCores, Placement::SameCore];
    // Repeats outermost: noise from the shared machine spreads over every row.
    for rep in 0..p.repeats {
        for (row, a) in rows.iter().zip(acc.iter_mut()) {
            let name = row.name();
            let bp = BulkParams {
                bytes: p.bulk_bytes,
                verify: true,
            };
            match row.bulk(bp, Placement::SeparateCores) {
                Ok(b) => {
                    eprintln!(
                        "[{rep}] {name:18} bulk {:7.2} Gbit/s  cpu c/s {:.2}/{:.2} s  sha256 {}",
                        b.bytes as f64 * 8.0 / b.secs / 1e9,
                        b.client_cpu.total_s(),
                        b.server_cpu.total_s(),
                        if b.sha256_ok { "ok" } else { "MISMATCH" }
                    );
                    a.bulk.push(b);
                }
                Err(e) => a.errors.push(format!("bulk repeat {rep}: {e:#}")),
            }
            for (k, place) in places.into_iter().enumerate() {
                match row.rtt(p.rtt_iters, place) {
                    Ok(r) => {
                        let run = RttRun::of(r.samples_ns);
                        eprintln!(
                            "[{rep}] {name:18} rtt  {:14} p50 {:8.1} p99 {:8.1} p99.9 {:8.1} µs",
                            place.label(),
                            run.p50_us,
                            run.p99_us,
                            run.p999_us
                        );
                        a.rtt[k].push(run);
                    }
                    Err(e) => a
                        .errors
                        .push(format!("rtt {} repeat {rep}: {e:#}", place.label())),
                }
            }
            match row.handshakes(p.handshakes, Placement::SeparateCores) {
                Ok(h) => {
                    eprintln!(
                        "[{rep}] {name:18} handshakes {:8.0}/s",
                        h.count as f64 / h.secs
                    );
                    a.hs.push(h);
                }
                Err(e) => a.errors.push(format!("handshakes repeat {rep}: {e:#}")),
            }
        }
    }
    let reports = rows
        .iter()
        .zip(acc)
        .map(|(row, a)| {
            let [sep, same] = a.rtt;
            RowReport {
                name: row.name(),
                description: row.description(),
                bulk: BulkReport::of(a.bulk),
                rtt: [(places[0], sep), (places[1], same)]
                    .into_iter()
                    .filter_map(|(pl, runs)| RttReport::of(pl, runs))
                    .collect(),
                handshakes: HandshakeReport::of(a.hs),
                errors: a.errors,
            }
        })
        .collect();
    let mut machine = machine;
    machine.load_after = load_avg();
    let mut report = Report {
        schema: SCHEMA.into(),
        quick: args.quick,
        started_unix,
        wall_s: t0.elapsed().as_secs_f64(),
        machine,
        params: p,
        rows: reports,
        targets: vec![],
    };
    report.judge(quic_rdma_benches::rows::SOFT_ROW);
    report.write(&args.out)?;
    print!("{}", report.markdown());
    eprintln!("wrote {}", args.out.display());
    let failed: Vec<_> = report
        .rows
        .iter()
        .filter(|r| !r.errors.is_empty() || r.bulk.as_ref().is_some_and(|b| !b.sha256_ok))
        .map(|r| r.name.clone())
        .collect();
    anyhow::ensure!(failed.is_empty(), "rows with failed cells: {failed:?}");
    Ok(())
}
