//! Latency distributions: every sampled round trip of a row at a placement,
//! all repeats together, in one HdrHistogram; written as HdrHistogram's
//! percentile-distribution text (`.hgrm`, what its plotter and
//! `HistogramLogProcessor` read) and drawn as one percentile plot (SVG):
//! latency against 1/(1 − percentile), both axes logarithmic, so p50, p99,
//! p99.9 and the tail sit at even steps.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;

use crate::report::xml_escape;

/// Nanosecond histograms keyed by (row, placement label).
#[derive(Debug, Default)]
pub struct Distributions {
    map: BTreeMap<(String, String), Histogram<u64>>,
}

/// Highest latency a histogram tracks (60 s): longer samples are clamped.
const HIGHEST_NS: u64 = 60_000_000_000;

/// Percentiles of the plot's x axis, as 1/(1 − p): 50 % … 99.999 %.
const PLOT_TAIL: [f64; 5] = [2.0, 10.0, 100.0, 1000.0, 100_000.0];

impl Distributions {
    /// Add `samples_ns` to the histogram of `row` at `placement`.
    pub fn record(&mut self, row: &str, placement: &str, samples_ns: &[u64]) {
        let h = self
            .map
            .entry((row.to_string(), placement.to_string()))
            .or_insert_with(|| {
                Histogram::new_with_bounds(1, HIGHEST_NS, 3).expect("valid histogram bounds")
            });
        for &ns in samples_ns {
            h.saturating_record(ns.max(1));
        }
    }

    /// Write `latency/<row>@<placement>.hgrm` for every histogram and
    /// `latency.svg`, the percentile plot of those at `plot_placement`.
    pub fn write(&self, dir: &Path, plot_placement: &str) -> anyhow::Result<()> {
        let sub = dir.join("latency");
        std::fs::create_dir_all(&sub)?;
        for ((row, place), h) in &self.map {
            let name = format!("{row}@{place}").replace(['/', ' ', ','], "_");
            std::fs::write(sub.join(format!("{name}.hgrm")), hgrm(h))?;
        }
        std::fs::write(dir.join("latency.svg"), self.svg(plot_placement))?;
        Ok(())
    }

    /// The percentile plot of every row at `placement`.
    pub fn svg(&self, placement: &str) -> String {
        let curves: Vec<(&str, &Histogram<u64>)> = self
            .map
            .iter()
            .filter(|((_, p), _)| p == placement)
            .map(|((r, _), h)| (r.as_str(), h))
            .collect();
        let (w, h, left, right, top, bottom) = (760.0, 420.0, 60.0, 190.0, 30.0, 40.0);
        let (pw, ph) = (w - left - right, h - top - bottom);
        let max_x = PLOT_TAIL[PLOT_TAIL.len() - 1].log10();
        let x = |tail: f64| left + pw * (tail.max(1.0).log10() / max_x).min(1.0);
        let ns_max = curves
            .iter()
            .map(|(_, h)| h.max())
            .max()
            .unwrap_or(1000)
            .max(1000) as f64;
        let decades = (ns_max / 1000.0).log10().ceil().max(1.0);
        // y: 1 µs at the bottom, a whole decade above the slowest sample on top.
        let y = |ns: f64| top + ph * (1.0 - ((ns / 1000.0).max(1.0).log10() / decades).min(1.0));
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{left}" y="18">Round-trip latency by percentile, 64-byte request/response ({placement})</text>"#
        );
        for d in 0..=decades as i32 {
            let ns = 1000.0 * 10f64.powi(d);
            let yy = y(ns);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{} µs</text>"##,
                left + pw,
                left - 4.0,
                yy + 4.0,
                10f64.powi(d)
            );
        }
        for tail in PLOT_TAIL {
            let xx = x(tail);
            // 50 %, 90 %, …, 99.999 %: rounded, as float division leaves
            // digits like 99.99900000000001.
            let label = format!("{}%", (100_000.0 * (1.0 - 1.0 / tail)).round() / 1000.0);
            let _ = writeln!(
                s,
                r##"<line x1="{xx}" x2="{xx}" y1="{top}" y2="{}" stroke="#ddd"/><text x="{xx}" y="{}" text-anchor="middle">{label}</text>"##,
                top + ph,
                top + ph + 14.0
            );
        }
        const COLOURS: [&str; 10] = [
            "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf",
        ];
        for (i, (row, hist)) in curves.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut pts = String::new();
            for v in hist.iter_quantiles(4) {
                let q = v.quantile_iterated_to();
                if q >= 1.0 {
                    break;
                }
                let _ = write!(
                    pts,
                    "{:.1},{:.1} ",
                    x(1.0 / (1.0 - q)),
                    y(v.value_iterated_to() as f64)
                );
            }
            let dash = if i >= COLOURS.len() {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{pts}"/>"#
            );
            let ly = top + 14.0 * i as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
                left + pw + 10.0,
                left + pw + 28.0,
                left + pw + 32.0,
                ly + 4.0,
                xml_escape(row)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// HdrHistogram's percentile-distribution text of `h` (values in µs).
fn hgrm(h: &Histogram<u64>) -> String {
    let mut s = String::from("       Value     Percentile TotalCount 1/(1-Percentile)\n\n");
    for v in h.iter_quantiles(5) {
        let q = v.quantile_iterated_to();
        let inv = if q < 1.0 {
            format!("{:14.2}", 1.0 / (1.0 - q))
        } else {
            "           inf".into()
        };
        let _ = writeln!(
            s,
            "{:12.3} {:14.12} {:10} {inv}",
            v.value_iterated_to() as f64 / 1000.0,
            q,
            v.count_since_last_iteration()
        );
    }
    let _ = writeln!(
        s,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]\n#[Max     = {:12.3}, Total count    = {:12}]",
        h.mean() / 1000.0,
        h.stdev() / 1000.0,
        h.max() as f64 / 1000.0,
        h.len()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_keep_every_sample_and_their_percentiles() {
        let mut d = Distributions::default();
        let samples: Vec<u64> = (1..=10_000).map(|i| i * 1000).collect();
        d.record("engine/sim", "separate cores", &samples[..5000]);
        d.record("engine/sim", "separate cores", &samples[5000..]);
        let h = &d.map[&("engine/sim".to_string(), "separate cores".to_string())];
        assert_eq!(h.len(), 10_000);
        // 3 significant digits: within 0.1 % of the exact nearest rank.
        let p99 = h.value_at_quantile(0.99) as f64;
        assert!((p99 - 9_900_000.0).abs() / 9_900_000.0 < 0.001, "{p99}");
        let text = hgrm(h);
        assert!(text.contains("Total count    =        10000"), "{text}");
        let svg = d.svg("separate cores");
        assert!(svg.contains("<polyline") && svg.contains("engine/sim"));
        assert!(!d.svg("same core").contains("<polyline"));
    }
}
