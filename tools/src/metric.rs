//! One counter or gauge, a latency histogram, and the one writer of every
//! `/metrics` page of `qr` (the channels, the gateway, `qr serve`): a
//! [`Text`] gathers what a page shows at the scrape — the values a
//! [`Counters`] visitor lists, labelled families, histograms — and
//! prometheus-client's encoder writes it as Prometheus text, exposition
//! format 0.0.4 ([`CONTENT_TYPE`]).
//!
//! Format 0.0.4 rather than the crate's OpenMetrics encoder: the pages are
//! assembled from parts (a command's values, its cache's, its listeners'),
//! which 0.0.4 text allows by concatenation while OpenMetrics ends each
//! exposition with one `# EOF`; and 0.0.4 keeps every family's `# TYPE` on
//! the sample's own name (`x_total`), as dashboards have always read it.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use quic_rdma::counters::{Counters, FieldValue, Kind, Metric};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The `Content-Type` of every `/metrics` page: what prometheus-client's
/// encoder writes (Prometheus text, version 0.0.4, UTF-8).
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
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

/// A latency histogram: counts per bucket and a sum, kept in atomics so an
/// observation takes no lock (prometheus-client's own histogram takes a
/// mutex); [`Text::histograms`] hands them to the crate's encoder.
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

    /// Record one observation (it falls in the first bucket whose bound is
    /// at least it: `le`, less or equal).
    pub fn observe(&self, d: std::time::Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|b| *b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Mean observation in seconds (0 before the first).
    pub fn mean(&self) -> f64 {
        let n: u64 = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9 / n.max(1) as f64
    }

    /// The value as the crate's encoder takes it: per-bucket counts (not
    /// cumulative) with their bounds, the last `+Inf`.
    fn now(&self) -> Value {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.counts)
            .map(|(b, c)| (b, c.load(Ordering::Relaxed)))
            .collect();
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        Value::Histogram(sum, buckets)
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

    /// Every value's name and histogram, for [`Text::histograms`].
    pub fn each(&self) -> impl Iterator<Item = (&'static str, &Histogram)> {
        L::ALL.iter().map(|l| l.name()).zip(&self.series)
    }
}

/// One series' value at the scrape.
#[derive(Debug)]
enum Value {
    Int(u64),
    Float(f64),
    /// Sum in seconds, and each bucket's bound and count (not cumulative).
    Histogram(f64, Vec<(f64, u64)>),
}

/// A series' labels, `(name, value)` in order.
pub type Labels = Vec<(String, String)>;
/// A family: name, help, type, series.
type Family = (String, String, MetricType, Vec<(Labels, Value)>);

/// What a `/metrics` page (or a part of one) shows, gathered at the scrape;
/// [`Text::render`] has prometheus-client write it. Every series carries
/// the labels the `Text` was made with (none from `Text::default()`). A
/// family's name is as the encoder takes it: a counter's without `_total`.
#[derive(Debug, Default)]
pub struct Text {
    labels: Labels,
    families: Vec<Family>,
}

impl Text {
    /// An empty page part whose every series carries `key="value"`: for an
    /// exporter that tells its instances apart by a label (the KV relay's
    /// `role`).
    pub fn labelled(key: &str, value: &str) -> Self {
        let labels = vec![(key.into(), value.into())];
        Text {
            labels,
            ..Self::default()
        }
    }

    /// Family `name` with one series per `(label value, value)`, labelled
    /// `key="<label value>"` (no label when `key` is empty).
    fn add<S: Into<String>, V>(
        self,
        what: (&str, &str, MetricType),
        key: &str,
        series: impl IntoIterator<Item = (S, V)>,
        value: impl Fn(V) -> Value,
    ) -> Self {
        let series = series.into_iter().map(|(l, v)| {
            let own = (!key.is_empty()).then(|| (key.to_string(), l.into()));
            (own.into_iter().collect(), v)
        });
        self.add_labelled(what, series, value)
    }

    /// Family `name` with one series per `(its own labels, value)`.
    fn add_labelled<V>(
        mut self,
        (name, help, ty): (&str, &str, MetricType),
        series: impl IntoIterator<Item = (Labels, V)>,
        value: impl Fn(V) -> Value,
    ) -> Self {
        let series = series.into_iter().map(|(own, v)| {
            let labels = self.labels.iter().cloned().chain(own).collect();
            (labels, value(v))
        });
        let family = (name.into(), help.into(), ty, series.collect());
        self.families.push(family);
        self
    }

    /// Gauge family `name`, one series per `(labels, value)`: for series
    /// told apart by more than one label (a replica's session and address).
    pub fn labelled_gauges(
        self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, u64)>,
    ) -> Self {
        self.add_labelled((name, help, MetricType::Gauge), series, Value::Int)
    }

    /// As [`Text::labelled_gauges`] with fractional values.
    pub fn labelled_float_gauges(
        self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, f64)>,
    ) -> Self {
        self.add_labelled((name, help, MetricType::Gauge), series, Value::Float)
    }

    /// Every value `c` visits now, as `{prefix}_[{group}_]{name}`, typed by
    /// its [`Kind`] and suffixed `_total` when it is a counter (see
    /// [`exposed`]): how each stats struct's visitor becomes `/metrics`
    /// text, so the text lists exactly what the JSON reports list.
    pub fn visited(self, prefix: &str, c: &dyn Counters) -> Self {
        self.visited_each(prefix, "", [("", c)])
    }

    /// As [`Text::visited`] for several instances of one struct, told apart
    /// by label `key` (`(label value, instance)`): one family per visited
    /// value, one series per instance.
    pub fn visited_each<'a>(
        mut self,
        prefix: &str,
        key: &str,
        instances: impl IntoIterator<Item = (&'a str, &'a dyn Counters)>,
    ) -> Self {
        let mut families: Vec<(Metric, Vec<(&str, u64)>)> = Vec::new();
        for (label, c) in instances {
            let mut at = 0;
            c.visit(&mut |m| {
                if at == families.len() {
                    families.push((m, Vec::new()));
                }
                families[at].1.push((label, m.value));
                at += 1;
            });
        }
        for (m, series) in families {
            self = self.family(&base_name(prefix, &m), m.help, m.kind, key, series);
        }
        self
    }

    /// Family `name` of `kind`, one series per `(value of label key,
    /// value)` (no label when `key` is empty).
    pub fn family<S: Into<String>>(
        self,
        name: &str,
        help: &str,
        kind: Kind,
        key: &str,
        series: impl IntoIterator<Item = (S, u64)>,
    ) -> Self {
        let ty = match kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
        };
        self.add((name, help, ty), key, series, Value::Int)
    }

    /// Gauge family `name` with fractional values (see [`Text::family`]).
    pub fn float_gauges<S: Into<String>>(
        self,
        name: &str,
        help: &str,
        key: &str,
        series: impl IntoIterator<Item = (S, f64)>,
    ) -> Self {
        self.add((name, help, MetricType::Gauge), key, series, Value::Float)
    }

    /// Histogram family `name` (see [`Text::family`]).
    pub fn histograms<'a, S: Into<String>>(
        self,
        name: &str,
        help: &str,
        key: &str,
        series: impl IntoIterator<Item = (S, &'a Histogram)>,
    ) -> Self {
        self.add(
            (name, help, MetricType::Histogram),
            key,
            series,
            Histogram::now,
        )
    }

    /// The text, written by prometheus-client's Prometheus text encoder.
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut o = String::new();
        // Writing to a String cannot fail; the encoder's own checks (none
        // that a family built here can trip) would leave the text short.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut o, &registry);
        o
    }
}

/// The families as the crate encodes a collector's: a descriptor (`# HELP`,
/// `# TYPE`), then each series through the crate's own metric encoders.
impl Collector for Text {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, ty, series) in &self.families {
            let mut family = encoder.encode_descriptor(name, help, None, *ty)?;
            for (labels, v) in series {
                let mut one = family.encode_family(labels)?;
                match (ty, v) {
                    (MetricType::Counter, Value::Int(n)) => ConstCounter::new(*n).encode(one)?,
                    (_, Value::Int(n)) => ConstGauge::new(*n).encode(one)?,
                    (_, Value::Float(x)) => ConstGauge::new(*x).encode(one)?,
                    (_, Value::Histogram(sum, buckets)) => {
                        let count = buckets.iter().map(|(_, n)| n).sum();
                        one.encode_histogram::<NoLabelSet>(*sum, count, buckets, None)?
                    }
                }
            }
        }
        Ok(())
    }
}

/// `{prefix}_[{group}_]{name}`: a visited value's name before the counter
/// suffix.
fn base_name(prefix: &str, m: &Metric) -> String {
    let group = m.group.map_or(String::new(), |g| format!("{g}_"));
    format!("{prefix}_{group}{}", m.name)
}

/// The Prometheus name and type of a visited value:
/// `{prefix}_[{group}_]{name}`, suffixed `_total` when it is a counter.
pub fn exposed(prefix: &str, m: &Metric) -> (String, &'static str) {
    let (suffix, ty) = match m.kind {
        Kind::Counter => ("_total", "counter"),
        Kind::Gauge => ("", "gauge"),
    };
    (format!("{}{suffix}", base_name(prefix, m)), ty)
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
    /// `/metrics` adds families and histograms to a visitor: each page, as
    /// its command composes it (its values, its cache's, its listener's),
    /// parses, and every value each visitor lists is on it, typed and
    /// suffixed as its kind says, with its value and the page's labels; and
    /// each KV value is in the KV status under its field's name.
    #[test]
    fn every_visited_value_is_on_its_metrics_page() {
        let dir = tempfile::tempdir().unwrap();
        let cache = crate::image::cache::Cache::open(dir.path(), 1 << 20).unwrap();
        let node = crate::image::metrics::NodeMetrics::default();
        let registry = crate::image::metrics::RegistryMetrics::default();
        let kv = crate::kv::metrics::Metrics::default();
        let gateway = crate::gateway::GatewayStats::default();
        let tcp = crate::listener::ListenerStats::new("http");
        // Distinct values, so a sample read back is this value's own.
        node.resumes.add(3);
        node.peer_server.bytes_sent.add(5);
        node.chunk_size.set(7);
        registry.bytes_sent.add(11);
        kv.head.store(13, Ordering::Relaxed);
        kv.reconnects.store(17, Ordering::Relaxed);
        kv.snapshot_source_bytes.store(31, Ordering::Relaxed);
        gateway.udp_rx.add(19);
        gateway.clients_active.add(23);
        tcp.accepted.store(29, Ordering::Relaxed);
        let page = |mut text: String, cache_prefix: Option<&str>| {
            if let Some(prefix) = cache_prefix {
                cache.prometheus(prefix, &mut text);
            }
            text + &crate::listener::ListenerStats::prometheus([&tcp])
        };
        let snapshot = gateway.snapshot();
        let listener = ("qr_tcp", "{listener=\"http\"}", &tcp as &dyn Counters);
        // A page's text, and (prefix, labels, visitor) of each part.
        type Part<'a> = (&'a str, &'a str, &'a dyn Counters);
        let pages: [(String, Vec<Part>); 4] = [
            (
                page(node.render(), Some("qr_node")),
                vec![("qr_node", "", &node), ("qr_node", "", &*cache), listener],
            ),
            (
                page(registry.render(), Some("qr_registry")),
                vec![
                    ("qr_registry", "", &registry),
                    ("qr_registry", "", &*cache),
                    listener,
                ],
            ),
            (
                page(kv.prometheus("upstream"), None),
                vec![("qr_kv", "{role=\"upstream\"}", &kv), listener],
            ),
            (
                page(gateway.prometheus(), None),
                vec![("qr_gateway", "", &snapshot), listener],
            ),
        ];
        for (text, visitors) in pages {
            let e = crate::prom_text::parse(&text).unwrap();
            for (prefix, labels, c) in visitors {
                let mut n = 0;
                c.visit(&mut |m| {
                    n += 1;
                    let (name, ty) = exposed(prefix, &m);
                    assert_eq!(e.type_of(&name), Some(ty), "{name} on {prefix}'s /metrics");
                    let got = e.value(&format!("{name}{labels}"));
                    assert_eq!(got, Some(m.value as f64), "{name}{labels}");
                });
                assert!(n >= 4, "{prefix}: {n} values visited");
            }
        }
        let status = kv.status("upstream");
        kv.visit(&mut |m| assert_eq!(status[m.field], m.value, "{} in the KV status", m.field));
        assert_eq!(status["head"], 13);
        assert_eq!(status["snapshot_source_bytes"], 31);
    }

    #[test]
    fn histograms_are_cumulative() {
        let h = Histogram::new(&[0.01, 0.1]);
        for ms in [5, 50, 50, 500] {
            h.observe(Duration::from_millis(ms));
        }
        let o = Text::labelled("route", "a")
            .histograms("x_seconds", "help", "", [("", &h)])
            .render();
        for (series, want) in [
            ("_bucket{route=\"a\",le=\"0.01\"}", 1.0),
            ("_bucket{route=\"a\",le=\"0.1\"}", 3.0),
            ("_bucket{route=\"a\",le=\"+Inf\"}", 4.0),
            ("_count{route=\"a\"}", 4.0),
        ] {
            assert_eq!(sample(&o, &format!("x_seconds{series}")), Some(want));
        }
        assert!((sample(&o, "x_seconds_sum{route=\"a\"}").unwrap() - 0.605).abs() < 1e-9);
        assert_eq!(o.matches("# TYPE").count(), 1);
        // An observation on a bound falls in that bucket (le = less or equal).
        let h = Histogram::new(&[0.01]);
        h.observe(Duration::from_millis(10));
        assert_eq!(h.counts[0].load(Ordering::Relaxed), 1);
    }
}
