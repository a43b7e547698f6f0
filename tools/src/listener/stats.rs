//! What a listener counts, described once: every output (Prometheus text
//! today) is generated from its [`Counters`] visitor.

use std::sync::atomic::AtomicU64;

use quic_rdma::counters::{Counters, Metric};

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

    /// Prometheus text of `listeners`: one family per value,
    /// `qr_tcp_<name>{listener="<label>"}`, a series per listener.
    pub fn prometheus<'a>(listeners: impl IntoIterator<Item = &'a ListenerStats>) -> String {
        crate::metric::Text::default()
            .visited_each(
                "qr_tcp",
                "listener",
                listeners.into_iter().map(|l| (l.label, l as &dyn Counters)),
            )
            .render()
    }
}

/// The atomics are read in place; each is exported under the name after
/// `=>`.
impl Counters for ListenerStats {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            accepted => connections_accepted: Counter, Count, "TCP connections accepted and given a slot.";
            evicted => connections_evicted: Counter, Count, "Idle TCP connections closed to make room for a new one.";
            refused => connections_refused: Counter, Count, "TCP connections closed at once because every slot was in a request.";
            timed_out => connections_timed_out: Counter, Count, "TCP connections dropped by the request or stall timeout.";
            accept_errors: Counter, Count, "accept() failures (the listener goes on).";
            open => connections_open: Gauge, Count, "TCP connections holding a slot now.";
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

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
            let (full, want) = crate::metric::exposed("qr_tcp", &m);
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
