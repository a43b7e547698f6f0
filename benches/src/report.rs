//! What `compare` writes: a JSON file (the data), a Markdown table and an SVG plot.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::affinity::Placement;
use crate::cpu::load_avg;
use crate::rows::{BulkOutcome, HandshakeOutcome};
use crate::stats::{quantile, Spread, GIB};

/// Version tag of the JSON layout.
pub const SCHEMA: &str = "quic-rdma-benches/compare/v1";

/// A whole comparison run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: String,
    /// A `--quick` run (small sizes: checks the harness, not the numbers).
    pub quick: bool,
    /// Unix time the run started.
    pub started_unix: u64,
    /// Seconds the run took.
    pub wall_s: f64,
    /// Where it ran.
    pub machine: Machine,
    /// Workload sizes.
    pub params: Params,
    /// One entry per transport.
    pub rows: Vec<RowReport>,
    /// The standalone peer pairs (`peer-*` binaries), bulk in two processes only.
    #[serde(default)]
    pub standalone: Vec<RowReport>,
    /// The image workload (`--only image`), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::image::ImageReport>,
    /// The performance targets (ratios between rows, [`Report::judge`]),
    /// evaluated from this run.
    pub targets: Vec<Target>,
}

/// The machine and how busy it was.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// `uname -r`.
    pub kernel: String,
    /// 1/5/15-minute load averages when the run started.
    pub load_before: [f64; 3],
    /// ... and when it ended.
    pub load_after: [f64; 3],
    /// Share (0..=1) of the machine's CPU time other processes and the
    /// hypervisor took during the run ([`crate::cpu::OthersSpan`]).
    #[serde(default)]
    pub others_cpu_share: f64,
    /// The run is flagged noisy: `others_cpu_share` above [`NOISY_SHARE`].
    #[serde(default)]
    pub noisy: bool,
}

/// Above this share of the machine's CPU used by others, a run is noisy: its
/// figures (tails first) are upper bounds, not the transports' own.
pub const NOISY_SHARE: f64 = 0.05;

impl Machine {
    /// Record what others used during the run (`span` started with it).
    pub fn finish(&mut self, span: &crate::cpu::OthersSpan) {
        self.load_after = load_avg();
        self.others_cpu_share = span.share(self.cpus);
        self.noisy = self.others_cpu_share > NOISY_SHARE;
    }
}

impl Machine {
    /// Describe this machine now (`load_after` is filled in at the end).
    pub fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let load = load_avg();
        Machine {
            cpu_model,
            cpus: crate::affinity::allowed_cpus().len(),
            kernel,
            load_before: load,
            load_after: load,
            others_cpu_share: 0.0,
            noisy: false,
        }
    }
}

/// Workload sizes of a run.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Bytes per bulk transfer.
    pub bulk_bytes: u64,
    /// Sampled RTT iterations per cell.
    pub rtt_iters: usize,
    /// Handshakes per cell.
    pub handshakes: usize,
    /// Repeats of every cell.
    pub repeats: usize,
}

/// Everything measured for one transport.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowReport {
    /// Row name.
    pub name: String,
    /// What runs.
    pub description: String,
    /// Bulk throughput and CPU (sides on separate cores, threads of one process).
    pub bulk: Option<BulkReport>,
    /// The same with each side a process of its own (absent for the in-process
    /// `sim` fabric, which cannot cross processes).
    #[serde(default)]
    pub bulk_processes: Option<BulkReport>,
    /// RTT per placement (threads of one process).
    pub rtt: Vec<RttReport>,
    /// RTT with each side a process of its own, on separate cores (absent
    /// for `sim`).
    #[serde(default)]
    pub rtt_processes: Option<RttReport>,
    /// Handshake rate (sides on separate cores, threads of one process).
    pub handshakes: Option<HandshakeReport>,
    /// The same with each side a process of its own (absent for `sim`).
    #[serde(default)]
    pub handshakes_processes: Option<HandshakeReport>,
    /// Cells that failed, with why.
    pub errors: Vec<String>,
}

/// Bulk cells of one row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BulkReport {
    /// Every repeat.
    pub runs: Vec<BulkOutcome>,
    /// Every repeat's sha256 matched.
    pub sha256_ok: bool,
    /// Payload Gbit/s.
    pub gbit_s: Spread,
    /// Client thread CPU seconds per GiB of payload.
    pub client_cpu_s_per_gib: Spread,
    /// Server thread CPU seconds per GiB of payload.
    pub server_cpu_s_per_gib: Spread,
}

impl BulkReport {
    /// Summarise repeats (`None` if there are none).
    pub fn of(runs: Vec<BulkOutcome>) -> Option<Self> {
        let f =
            |g: &dyn Fn(&BulkOutcome) -> f64| Spread::of(&runs.iter().map(g).collect::<Vec<_>>());
        Some(BulkReport {
            sha256_ok: !runs.is_empty() && runs.iter().all(|r| r.sha256_ok),
            gbit_s: f(&|r| r.bytes as f64 * 8.0 / r.secs / 1e9)?,
            client_cpu_s_per_gib: f(&|r| r.client_cpu.total_s() / (r.bytes as f64 / GIB))?,
            server_cpu_s_per_gib: f(&|r| r.server_cpu.total_s() / (r.bytes as f64 / GIB))?,
            runs,
        })
    }
}

/// One RTT cell's percentiles.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct RttRun {
    /// Samples.
    pub iters: usize,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
}

impl RttRun {
    /// Percentiles of nanosecond samples.
    pub fn of(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0;
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / samples.len().max(1) as f64;
        RttRun {
            iters: samples.len(),
            p50_us: us(quantile(&samples, 0.5)),
            p99_us: us(quantile(&samples, 0.99)),
            p999_us: us(quantile(&samples, 0.999)),
            mean_us: mean / 1000.0,
        }
    }
}

/// RTT cells of one row at one placement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RttReport {
    /// Same core or separate cores.
    pub placement: Placement,
    /// Every repeat.
    pub runs: Vec<RttRun>,
    /// p50 over repeats, µs.
    pub p50_us: Spread,
    /// p99 over repeats, µs.
    pub p99_us: Spread,
    /// p99.9 over repeats, µs.
    pub p999_us: Spread,
}

impl RttReport {
    /// Summarise repeats (`None` if there are none).
    pub fn of(placement: Placement, runs: Vec<RttRun>) -> Option<Self> {
        let f = |g: &dyn Fn(&RttRun) -> f64| Spread::of(&runs.iter().map(g).collect::<Vec<_>>());
        Some(RttReport {
            placement,
            p50_us: f(&|r| r.p50_us)?,
            p99_us: f(&|r| r.p99_us)?,
            p999_us: f(&|r| r.p999_us)?,
            runs,
        })
    }
}

/// Handshake cells of one row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HandshakeReport {
    /// Every repeat.
    pub runs: Vec<HandshakeOutcome>,
    /// Handshakes per second.
    pub per_s: Spread,
}

impl HandshakeReport {
    /// Summarise repeats (`None` if there are none).
    pub fn of(runs: Vec<HandshakeOutcome>) -> Option<Self> {
        let v: Vec<f64> = runs.iter().map(|r| r.count as f64 / r.secs).collect();
        Some(HandshakeReport {
            per_s: Spread::of(&v)?,
            runs,
        })
    }
}

/// One performance target, judged on medians of this run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The goal, as a ratio bound (`>= 1.3`, `<= 0.25`).
    pub goal: String,
    /// The measured ratio (`None` when a row is missing from this run).
    pub measured: Option<f64>,
    /// Met, not met, or not measurable here.
    pub met: Option<bool>,
    /// The most this machine could measure for the ratio. Bulk goals: the
    /// same ratio with `quinn-proto/ideal` (quinn-proto over a zero-copy
    /// wire, [`crate::rows::ideal`]) in place of our row, the most any fabric
    /// under quinn-proto could give. Image throughput goals: the CPU-bound
    /// ceiling ([`crate::image::ImageRepeat::cpu_ceiling`]). `None` for other
    /// goals or when a row did not run.
    #[serde(default)]
    pub ceiling: Option<f64>,
}

impl Report {
    fn row(&self, name: &str) -> Option<&RowReport> {
        self.rows.iter().find(|r| r.name == name)
    }

    fn bulk_median(&self, name: &str) -> Option<f64> {
        Some(self.row(name)?.bulk.as_ref()?.gbit_s.median)
    }

    fn bulk_proc_median(&self, name: &str) -> Option<f64> {
        let r = self
            .rows
            .iter()
            .chain(&self.standalone)
            .find(|r| r.name == name)?;
        Some(r.bulk_processes.as_ref()?.gbit_s.median)
    }

    fn rtt_p50(&self, name: &str, place: Placement) -> Option<f64> {
        let r = self.row(name)?.rtt.iter().find(|r| r.placement == place)?;
        Some(r.p50_us.median)
    }

    /// Evaluate the ratio targets (instructions per byte come from callgrind.sh).
    pub fn judge(&mut self, soft_row: &str) {
        let mut t = Vec::new();
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let mut push = |name: String, goal: &str, m: Option<f64>, ceiling: Option<f64>| {
            let (op, bound) = goal.split_at(2);
            let bound: f64 = bound.trim().parse().unwrap_or(f64::NAN);
            let met = m.map(|m| if op == ">=" { m >= bound } else { m <= bound });
            t.push(Target {
                name,
                goal: goal.into(),
                measured: m,
                met,
                ceiling,
            });
        };
        // The harness does not slow the peers down: every peer row within
        // 10 % of the standalone pair of that peer, run in the same repeats.
        for (row, peer) in [
            ("quinn/udp-4096", "peer-quinn-udp"),
            ("tcp+rustls", "peer-tcp-rustls"),
        ] {
            let sa = self.bulk_proc_median(peer);
            push(
                format!("bulk: {row} (threads) ÷ standalone {peer}"),
                ">= 0.9",
                ratio(self.bulk_median(row), sa),
                None,
            );
            push(
                format!("bulk: {row} (processes) ÷ standalone {peer}"),
                ">= 0.9",
                ratio(self.bulk_proc_median(row), sa),
                None,
            );
        }
        // Our rows against the peers as fast as their users get them: quinn
        // over UDP at MTU 4096 and TCP + rustls, each the faster of its
        // two-process row and its standalone pair (the median of each), so a
        // harness that slowed a peer down could only make our ratios smaller.
        let best =
            |row: &str, peer: &str| match (self.bulk_proc_median(row), self.bulk_proc_median(peer))
            {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        let quinn = best("quinn/udp-4096", "peer-quinn-udp");
        let tls = best("tcp+rustls", "peer-tcp-rustls");
        let q = "quinn/UDP@4096 (best of row, standalone; processes)";
        let tl = "TCP+rustls (best of row, standalone; processes)";
        let e = self.bulk_median("engine/sim");
        let ideal = self.bulk_median("quinn-proto/ideal");
        let (cq, ct) = (ratio(ideal, quinn), ratio(ideal, tls));
        push(
            format!("bulk: engine/sim ÷ {q}"),
            ">= 1.5",
            ratio(e, quinn),
            cq,
        );
        push(
            format!("bulk: engine/sim ÷ {tl}"),
            ">= 1.0",
            ratio(e, tls),
            ct,
        );
        push(
            format!("bulk: {soft_row} (processes) ÷ {q}"),
            ">= 1.0",
            ratio(self.bulk_proc_median(soft_row), quinn),
            cq,
        );
        push(
            format!("bulk: quinn-adapter/sim ÷ {q}"),
            ">= 1.2",
            ratio(self.bulk_median("quinn-adapter/sim"), quinn),
            cq,
        );
        push(
            format!("bulk: quinn-adapter/soft (processes) ÷ {q}"),
            ">= 1.0",
            ratio(self.bulk_proc_median("quinn-adapter/soft"), quinn),
            cq,
        );
        for (place, goal) in [
            (Placement::SeparateCores, "<= 0.5"),
            (Placement::SameCore, "<= 1.0"),
        ] {
            push(
                format!("RTT p50 ({}): engine/sim ÷ tcp", place.label()),
                goal,
                ratio(
                    self.rtt_p50("engine/sim", place),
                    self.rtt_p50("tcp", place),
                ),
                None,
            );
        }
        // The image agents' goals: a pull through them is at least as fast
        // cold, and 1.5× as fast warm, as the pull a user would do without
        // them, a GET from the registry over HTTPS.
        if let Some(img) = &self.image {
            push(
                "image: agents cold (last byte) ÷ direct HTTPS GET, median of per-repeat ratios"
                    .into(),
                ">= 1.0",
                img.median(|r, b| {
                    crate::image::mbit(b, r.cold.get.total_s)
                        / crate::image::mbit(b, r.direct.total_s)
                }),
                img.median(|r, b| r.cpu_ceiling(b, img.cpus)[0]),
            );
            push(
                "image: agents warm (last byte) ÷ direct HTTPS GET, median of per-repeat ratios"
                    .into(),
                ">= 1.5",
                img.median(|r, b| {
                    crate::image::mbit(b, r.warm.get.total_s)
                        / crate::image::mbit(b, r.direct.total_s)
                }),
                img.median(|r, b| r.cpu_ceiling(b, img.cpus)[1]),
            );
            push(
                "image: agents cold, time to first byte (ms), median".into(),
                "<= 50",
                img.median(|r, _| r.cold.get.first_byte_s * 1e3),
                None,
            );
        }
        self.targets = t;
    }

    /// Write `compare.json`, `compare.md` and `compare.svg` into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("compare.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        std::fs::write(dir.join("compare.md"), self.markdown())?;
        std::fs::write(dir.join("compare.svg"), self.svg())?;
        Ok(())
    }

    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let _ = writeln!(
            s,
            "# quic-rdma comparison{}\n",
            if self.quick { " (--quick)" } else { "" }
        );
        let _ = writeln!(
            s,
            "Machine: {} × {} CPUs, Linux {}; load average {:.2}/{:.2}/{:.2} at start, {:.2}/{:.2}/{:.2} at end; {:.0} s.\n",
            m.cpus, m.cpu_model, m.kernel, m.load_before[0], m.load_before[1], m.load_before[2],
            m.load_after[0], m.load_after[1], m.load_after[2], self.wall_s
        );
        let _ = writeln!(
            s,
            "Other processes and the hypervisor took {:.1} % of the machine's CPU time during the run{}\n",
            m.others_cpu_share * 100.0,
            if m.noisy {
                format!(
                    ": **NOISY** (above {:.0} %): the figures, tails first, are upper bounds",
                    NOISY_SHARE * 100.0
                )
            } else {
                " (quiet).".into()
            }
        );
        let p = &self.params;
        let _ = writeln!(
            s,
            "Bulk: {} MiB on one stream, sha256 verified, sides on separate cores. RTT: {} × 64-byte request/response after 1000 warm-up. Handshakes: {} sequential connections (full TLS 1.3, no resumption). {} repeats per cell: median (min–max).\n",
            p.bulk_bytes >> 20, p.rtt_iters, p.handshakes, p.repeats
        );
        let _ = writeln!(s, "| row | bulk Gbit/s | client CPU s/GiB | server CPU s/GiB | sha256 | RTT p50/p99/p99.9 µs, separate cores | RTT p50/p99/p99.9 µs, same core | handshakes/s |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        let sp = |x: &Spread, d: usize| format!("{:.d$} ({:.d$}–{:.d$})", x.median, x.min, x.max);
        for r in &self.rows {
            let (g, cc, sc, ok) = match &r.bulk {
                Some(b) => (
                    sp(&b.gbit_s, 2),
                    sp(&b.client_cpu_s_per_gib, 2),
                    sp(&b.server_cpu_s_per_gib, 2),
                    if b.sha256_ok { "ok" } else { "**MISMATCH**" }.to_string(),
                ),
                None => ("–".into(), "–".into(), "–".into(), "–".into()),
            };
            let rtt = |place| {
                r.rtt
                    .iter()
                    .find(|x| x.placement == place)
                    .map(|x| {
                        format!(
                            "{:.1} / {:.1} / {:.1}",
                            x.p50_us.median, x.p99_us.median, x.p999_us.median
                        )
                    })
                    .unwrap_or_else(|| "–".into())
            };
            let hs = r
                .handshakes
                .as_ref()
                .map(|h| sp(&h.per_s, 0))
                .unwrap_or_else(|| "–".into());
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                g,
                cc,
                sc,
                ok,
                rtt(Placement::SeparateCores),
                rtt(Placement::SameCore),
                hs
            );
        }
        let _ = writeln!(
            s,
            "\nBulk by placement — threads: both sides in this process, on CPU 0/1; processes: each side a process of its own, pinned to CPU 0/1 (`sim` cannot cross processes); CPU per side is getrusage of the side's thread, or of its whole process:\n"
        );
        let _ = writeln!(s, "| row | threads Gbit/s | threads CPU s/GiB client / server | processes Gbit/s | processes CPU s/GiB client / server |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        let cell = |b: &Option<BulkReport>| match b {
            Some(b) => (
                format!(
                    "{}{}",
                    sp(&b.gbit_s, 2),
                    if b.sha256_ok { "" } else { " **MISMATCH**" }
                ),
                format!(
                    "{} / {}",
                    sp(&b.client_cpu_s_per_gib, 2),
                    sp(&b.server_cpu_s_per_gib, 2)
                ),
            ),
            None => ("–".into(), "–".into()),
        };
        for r in self.rows.iter().chain(&self.standalone) {
            let (tg, tc) = cell(&r.bulk);
            let (pg, pc) = cell(&r.bulk_processes);
            let _ = writeln!(s, "| {} | {tg} | {tc} | {pg} | {pc} |", r.name);
        }
        let _ = writeln!(
            s,
            "\nRTT cells with min–max of each percentile over repeats:\n"
        );
        let _ = writeln!(s, "| row | placement | p50 µs | p99 µs | p99.9 µs |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for r in &self.rows {
            let procs = r
                .rtt_processes
                .iter()
                .map(|x| (x, "separate cores, processes"));
            for (x, place) in r.rtt.iter().map(|x| (x, x.placement.label())).chain(procs) {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    r.name,
                    place,
                    sp(&x.p50_us, 1),
                    sp(&x.p99_us, 1),
                    sp(&x.p999_us, 1)
                );
            }
        }
        let _ = writeln!(s, "\nHandshakes per second, sides on separate cores:\n");
        let _ = writeln!(s, "| row | threads | processes |");
        let _ = writeln!(s, "|---|---|---|");
        let hs = |h: &Option<HandshakeReport>| {
            h.as_ref()
                .map(|h| sp(&h.per_s, 0))
                .unwrap_or_else(|| "–".into())
        };
        for r in self.rows.iter().filter(|r| r.handshakes.is_some()) {
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                r.name,
                hs(&r.handshakes),
                hs(&r.handshakes_processes)
            );
        }
        if let Some(img) = &self.image {
            let _ = writeln!(s, "\n{}", img.markdown());
        }
        let _ = writeln!(s, "\nTargets (ratios of medians):\n");
        let _ = writeln!(
            s,
            "Ceiling: the same ratio for `quinn-proto/ideal` (quinn-proto over a zero-copy \
             wire), the most any fabric under quinn-proto reaches in this run.\n"
        );
        let _ = writeln!(s, "| target | goal | measured | ceiling | verdict |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        let fmt = |v: Option<f64>| v.map(|m| format!("{m:.2}")).unwrap_or_else(|| "–".into());
        for t in &self.targets {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                t.name,
                t.goal,
                fmt(t.measured),
                fmt(t.ceiling),
                match t.met {
                    Some(true) => "met",
                    Some(false) => "NOT met",
                    None => "not measured (row missing)",
                }
            );
        }
        let errs: Vec<_> = self
            .rows
            .iter()
            .chain(&self.standalone)
            .flat_map(|r| r.errors.iter().map(move |e| (r.name.clone(), e)))
            .collect();
        if !errs.is_empty() {
            let _ = writeln!(s, "\nFailed cells:\n");
            for (n, e) in errs {
                let _ = writeln!(s, "- {n}: {e}");
            }
        }
        let _ = writeln!(s, "\nRows:\n");
        for r in self.rows.iter().chain(&self.standalone) {
            let _ = writeln!(s, "- `{}`: {}", r.name, r.description);
        }
        s
    }

    /// The plot: bulk throughput (median, min–max whisker) and RTT p50/p99 per row.
    pub fn svg(&self) -> String {
        let rows = &self.rows;
        let bar_h = 16.0;
        let label_w = 150.0;
        let panel_w = 360.0;
        let top = 50.0;
        let group_h = bar_h * 2.0 + 10.0;
        let height = top + group_h * rows.len() as f64 + 50.0;
        let width = label_w + 2.0 * panel_w + 80.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let max_g = rows
            .iter()
            .filter_map(|r| r.bulk.as_ref().map(|b| b.gbit_s.max))
            .fold(0.0, f64::max)
            .max(1e-9);
        let rtt_of = |r: &RowReport, p: Placement| r.rtt.iter().find(|x| x.placement == p).cloned();
        let max_rtt = rows
            .iter()
            .flat_map(|r| r.rtt.iter().map(|x| x.p99_us.median))
            .fold(0.0, f64::max)
            .max(1e-9);
        let x1 = label_w;
        let x2 = label_w + panel_w + 40.0;
        let _ = writeln!(
            s,
            r#"<text x="{x1}" y="20" font-weight="bold">Bulk throughput, Gbit/s (median, min–max)</text>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{x2}" y="20" font-weight="bold">64-byte RTT, µs: p50 bar, p99 tick</text>"#
        );
        let _ = writeln!(
            s,
            r##"<text x="{x2}" y="36" fill="#555">dark: separate cores · light: same core</text>"##
        );
        for (i, r) in rows.iter().enumerate() {
            let y = top + i as f64 * group_h;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                label_w - 8.0,
                y + bar_h + 4.0,
                xml_escape(&r.name)
            );
            if let Some(b) = &r.bulk {
                let w = b.gbit_s.median / max_g * panel_w;
                let (lo, hi) = (
                    b.gbit_s.min / max_g * panel_w,
                    b.gbit_s.max / max_g * panel_w,
                );
                let yc = y + bar_h;
                let _ = writeln!(
                    s,
                    r##"<rect x="{x1}" y="{y}" width="{w:.1}" height="{}" fill="#3b6ea5"/>"##,
                    bar_h * 2.0
                );
                let _ = writeln!(
                    s,
                    r#"<line x1="{:.1}" y1="{yc}" x2="{:.1}" y2="{yc}" stroke="black"/>"#,
                    x1 + lo,
                    x1 + hi
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{}">{:.2}</text>"#,
                    x1 + hi + 4.0,
                    yc + 4.0,
                    b.gbit_s.median
                );
            }
            for (k, (place, color)) in [
                (Placement::SeparateCores, "#a5503b"),
                (Placement::SameCore, "#e0a890"),
            ]
            .into_iter()
            .enumerate()
            {
                if let Some(x) = rtt_of(r, place) {
                    let yy = y + k as f64 * bar_h;
                    let w = x.p50_us.median / max_rtt * panel_w;
                    let t = x.p99_us.median / max_rtt * panel_w;
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x2}" y="{yy}" width="{w:.1}" height="{}" fill="{color}"/>"#,
                        bar_h - 2.0
                    );
                    let _ = writeln!(
                        s,
                        r#"<line x1="{:.1}" y1="{yy}" x2="{:.1}" y2="{}" stroke="black" stroke-width="2"/>"#,
                        x2 + t,
                        x2 + t,
                        yy + bar_h - 2.0
                    );
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{}">{:.1} / {:.1}</text>"#,
                        x2 + t.max(w) + 4.0,
                        yy + bar_h - 4.0,
                        x.p50_us.median,
                        x.p99_us.median
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            r##"<text x="{x1}" y="{}" fill="#555">{} · {} CPUs · load {:.2} → {:.2}{}</text>"##,
            height - 15.0,
            xml_escape(&self.machine.cpu_model),
            self.machine.cpus,
            self.machine.load_before[0],
            self.machine.load_after[0],
            if self.quick { " · --quick" } else { "" }
        );
        let _ = writeln!(s, "</svg>");
        s
    }
}

/// `s` safe inside SVG text.
pub(crate) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
