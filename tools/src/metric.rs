//! One counter or gauge, and its Prometheus text (exposition format 0.0.4):
//! the pieces every `/metrics` of `qr` is written with (the channels, the
//! gateway, `qr serve`), so no part of `qr` borrows them from another.

use std::fmt::Write as _;

use quic_rdma::counters::{Counters, FieldValue, Kind, Metric};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// One monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Add one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// So a struct of live counters can visit its fields with
/// `quic_rdma::visit_fields!` (one list for every output) without a copy.
impl FieldValue for Counter {
    fn value(&self) -> u64 {
        self.get()
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Add `n` (negative to subtract).
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Set the value (for a gauge that mirrors a size kept elsewhere).
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// As [`Counter`]'s; a level that dips below zero for a moment (updates
/// from several tasks racing) reads as 0, as `FieldValue for i64` does.
impl FieldValue for Gauge {
    fn value(&self) -> u64 {
        self.get().value()
    }
}

/// A latency histogram: cumulative buckets, a sum and a count, as
/// Prometheus histograms are exposed (exposition format 0.0.4, `_bucket{le}`,
/// `_sum`, `_count`).
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in seconds, ascending (`+Inf` is implied).
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative; the last one is `+Inf`).
    counts: Vec<AtomicU64>,
    /// Sum of observations, in nanoseconds.
    sum_nanos: AtomicU64,
}

/// The default bounds of a request-latency [`Histogram`], seconds: 1 ms to a
/// minute (an image layer may take that long).
pub const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(LATENCY_BOUNDS)
    }
}

impl Histogram {
    /// An empty histogram with upper bounds `bounds` (seconds, ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Record one observation.
    pub fn observe(&self, d: std::time::Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|b| *b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// A label with a fixed set of values (e.g. a request's route), for
/// [`HistogramVec`].
pub trait Label: Copy + 'static {
    /// The label's name.
    const KEY: &'static str;
    /// Every value, in index order.
    const ALL: &'static [Self];
    /// This value's text.
    fn name(self) -> &'static str;
    /// This value's place in [`Label::ALL`].
    fn index(self) -> usize;
}

/// One latency [`Histogram`] per value of label `L`, exposed as one family.
#[derive(Debug)]
pub struct HistogramVec<L: Label> {
    series: Vec<Histogram>,
    _label: std::marker::PhantomData<L>,
}

impl<L: Label> Default for HistogramVec<L> {
    fn default() -> Self {
        HistogramVec {
            series: L::ALL.iter().map(|_| Histogram::default()).collect(),
            _label: std::marker::PhantomData,
        }
    }
}

impl<L: Label> HistogramVec<L> {
    /// The histogram of `value`.
    pub fn get(&self, value: L) -> &Histogram {
        &self.series[value.index()]
    }

    /// Append them as family `name`, one series per label value.
    pub fn render(&self, o: &mut String, name: &str, help: &str) {
        let labels: Vec<String> = L::ALL
            .iter()
            .map(|v| format!("{}=\"{}\"", L::KEY, v.name()))
            .collect();
        let series: Vec<(&str, &Histogram)> = labels
            .iter()
            .zip(&self.series)
            .map(|(l, h)| (l.as_str(), h))
            .collect();
        histogram(o, name, help, &series);
    }
}

/// Append histogram family `name` (HELP, TYPE once) with one series per
/// `(labels, histogram)`; `labels` is `key="value"` pairs without braces,
/// or empty.
pub fn histogram(o: &mut String, name: &str, help: &str, series: &[(&str, &Histogram)]) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (labels, h) in series {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, c) in h.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = h
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(o, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}");
        }
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let sum = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(o, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(o, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// Append one counter `name` with its HELP and TYPE lines (exposition format
/// 0.0.4); shared by every `/metrics` of `qr` (channels, gateway, `qr serve`).
pub fn counter(o: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

/// Append one gauge `name` with its HELP and TYPE lines (see [`counter`]).
pub fn gauge(o: &mut String, name: &str, help: &str, v: i64) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// Append every value `c` visits as `{prefix}_[{group}_]{name}`, typed by
/// its [`Kind`] and suffixed `_total` when it is a counter (Prometheus
/// naming): how each stats struct's visitor becomes `/metrics` text, so the
/// text lists exactly what the JSON reports list.
pub fn visited(o: &mut String, prefix: &str, c: &dyn Counters) {
    visited_labelled(o, prefix, "", c);
}

/// [`visited`], each sample carrying `labels` (`key="value"` pairs without
/// braces, or empty): for an exporter that tells its instances apart by a
/// label on every series (the KV relay's `role`).
pub fn visited_labelled(o: &mut String, prefix: &str, labels: &str, c: &dyn Counters) {
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    c.visit(&mut |m| {
        let (name, ty) = exposed(prefix, &m);
        let _ = writeln!(
            o,
            "# HELP {name} {}\n# TYPE {name} {ty}\n{name}{labels} {}",
            m.help, m.value
        );
    });
}

/// The Prometheus name and type of a visited value:
/// `{prefix}_[{group}_]{name}`, suffixed `_total` when it is a counter.
pub fn exposed(prefix: &str, m: &Metric) -> (String, &'static str) {
    let group = m.group.map_or(String::new(), |g| format!("{g}_"));
    let (suffix, ty) = match m.kind {
        Kind::Counter => ("_total", "counter"),
        Kind::Gauge => ("", "gauge"),
    };
    (format!("{prefix}_{group}{}{suffix}", m.name), ty)
}

/// Read one sample (`name` or `name{labels}`) from Prometheus text: for tests
/// and `qr pull --json`.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The coverage check of `report::human`, for the exporters whose
    /// `/metrics` adds families and histograms to a visitor: every visited
    /// value is on that page, typed and suffixed as its kind says, with
    /// its value and the page's labels; and the KV status carries it too.
    #[test]
    fn every_visited_value_is_on_its_metrics_page() {
        let node = crate::image::metrics::NodeMetrics::default();
        let registry = crate::image::metrics::RegistryMetrics::default();
        let kv = crate::kv::metrics::Metrics::default();
        let gateway = crate::gateway::GatewayStats::default();
        // Distinct values, so a sample read back is this value's own.
        node.resumes.add(3);
        node.peer_server.bytes_sent.add(5);
        node.chunk_size.set(7);
        registry.bytes_sent.add(11);
        kv.head.store(13, Ordering::Relaxed);
        kv.reconnects.store(17, Ordering::Relaxed);
        gateway.udp_rx.add(19);
        gateway.clients_active.add(23);
        let pages: [(&str, &str, &dyn Counters, String); 4] = [
            ("qr_node", "", &node, node.render()),
            ("qr_registry", "", &registry, registry.render()),
            (
                "qr_kv",
                "{role=\"upstream\"}",
                &kv,
                kv.prometheus("upstream"),
            ),
            ("qr_gateway", "", &gateway.snapshot(), gateway.prometheus()),
        ];
        let status = kv.status("upstream");
        for (prefix, labels, c, text) in pages {
            let mut n = 0;
            c.visit(&mut |m| {
                n += 1;
                let (name, ty) = exposed(prefix, &m);
                let line = format!("# TYPE {name} {ty}\n");
                assert!(text.contains(&line), "{line} not in {prefix}'s /metrics");
                let got = sample(&text, &format!("{name}{labels}"));
                assert_eq!(got, Some(m.value as f64), "{name}{labels}");
                if prefix == "qr_kv" {
                    let key = if m.name == "log_head_bytes" {
                        "head"
                    } else {
                        m.name
                    };
                    assert_eq!(status[key], m.value, "{key} in the KV status");
                }
            });
            assert!(n >= 10, "{prefix}: {n} values visited");
        }
    }

    #[test]
    fn histograms_are_cumulative() {
        let h = Histogram::new(&[0.01, 0.1]);
        for ms in [5, 50, 50, 500] {
            h.observe(Duration::from_millis(ms));
        }
        let mut o = String::new();
        histogram(&mut o, "x_seconds", "help", &[("route=\"a\"", &h)]);
        assert_eq!(
            sample(&o, "x_seconds_bucket{route=\"a\",le=\"0.01\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&o, "x_seconds_bucket{route=\"a\",le=\"0.1\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(&o, "x_seconds_bucket{route=\"a\",le=\"+Inf\"}"),
            Some(4.0)
        );
        assert_eq!(sample(&o, "x_seconds_count{route=\"a\"}"), Some(4.0));
        assert!((sample(&o, "x_seconds_sum{route=\"a\"}").unwrap() - 0.605).abs() < 1e-9);
        assert_eq!(o.matches("# TYPE").count(), 1);
        // An observation on a bound falls in that bucket (le = less or equal).
        let h = Histogram::new(&[0.01]);
        h.observe(Duration::from_millis(10));
        assert_eq!(h.counts[0].load(Ordering::Relaxed), 1);
    }
}
