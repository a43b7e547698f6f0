//! Counters and gauges of a channel end, rendered as Prometheus text and as a
//! JSON status object. Always on; updates are relaxed atomics (or one short
//! lock for the per-replica table).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use quic_rdma::counters::{Counters, Metric};
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

/// Upper bounds (seconds) of the credit turnaround histogram's buckets:
/// loopback (sub-millisecond) to a congested WAN (seconds).
pub const TURNAROUND_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

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
    /// Head of the log now (a replication offset, in bytes; on the replica
    /// side, the furthest position delivered).
    pub head: AtomicU64,
    turnaround_ns_sum: AtomicU64,
    turnaround_count: AtomicU64,
    /// Turnarounds at or under each of [`TURNAROUND_BUCKETS`] (not cumulative).
    turnaround_buckets: [AtomicU64; TURNAROUND_BUCKETS.len()],
    replicas: Mutex<BTreeMap<u64, ReplicaStatus>>,
}

impl Metrics {
    /// Record one credit turnaround (chunk sent → ack covering it).
    pub fn turnaround(&self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.turnaround_ns_sum.fetch_add(ns, Relaxed);
        self.turnaround_count.fetch_add(1, Relaxed);
        let secs = d.as_secs_f64();
        if let Some(i) = TURNAROUND_BUCKETS.iter().position(|&le| secs <= le) {
            self.turnaround_buckets[i].fetch_add(1, Relaxed);
        }
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

    /// Prometheus text exposition (format 0.0.4), every name prefixed
    /// `qr_kv_`, counters suffixed `_total` and units in the names
    /// (Prometheus naming conventions), every series labelled `role`.
    pub fn prometheus(&self, role: &str) -> String {
        let mut s = String::new();
        crate::metric::visited_labelled(&mut s, "qr_kv", &format!("role=\"{role}\""), self);
        let h = "qr_kv_credit_turnaround_seconds";
        let _ = writeln!(
            s,
            "# HELP {h} Time from sending a chunk to the ack covering it."
        );
        let _ = writeln!(s, "# TYPE {h} histogram");
        let mut cumulative = 0;
        for (le, n) in TURNAROUND_BUCKETS.iter().zip(&self.turnaround_buckets) {
            cumulative += n.load(Relaxed);
            let _ = writeln!(s, "{h}_bucket{{role=\"{role}\",le=\"{le}\"}} {cumulative}");
        }
        let count = self.turnaround_count.load(Relaxed);
        let _ = writeln!(s, "{h}_bucket{{role=\"{role}\",le=\"+Inf\"}} {count}");
        let sum = self.turnaround_ns_sum.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(s, "{h}_sum{{role=\"{role}\"}} {sum}");
        let _ = writeln!(s, "{h}_count{{role=\"{role}\"}} {count}");
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

    /// The same as a JSON object: the visited values under their metric
    /// names, plus what the status has always carried beside them — the log
    /// head as `head`, `snapshot_source_bytes` (not exported as a metric),
    /// the mean turnaround and the replica table. Keys kept as they were:
    /// scripts and tests read them.
    pub fn status(&self, role: &str) -> serde_json::Value {
        let mut o = serde_json::Map::new();
        self.visit(&mut |m| {
            // `log_head_bytes` has always been `head` in the status.
            let key = if m.name == "log_head_bytes" {
                "head"
            } else {
                m.name
            };
            o.insert(key.into(), m.value.into());
        });
        o.insert(
            "snapshot_source_bytes".into(),
            self.snapshot_source_bytes.load(Relaxed).into(),
        );
        o.insert("role".into(), role.into());
        o.insert(
            "credit_turnaround_seconds_mean".into(),
            self.turnaround_mean().into(),
        );
        o.insert(
            "replicas".into(),
            serde_json::to_value(self.replicas()).unwrap_or_default(),
        );
        serde_json::Value::Object(o)
    }
}

/// The plain counters and gauges (the histogram and the per-replica gauges
/// are written by [`Metrics::prometheus`]); each name is `qr_kv_` + this one.
impl Counters for Metrics {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            sync_full: Counter, Count, "Sessions begun by full sync.";
            sync_partial_ok: Counter, Count, "Sessions resumed by partial resync.";
            sync_partial_err: Counter, Count, "Partial resyncs refused (a full sync followed).";
            reconnects: Counter, Count, "Connections re-established.";
            snapshot_bytes: Counter, Bytes, "Snapshot bytes moved.";
            log_bytes: Counter, Bytes, "Log bytes moved.";
            malformed: Counter, Count, "Malformed inputs that closed a link.";
            link_errors: Counter, Count, "Links closed by an error.";
            auth_failures: Counter, Count, "Replica connections refused for a missing or wrong password.";
            commands_refused: Counter, Count, "Commands on the Redis port answered with an error (unknown, inline, bad arguments).";
            backlog_bytes: Gauge, Bytes, "Bytes in the backlog.";
            head => log_head_bytes: Gauge, Bytes, "Log head: the replication offset, in bytes.";
        );
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
        assert!(
            t.contains("qr_kv_sync_full_total{role=\"upstream\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("qr_kv_replica_lag_bytes{role=\"upstream\",session=\"7\"} 12\n"));
        // 4 ms: above the 2.5 ms bucket, within 5 ms and every one after.
        let h = "qr_kv_credit_turnaround_seconds";
        assert!(t.contains(&format!("# TYPE {h} histogram\n")), "{t}");
        assert!(t.contains(&format!(
            "{h}_bucket{{role=\"upstream\",le=\"0.0025\"}} 0\n"
        )));
        assert!(t.contains(&format!("{h}_bucket{{role=\"upstream\",le=\"0.005\"}} 1\n")));
        assert!(t.contains(&format!("{h}_bucket{{role=\"upstream\",le=\"+Inf\"}} 1\n")));
        assert!(t.contains(&format!("{h}_sum{{role=\"upstream\"}} 0.004\n")));
        assert!(t.contains(&format!("{h}_count{{role=\"upstream\"}} 1\n")));
        assert!(!t.contains("_mean") && !t.contains("_last"));
        for name in [
            "sync_partial_ok_total",
            "sync_partial_err_total",
            "backlog_bytes",
            "log_head_bytes",
            "reconnects_total",
        ] {
            assert!(t.contains(&format!("# TYPE qr_kv_{name} ")), "{name}");
        }
        assert_eq!(m.status("upstream")["replicas"]["7"]["lag_bytes"], 12);
    }
}
