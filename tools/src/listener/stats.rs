//! What a listener counts, described once: every output (Prometheus text
//! today) is generated from [`ListenerStats::visit`].

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Prometheus metric type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
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

    /// Call `f(name, kind, help, value)` for every value, in a fixed order.
    pub fn visit(&self, f: &mut dyn FnMut(&'static str, Kind, &'static str, u64)) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        f(
            "connections_accepted_total",
            Kind::Counter,
            "TCP connections accepted and given a slot.",
            get(&self.accepted),
        );
        f(
            "connections_evicted_total",
            Kind::Counter,
            "Idle TCP connections closed to make room for a new one.",
            get(&self.evicted),
        );
        f(
            "connections_refused_total",
            Kind::Counter,
            "TCP connections closed at once because every slot was in a request.",
            get(&self.refused),
        );
        f(
            "connections_timed_out_total",
            Kind::Counter,
            "TCP connections dropped by the request or stall timeout.",
            get(&self.timed_out),
        );
        f(
            "accept_errors_total",
            Kind::Counter,
            "accept() failures (the listener goes on).",
            get(&self.accept_errors),
        );
        f(
            "connections_open",
            Kind::Gauge,
            "TCP connections holding a slot now.",
            get(&self.open),
        );
    }

    /// Prometheus text (format 0.0.4) of `listeners`: one family per value,
    /// `qr_tcp_<name>{listener="<label>"}`, a series per listener.
    pub fn prometheus<'a>(listeners: impl IntoIterator<Item = &'a ListenerStats>) -> String {
        let mut families: Vec<(String, Vec<String>)> = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let mut at = 0;
            l.visit(&mut |name, kind, help, v| {
                if i == 0 {
                    let ty = match kind {
                        Kind::Counter => "counter",
                        Kind::Gauge => "gauge",
                    };
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
        s.visit(&mut |name, kind, _, _| {
            n += 1;
            let full = format!("qr_tcp_{name}");
            let want = if kind == Kind::Counter {
                "counter"
            } else {
                "gauge"
            };
            assert_eq!(e.type_of(&full), Some(want), "{full}");
            assert!(e.value(&format!("{full}{{listener=\"http\"}}")).is_some());
            assert!(e.value(&format!("{full}{{listener=\"resp\"}}")).is_some());
            assert_eq!(name.ends_with("_total"), kind == Kind::Counter, "{name}");
        });
        assert_eq!(2 * n, e.samples.len());
        assert_eq!(
            e.value("qr_tcp_connections_accepted_total{listener=\"http\"}"),
            Some(3.0)
        );
    }
}
