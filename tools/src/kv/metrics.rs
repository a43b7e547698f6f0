//! Counters and gauges of a channel end, rendered as Prometheus text and as a
//! JSON status object. Always on; updates are relaxed atomics (or one short
//! lock for the per-replica table).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// What one replica session looks like from the master.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplicaStatus {
    /// Log position the replica acknowledged (delivered).
    pub acked: u64,
    /// Log position its final consumer reports applied (0 if it does not say).
    pub applied: u64,
    /// Master's head minus `acked`, in bytes.
    pub lag_bytes: u64,
    /// How long ago the master appended the first byte the replica lacks.
    pub lag_seconds: f64,
    /// Snapshot bytes acknowledged (full syncs).
    pub snapshot_acked: u64,
    /// Whether this session began with a full sync.
    pub full: bool,
}

/// Counters of one channel end (master or replica side; the other side's
/// fields stay zero).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sessions that began with a full sync.
    pub sync_full: AtomicU64,
    /// Sessions that resumed by partial resync.
    pub sync_partial_ok: AtomicU64,
    /// Partial resyncs asked for but refused (a full sync followed).
    pub sync_partial_err: AtomicU64,
    /// Connections re-established after a loss.
    pub reconnects: AtomicU64,
    /// Snapshot bytes sent (master side) or received (replica side) on the channel.
    pub snapshot_bytes: AtomicU64,
    /// Snapshot bytes received from the data's source (the Redis master).
    pub snapshot_source_bytes: AtomicU64,
    /// Log bytes moved through this end.
    pub log_bytes: AtomicU64,
    /// Malformed inputs (frames, RESP, RDB framing) that closed a link.
    pub malformed: AtomicU64,
    /// Links closed by any error.
    pub link_errors: AtomicU64,
    /// Replica connections refused for a missing or wrong password.
    pub auth_failures: AtomicU64,
    /// Commands on the Redis port answered with an error and the connection
    /// kept (unknown commands, inline commands, bad arguments).
    pub commands_refused: AtomicU64,
    /// Bytes in the backlog now (master).
    pub backlog_bytes: AtomicU64,
    /// Head of the log now.
    pub head: AtomicU64,
    turnaround_ns_sum: AtomicU64,
    turnaround_count: AtomicU64,
    turnaround_ns_last: AtomicU64,
    replicas: Mutex<BTreeMap<u64, ReplicaStatus>>,
}

impl Metrics {
    /// Record one credit turnaround (chunk sent → ack covering it).
    pub fn turnaround(&self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.turnaround_ns_sum.fetch_add(ns, Relaxed);
        self.turnaround_count.fetch_add(1, Relaxed);
        self.turnaround_ns_last.store(ns, Relaxed);
    }

    /// Set (or add) a replica's row.
    pub fn set_replica(&self, session: u64, status: ReplicaStatus) {
        self.replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session, status);
    }

    /// Drop a replica's row when its session ends.
    pub fn remove_replica(&self, session: u64) {
        self.replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&session);
    }

    /// The replica table now.
    pub fn replicas(&self) -> BTreeMap<u64, ReplicaStatus> {
        self.replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Mean credit turnaround so far, in seconds.
    pub fn turnaround_mean(&self) -> f64 {
        let n = self.turnaround_count.load(Relaxed);
        if n == 0 {
            0.0
        } else {
            self.turnaround_ns_sum.load(Relaxed) as f64 / n as f64 / 1e9
        }
    }

    /// Prometheus text exposition (format 0.0.4), every name prefixed `qr_kv_`.
    pub fn prometheus(&self, role: &str) -> String {
        let mut s = String::new();
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP qr_kv_{name} {help}");
            let _ = writeln!(s, "# TYPE qr_kv_{name} counter");
            let _ = writeln!(s, "qr_kv_{name}{{role=\"{role}\"}} {v}");
        };
        counter(
            "sync_full",
            "Sessions begun by full sync.",
            self.sync_full.load(Relaxed),
        );
        counter(
            "sync_partial_ok",
            "Sessions resumed by partial resync.",
            self.sync_partial_ok.load(Relaxed),
        );
        counter(
            "sync_partial_err",
            "Partial resyncs refused (a full sync followed).",
            self.sync_partial_err.load(Relaxed),
        );
        counter(
            "reconnects",
            "Connections re-established.",
            self.reconnects.load(Relaxed),
        );
        counter(
            "snapshot_bytes",
            "Snapshot bytes moved.",
            self.snapshot_bytes.load(Relaxed),
        );
        counter(
            "log_bytes",
            "Log bytes moved.",
            self.log_bytes.load(Relaxed),
        );
        counter(
            "malformed",
            "Malformed inputs that closed a link.",
            self.malformed.load(Relaxed),
        );
        counter(
            "link_errors",
            "Links closed by an error.",
            self.link_errors.load(Relaxed),
        );
        counter(
            "auth_failures",
            "Replica connections refused for a missing or wrong password.",
            self.auth_failures.load(Relaxed),
        );
        counter(
            "commands_refused",
            "Commands on the Redis port answered with an error (unknown, inline, bad arguments).",
            self.commands_refused.load(Relaxed),
        );
        counter(
            "credit_turnaround_count",
            "Credit turnarounds measured.",
            self.turnaround_count.load(Relaxed),
        );
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP qr_kv_{name} {help}");
            let _ = writeln!(s, "# TYPE qr_kv_{name} gauge");
            let _ = writeln!(s, "qr_kv_{name}{{role=\"{role}\"}} {v}");
        };
        gauge(
            "backlog_bytes",
            "Bytes in the backlog.",
            self.backlog_bytes.load(Relaxed) as f64,
        );
        gauge("head", "Log head position.", self.head.load(Relaxed) as f64);
        gauge(
            "credit_turnaround_seconds_mean",
            "Mean time from sending a chunk to the ack covering it.",
            self.turnaround_mean(),
        );
        gauge(
            "credit_turnaround_seconds_last",
            "Last credit turnaround.",
            self.turnaround_ns_last.load(Relaxed) as f64 / 1e9,
        );
        let reps = self.replicas();
        let _ = writeln!(
            s,
            "# HELP qr_kv_replica_lag_bytes Log bytes a replica lacks."
        );
        let _ = writeln!(s, "# TYPE qr_kv_replica_lag_bytes gauge");
        for (id, r) in &reps {
            let _ = writeln!(
                s,
                "qr_kv_replica_lag_bytes{{role=\"{role}\",session=\"{id}\"}} {}",
                r.lag_bytes
            );
        }
        let _ = writeln!(
            s,
            "# HELP qr_kv_replica_lag_seconds Age of the oldest log byte a replica lacks."
        );
        let _ = writeln!(s, "# TYPE qr_kv_replica_lag_seconds gauge");
        for (id, r) in &reps {
            let _ = writeln!(
                s,
                "qr_kv_replica_lag_seconds{{role=\"{role}\",session=\"{id}\"}} {}",
                r.lag_seconds
            );
        }
        s
    }

    /// The same as a JSON object.
    pub fn status(&self, role: &str) -> serde_json::Value {
        serde_json::json!({
            "role": role,
            "sync_full": self.sync_full.load(Relaxed),
            "sync_partial_ok": self.sync_partial_ok.load(Relaxed),
            "sync_partial_err": self.sync_partial_err.load(Relaxed),
            "reconnects": self.reconnects.load(Relaxed),
            "snapshot_bytes": self.snapshot_bytes.load(Relaxed),
            "snapshot_source_bytes": self.snapshot_source_bytes.load(Relaxed),
            "log_bytes": self.log_bytes.load(Relaxed),
            "malformed": self.malformed.load(Relaxed),
            "link_errors": self.link_errors.load(Relaxed),
            "auth_failures": self.auth_failures.load(Relaxed),
            "commands_refused": self.commands_refused.load(Relaxed),
            "backlog_bytes": self.backlog_bytes.load(Relaxed),
            "head": self.head.load(Relaxed),
            "credit_turnaround_seconds_mean": self.turnaround_mean(),
            "replicas": self.replicas(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_every_metric() {
        let m = Metrics::default();
        m.sync_full.fetch_add(2, Relaxed);
        m.turnaround(Duration::from_millis(4));
        m.set_replica(
            7,
            ReplicaStatus {
                lag_bytes: 12,
                ..ReplicaStatus::default()
            },
        );
        let t = m.prometheus("upstream");
        assert!(t.contains("qr_kv_sync_full{role=\"upstream\"} 2\n"), "{t}");
        assert!(t.contains("qr_kv_replica_lag_bytes{role=\"upstream\",session=\"7\"} 12\n"));
        assert!(t.contains("qr_kv_credit_turnaround_seconds_mean{role=\"upstream\"} 0.004\n"));
        for name in [
            "sync_partial_ok",
            "sync_partial_err",
            "backlog_bytes",
            "reconnects",
        ] {
            assert!(t.contains(&format!("# TYPE qr_kv_{name} ")), "{name}");
        }
        assert_eq!(m.status("upstream")["replicas"]["7"]["lag_bytes"], 12);
    }
}
