//! `compare`: every transport, same machine, same payloads, one run.
//!
//! ```text
//! compare [--quick] [--out DIR] [--rows NAME,NAME] [--only bulk,rtt,handshakes,image]
//!         [--repeats N] [--bulk-bytes N] [--rtt-iters N] [--handshakes N] [--image-bytes N]
//!         [--image-node-args 'ARGS']
//! ```
//! The `image` workload ([`quic_rdma_benches::image`]) runs only
//! when named in `--only`: it needs docker-registry and curl installed and `qr`
//! built next to `compare` (`cargo build --release -p quic-rdma-tools`).
//! Writes `compare.json`, `compare.md` and `compare.svg` into DIR
//! (default `benches/results/compare/`, where the full run of
//! benches/RESULTS.md lives). Exits non-zero if any cell failed or any bulk
//! transfer's sha256 did not match.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use quic_rdma_benches::affinity::Placement;
use quic_rdma_benches::image::{ImageBench, ImageRepeat, ImageReport};
use quic_rdma_benches::peer::run_standalone;
use quic_rdma_benches::procs;
use quic_rdma_benches::report::{
    BulkReport, HandshakeReport, Machine, Params, Report, RowReport, RttReport, RttRun, SCHEMA,
};
use quic_rdma_benches::rows::{all_rows, BulkOutcome, BulkParams, Workload};
use quic_rdma_benches::tls::Tls;

struct Args {
    quick: bool,
    out: PathBuf,
    rows: Option<Vec<String>>,
    params: Params,
    /// Workloads to run (`bulk`, `rtt`, `handshakes`, `image`); all but
    /// `image` by default.
    work: Vec<String>,
    /// Blob size of the image workload.
    image_bytes: u64,
    /// Extra arguments of the image workload's node agents.
    image_node_args: Vec<String>,
    /// Hidden: run one side of a bulk transfer in this process (see `procs`).
    side: Option<SideArgs>,
}

/// `--side ROLE --row NAME --work WORK --cpu K [--addr IP:PORT]`, set by
/// `procs::*_in_processes`.
#[derive(Default)]
struct SideArgs {
    role: String,
    /// `bulk` (the default), `rtt` or `handshakes`.
    work: String,
    row: String,
    cpu: usize,
    addr: Option<std::net::SocketAddr>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut quick = false;
    let mut out = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/results/compare"));
    let mut rows = None;
    let mut work: Vec<String> = ["bulk", "rtt", "handshakes"].map(String::from).to_vec();
    let (mut repeats, mut bulk, mut rtt, mut hs, mut image) = (None, None, None, None, None);
    let mut image_node_args = vec![];
    let mut side: Option<SideArgs> = None;
    let mut it = quic_rdma_benches::cli::Words::from_env();
    while let Some(a) = it.next() {
        let mut val = || it.value(&a);
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = PathBuf::from(val()?),
            "--rows" => rows = Some(val()?.split(',').map(str::to_string).collect()),
            "--only" => {
                work = val()?.split(',').map(str::to_string).collect();
                if let Some(w) = work
                    .iter()
                    .find(|w| !["bulk", "rtt", "handshakes", "image"].contains(&w.as_str()))
                {
                    anyhow::bail!("--only takes bulk,rtt,handshakes,image; not {w}");
                }
            }
            "--side" => side.get_or_insert_with(SideArgs::default).role = val()?,
            "--row" => side.get_or_insert_with(SideArgs::default).row = val()?,
            "--work" => side.get_or_insert_with(SideArgs::default).work = val()?,
            "--cpu" => side.get_or_insert_with(SideArgs::default).cpu = val()?.parse()?,
            "--addr" => {
                side.get_or_insert_with(SideArgs::default).addr =
                    Some(procs::addr_from_str(&val()?)?)
            }
            "--repeats" => repeats = Some(val()?.parse()?),
            "--bulk-bytes" => bulk = Some(parse_size(&val()?)?),
            "--rtt-iters" => rtt = Some(val()?.parse()?),
            "--handshakes" => hs = Some(val()?.parse()?),
            "--image-bytes" => image = Some(parse_size(&val()?)?),
            "--image-node-args" => {
                image_node_args = val()?.split_whitespace().map(str::to_string).collect()
            }
            "-h" | "--help" => {
                println!("compare [--quick] [--out DIR] [--rows NAME,NAME] [--only bulk,rtt,handshakes,image] [--repeats N] [--bulk-bytes N[K|M|G]] [--rtt-iters N] [--handshakes N] [--image-bytes N[K|M|G]] [--image-node-args 'ARGS']");
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
        work,
        image_bytes: image.unwrap_or(if quick { 8 << 20 } else { 1 << 30 }),
        image_node_args,
        side,
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
    if let Some(side) = &args.side {
        let rows = all_rows();
        let row = rows
            .iter()
            .find(|r| r.name() == side.row)
            .ok_or_else(|| anyhow::anyhow!("--row {}: no such row", side.row))?;
        let work = match side.work.as_str() {
            "" | "bulk" => Workload::Bulk(BulkParams {
                bytes: p.bulk_bytes,
                verify: true,
            }),
            "rtt" => Workload::Rtt(p.rtt_iters),
            "handshakes" => Workload::Handshakes(p.handshakes),
            other => anyhow::bail!("--work takes bulk, rtt or handshakes; not {other}"),
        };
        return procs::side_main(&**row, &side.role, work, side.cpu, side.addr);
    }
    // The side processes of the two-process placement trust this certificate.
    let tls_file = std::env::temp_dir().join(format!("compare-tls-{}.bin", std::process::id()));
    Tls::new().export(&tls_file)?;
    let t0 = Instant::now();
    let started_unix = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let machine = Machine::probe();
    let others = quic_rdma_benches::cpu::OthersSpan::start();
    let mut latency = quic_rdma_benches::latency::Distributions::default();
    let run_any = |w: &str| args.work.iter().any(|x| x == w);
    let row_work = ["bulk", "rtt", "handshakes"].iter().any(|w| run_any(w));
    let rows: Vec<_> = all_rows()
        .into_iter()
        .filter(|r| {
            row_work
                && args
                    .rows
                    .as_ref()
                    .is_none_or(|want| want.contains(&r.name()))
        })
        .collect();
    anyhow::ensure!(!rows.is_empty() || run_any("image"), "no row selected");
    // The image workload's raw cell: the stack the agents use, two processes.
    let image_bench = if run_any("image") {
        let raw = all_rows()
            .into_iter()
            .find(|r| r.name() == IMAGE_RAW_ROW)
            .ok_or_else(|| anyhow::anyhow!("no row {IMAGE_RAW_ROW} in this build"))?;
        Some((
            ImageBench::start(args.image_bytes, args.image_node_args.clone())?,
            raw,
        ))
    } else {
        None
    };
    let mut image = ImageReport {
        bytes: args.image_bytes,
        raw_row: IMAGE_RAW_ROW.into(),
        runs: vec![],
        errors: vec![],
        cpus: quic_rdma_benches::affinity::allowed_cpus().len(),
    };
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
        bulk: Vec<BulkOutcome>,
        bulk_proc: Vec<BulkOutcome>,
        rtt: [Vec<RttRun>; 2],
        rtt_proc: Vec<RttRun>,
        hs: Vec<quic_rdma_benches::rows::HandshakeOutcome>,
        hs_proc: Vec<quic_rdma_benches::rows::HandshakeOutcome>,
        errors: Vec<String>,
    }
    let mut acc: Vec<Acc> = rows
        .iter()
        .map(|_| Acc {
            bulk: vec![],
            bulk_proc: vec![],
            rtt: [vec![], vec![]],
            rtt_proc: vec![],
            hs: vec![],
            hs_proc: vec![],
            errors: vec![],
        })
        .collect();
    let places = [Placement::SeparateCores, Placement::SameCore];
    let mut sa_acc: Vec<(Vec<BulkOutcome>, Vec<String>)> =
        STANDALONE.iter().map(|_| (vec![], vec![])).collect();
    // Repeats outermost: noise from the shared machine spreads over every row.
    for rep in 0..p.repeats {
        for (row, a) in rows.iter().zip(acc.iter_mut()) {
            let name = row.name();
            let bp = BulkParams {
                bytes: p.bulk_bytes,
                verify: true,
            };
            // A floor row (raw UD) runs the RTT workload only.
            let run = |w: &str| args.work.iter().any(|x| x == w) && (w == "rtt" || !row.rtt_only());
            let bulk = run("bulk").then(|| row.bulk(bp, Placement::SeparateCores));
            match bulk {
                None => {}
                Some(Ok(b)) => {
                    log_bulk(rep, &name, &b);
                    a.bulk.push(b);
                }
                Some(Err(e)) => a.errors.push(format!("bulk repeat {rep}: {e:#}")),
            }
            // The row's two-process run and the standalone pair that checks
            // it (if any) back to back, which one first alternating by repeat,
            // so drifting load on a shared machine hits both alike.
            let peer = STANDALONE
                .iter()
                .position(|(_, r, _)| *r == name)
                .filter(|_| run("bulk"));
            if let Some(k) = peer.filter(|_| rep % 2 == 1) {
                run_peer(rep, k, p.bulk_bytes, &mut sa_acc[k]);
            }
            if run("bulk") && row.crosses_processes() {
                match procs::bulk_in_processes(
                    &**row,
                    bp,
                    Placement::SeparateCores.cpus(),
                    &tls_file,
                ) {
                    Ok(b) => {
                        log_bulk(rep, &format!("{name} ×2proc"), &b);
                        a.bulk_proc.push(b);
                    }
                    Err(e) => a
                        .errors
                        .push(format!("bulk, two processes, repeat {rep}: {e:#}")),
                }
            }
            if let Some(k) = peer.filter(|_| rep % 2 == 0) {
                run_peer(rep, k, p.bulk_bytes, &mut sa_acc[k]);
            }
            for (k, place) in places.into_iter().enumerate().filter(|_| run("rtt")) {
                match row.rtt(p.rtt_iters, place) {
                    Ok(r) => {
                        latency.record(&name, place.label(), &r.samples_ns);
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
            if run("rtt") && row.crosses_processes() {
                let cpus = Placement::SeparateCores.cpus();
                match procs::rtt_in_processes(&**row, p.rtt_iters, cpus, &tls_file) {
                    Ok(r) => {
                        latency.record(&name, "processes", &r.samples_ns);
                        let run = RttRun::of(r.samples_ns);
                        eprintln!(
                            "[{rep}] {name:18} rtt  {:14} p50 {:8.1} p99 {:8.1} p99.9 {:8.1} µs",
                            "×2proc", run.p50_us, run.p99_us, run.p999_us
                        );
                        a.rtt_proc.push(run);
                    }
                    Err(e) => a
                        .errors
                        .push(format!("rtt, two processes, repeat {rep}: {e:#}")),
                }
            }
            let hs =
                run("handshakes").then(|| row.handshakes(p.handshakes, Placement::SeparateCores));
            match hs {
                None => {}
                Some(Ok(h)) => {
                    eprintln!(
                        "[{rep}] {name:18} handshakes {:8.0}/s",
                        h.count as f64 / h.secs
                    );
                    a.hs.push(h);
                }
                Some(Err(e)) => a.errors.push(format!("handshakes repeat {rep}: {e:#}")),
            }
            if run("handshakes") && row.crosses_processes() {
                let cpus = Placement::SeparateCores.cpus();
                match procs::handshakes_in_processes(&**row, p.handshakes, cpus, &tls_file) {
                    Ok(h) => {
                        eprintln!(
                            "[{rep}] {name:18} handshakes ×2proc {:8.0}/s",
                            h.count as f64 / h.secs
                        );
                        a.hs_proc.push(h);
                    }
                    Err(e) => a
                        .errors
                        .push(format!("handshakes, two processes, repeat {rep}: {e:#}")),
                }
            }
        }
        if let Some((b, raw)) = &image_bench {
            match b.repeat(&**raw, &tls_file) {
                Ok(r) => {
                    log_image(rep, &r, b.bytes());
                    image.runs.push(r);
                }
                Err(e) => image.errors.push(format!("image repeat {rep}: {e:#}")),
            }
        }
    }
    drop(image_bench);
    let _ = std::fs::remove_file(&tls_file);
    let reports = rows
        .iter()
        .zip(acc)
        .map(|(row, a)| {
            let [sep, same] = a.rtt;
            RowReport {
                name: row.name(),
                description: row.description(),
                bulk: BulkReport::of(a.bulk),
                bulk_processes: BulkReport::of(a.bulk_proc),
                rtt: [(places[0], sep), (places[1], same)]
                    .into_iter()
                    .filter_map(|(pl, runs)| RttReport::of(pl, runs))
                    .collect(),
                rtt_processes: RttReport::of(Placement::SeparateCores, a.rtt_proc),
                handshakes: HandshakeReport::of(a.hs),
                handshakes_processes: HandshakeReport::of(a.hs_proc),
                errors: a.errors,
            }
        })
        .collect();
    let mut machine = machine;
    machine.finish(&others);
    let mut report = Report {
        schema: SCHEMA.into(),
        quick: args.quick,
        started_unix,
        wall_s: t0.elapsed().as_secs_f64(),
        machine,
        params: p,
        rows: reports,
        standalone: STANDALONE
            .iter()
            .zip(sa_acc)
            .filter(|(_, (runs, errors))| !runs.is_empty() || !errors.is_empty())
            .map(|((bin, row, desc), (runs, errors))| RowReport {
                name: (*bin).into(),
                description: format!("{desc} (checks row {row})"),
                bulk: None,
                bulk_processes: BulkReport::of(runs),
                rtt: vec![],
                rtt_processes: None,
                handshakes: None,
                handshakes_processes: None,
                errors,
            })
            .collect(),
        image: run_any("image").then_some(image),
        targets: vec![],
    };
    report.judge(quic_rdma_benches::rows::SOFT_ROW);
    report.write(&args.out)?;
    if args.work.iter().any(|w| w == "rtt") {
        latency.write(&args.out, Placement::SeparateCores.label())?;
    }
    print!("{}", report.markdown());
    eprintln!("wrote {}", args.out.display());
    let failed: Vec<_> = report
        .rows
        .iter()
        .chain(&report.standalone)
        .filter(|r| {
            !r.errors.is_empty()
                || [&r.bulk, &r.bulk_processes]
                    .iter()
                    .any(|b| b.as_ref().is_some_and(|b| !b.sha256_ok))
        })
        .map(|r| r.name.clone())
        .collect();
    anyhow::ensure!(failed.is_empty(), "rows with failed cells: {failed:?}");
    if let Some(img) = &report.image {
        anyhow::ensure!(
            img.errors.is_empty() && img.runs.iter().all(|r| r.sha256_ok()),
            "the image workload failed or a sha256 did not match"
        );
    }
    Ok(())
}

/// The row the image workload's raw cell runs (quinn through the adapter over
/// `soft`, as the agents use it).
const IMAGE_RAW_ROW: &str = "quinn-adapter/soft";

fn log_image(rep: usize, r: &ImageRepeat, bytes: u64) {
    let m = |s: f64| bytes as f64 * 8.0 / s / 1e6;
    eprintln!(
        "[{rep}] image: direct {:.0}, raw {:.0}, cold {:.0}/{:.0}, warm {:.0}/{:.0} Mbit/s \
         (first/last byte); agents CPU registry {:.2}/{:.2} node {:.2}/{:.2} (to first byte {:.2}/{:.2}) s (cold/warm); sha256 {}",
        m(r.direct.total_s),
        r.raw.bytes as f64 * 8.0 / r.raw.secs / 1e6,
        m(r.cold.get.first_byte_s),
        m(r.cold.get.total_s),
        m(r.warm.get.first_byte_s),
        m(r.warm.get.total_s),
        r.cold.registry_agent_cpu.total_s(),
        r.warm.registry_agent_cpu.total_s(),
        r.cold.node_agent_cpu.total_s(),
        r.warm.node_agent_cpu.total_s(),
        r.cold.node_agent_cpu_first_byte.total_s(),
        r.warm.node_agent_cpu_first_byte.total_s(),
        if r.sha256_ok() { "ok" } else { "MISMATCH" }
    );
}

/// The standalone peers (binary, the row each checks, what it is), run as two
/// processes in every repeat when their row is selected, back to back with
/// that row's two-process bulk run.
const STANDALONE: [(&str, &str, &str); 2] = [
    (
        "peer-quinn-udp",
        "quinn/udp-4096",
        "standalone quinn 0.11 client/server processes over UDP, MTU 4096, same transport tuning as the rows",
    ),
    (
        "peer-tcp-rustls",
        "tcp+rustls",
        "standalone tokio-rustls client/server processes, TLS 1.3 AES-128-GCM, TCP_NODELAY",
    ),
];

/// Run standalone pair `k` of [`STANDALONE`] once (repeat `rep`), adding its
/// outcome or error to `acc`.
fn run_peer(rep: usize, k: usize, bytes: u64, acc: &mut (Vec<BulkOutcome>, Vec<String>)) {
    let bin = STANDALONE[k].0;
    // A fresh port each run (19700..19799 are this harness's).
    let port = 19700 + ((rep * STANDALONE.len() + k) % 100) as u16;
    let addr = std::net::SocketAddr::from(([127, 0, 130, 1], port));
    match run_standalone(bin, addr, bytes, Placement::SeparateCores.cpus()) {
        Ok(o) => {
            let b = BulkOutcome {
                bytes,
                secs: o.client.secs,
                sha256_ok: o.client.ok && o.server.ok,
                client_cpu: o.client.cpu,
                server_cpu: o.server.cpu,
            };
            log_bulk(rep, bin, &b);
            acc.0.push(b);
        }
        Err(e) => acc.1.push(format!("bulk repeat {rep}: {e:#}")),
    }
}

fn log_bulk(rep: usize, name: &str, b: &BulkOutcome) {
    eprintln!(
        "[{rep}] {name:24} bulk {:7.2} Gbit/s  cpu c/s {:.2}/{:.2} s  sha256 {}",
        b.bytes as f64 * 8.0 / b.secs / 1e9,
        b.client_cpu.total_s(),
        b.server_cpu.total_s(),
        if b.sha256_ok { "ok" } else { "MISMATCH" }
    );
}
