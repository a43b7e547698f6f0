//! What a listener counts, described once: every output (Prometheus text
//! today) is generated from its [`Counters`] visitor.

use std::sync::atomic::{AtomicU64, Ordering};

use quic_rdma::counters::{Counters, Kind, Metric};

/// Counters of one TCP listener.
#[derive(Debug)]
pub struct ListenerStats {
    /// The `listener` label of its series (`http`, `resp`).
    label: &'static str,
    /// Connections accepted and given a slot.
    pub(crate) accepted: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub(crate) evicted: AtomicU64,
    /// Connections closed at once because every slot was in a request.
    pub(crate) refused: AtomicU64,
    /// `accept` failures (EMFILE, ECONNABORTED, ...); the loop goes on.
    pub(crate) accept_errors: AtomicU64,
    /// Connections dropped by the request or stall timeout.
    pub(crate) timed_out: AtomicU64,
    /// Connections holding a slot now (an evicted one may take a moment
    /// more to close).
    pub(crate) open: AtomicU64,
}

impl ListenerStats {
    /// Zeroed counters for the listener labelled `label`.
    pub fn new(label: &'static str) -> Self {
        Self {
            label,
            accepted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            open: AtomicU64::new(0),
        }
    }

    /// Prometheus text (format 0.0.4) of `listeners`: one family per value,
    /// `qr_tcp_<name>{listener="<label>"}`, a series per listener.
    pub fn prometheus<'a>(listeners: impl IntoIterator<Item = &'a ListenerStats>) -> String {
        let mut families: Vec<(String, Vec<String>)> = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let mut at = 0;
            l.visit(&mut |m| {
                let (name, help, v) = (m.name, m.help, m.value);
                // Counters carry `_total`, gauges not (Prometheus naming).
                let (name, ty) = match m.kind {
                    Kind::Counter => (format!("{name}_total"), "counter"),
                    Kind::Gauge => (name.to_string(), "gauge"),
                };
                if i == 0 {
                    let head = format!("# HELP qr_tcp_{name} {help}\n# TYPE qr_tcp_{name} {ty}\n");
                    families.push((head, Vec::new()));
                }
                families[at]
                    .1
                    .push(format!("qr_tcp_{name}{{listener=\"{}\"}} {v}\n", l.label));
                at += 1;
            });
        }
        let mut out = String::new();
        for (head, series) in families {
            out.push_str(&head);
            series.iter().for_each(|s| out.push_str(s));
        }
        out
    }
}

/// Read through a plain copy so [`visit_fields!`](quic_rdma::visit_fields)
/// names each value after its field.
impl Counters for ListenerStats {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        struct Now {
            connections_accepted: u64,
            connections_evicted: u64,
            connections_refused: u64,
            connections_timed_out: u64,
            accept_errors: u64,
            connections_open: u64,
        }
        let now = Now {
            connections_accepted: get(&self.accepted),
            connections_evicted: get(&self.evicted),
            connections_refused: get(&self.refused),
            connections_timed_out: get(&self.timed_out),
            accept_errors: get(&self.accept_errors),
            connections_open: get(&self.open),
        };
        quic_rdma::visit_fields!(f, now, None;
            connections_accepted: Counter, Count, "TCP connections accepted and given a slot.";
            connections_evicted: Counter, Count, "Idle TCP connections closed to make room for a new one.";
            connections_refused: Counter, Count, "TCP connections closed at once because every slot was in a request.";
            connections_timed_out: Counter, Count, "TCP connections dropped by the request or stall timeout.";
            accept_errors: Counter, Count, "accept() failures (the listener goes on).";
            connections_open: Gauge, Count, "TCP connections holding a slot now.";
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_exported_and_typed() {
        let s = ListenerStats::new("http");
        s.accepted.store(3, Ordering::Relaxed);
        let resp = ListenerStats::new("resp");
        let text = ListenerStats::prometheus([&s, &resp]);
        let e = crate::prom_text::parse(&text).unwrap();
        let mut n = 0;
        s.visit(&mut |m| {
            n += 1;
            let counter = m.kind == Kind::Counter;
            let full = format!("qr_tcp_{}{}", m.name, if counter { "_total" } else { "" });
            let want = if counter { "counter" } else { "gauge" };
            assert_eq!(e.type_of(&full), Some(want), "{full}");
            assert!(e.value(&format!("{full}{{listener=\"http\"}}")).is_some());
            assert!(e.value(&format!("{full}{{listener=\"resp\"}}")).is_some());
        });
        assert_eq!(2 * n, e.samples.len());
        assert_eq!(
            e.value("qr_tcp_connections_accepted_total{listener=\"http\"}"),
            Some(3.0)
        );
    }
}
