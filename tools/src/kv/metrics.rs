//! Counters and gauges of a channel end, rendered as Prometheus text and as a
//! JSON status object. Always on; updates are relaxed atomics (or one short
//! lock for the per-replica table).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quic_rdma::counters::{Counters, Metric};
use serde::Serialize;

use crate::metric::{Histogram, Text};

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
    /// Who the replica is, for people and dashboards: at a downstream relay
    /// the Redis replica's address as Redis's `INFO` shows it (its announced
    /// or peer IP and its `REPLCONF listening-port`); at the upstream relay
    /// the downstream relay's certificate name (else its fabric address).
    pub peer: String,
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
    /// 1 while the upstream relay follows the Redis master's command stream
    /// (after `PSYNC`, and the snapshot if one came), else 0.
    pub master_link_up: AtomicU64,
    /// Times the upstream relay moved to another server as the master (a
    /// failover followed).
    pub master_changes: AtomicU64,
    /// Kept snapshots a restarted upstream relay served again.
    pub stored_snapshot_restored: AtomicU64,
    /// Kept snapshots found unusable at start (changed on disk, another
    /// history, or older than the master's backlog) and removed.
    pub stored_snapshot_refused: AtomicU64,
    /// Bytes in the backlog now (master).
    pub backlog_bytes: AtomicU64,
    /// Head of the log now (a replication offset, in bytes; on the replica
    /// side, the furthest position delivered).
    pub head: AtomicU64,
    /// Credit turnarounds (chunk sent → ack covering it).
    turnaround: Turnaround,
    replicas: Mutex<BTreeMap<u64, ReplicaStatus>>,
}

/// The turnaround histogram, over [`TURNAROUND_BUCKETS`].
#[derive(Debug)]
struct Turnaround(Histogram);

impl Default for Turnaround {
    fn default() -> Self {
        Turnaround(Histogram::new(&TURNAROUND_BUCKETS))
    }
}

impl Metrics {
    /// Record one credit turnaround (chunk sent → ack covering it).
    pub fn turnaround(&self, d: Duration) {
        self.turnaround.0.observe(d);
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
        self.turnaround.0.mean()
    }

    /// Prometheus text, every name prefixed `qr_kv_`, counters suffixed
    /// `_total` and units in the names (Prometheus naming conventions),
    /// every series labelled `role`: the visited values, the turnaround
    /// histogram and the per-replica lag gauges.
    pub fn prometheus(&self, role: &str) -> String {
        let reps: Vec<(u64, ReplicaStatus)> = self.replicas().into_iter().collect();
        let text = Text::labelled("role", role)
            .visited("qr_kv", self)
            .histograms(
                "qr_kv_credit_turnaround_seconds",
                "Time from sending a chunk to the ack covering it.",
                "",
                [("", &self.turnaround.0)],
            );
        with_replica_gauges(text, &reps).render()
    }

    /// Prometheus text of an end serving several datasets (a Redis
    /// Cluster's shards): `self` counts what belongs to no shard (the
    /// connection, refused sessions) under `shard=""`, each shard's own
    /// counters under `shard="<its slot ranges>"`; the per-replica gauges are
    /// keyed by session, whose ids are unique in the process.
    pub fn prometheus_shards(&self, role: &str, shards: &[(String, Arc<Metrics>)]) -> String {
        let all: Vec<(&str, &Metrics)> = std::iter::once(("", self))
            .chain(shards.iter().map(|(n, m)| (n.as_str(), &**m)))
            .collect();
        let reps: Vec<(u64, ReplicaStatus)> = all.iter().flat_map(|(_, m)| m.replicas()).collect();
        let text = Text::labelled("role", role)
            .visited_each(
                "qr_kv",
                "shard",
                all.iter().map(|&(n, m)| (n, m as &dyn Counters)),
            )
            .histograms(
                "qr_kv_credit_turnaround_seconds",
                "Time from sending a chunk to the ack covering it.",
                "shard",
                all.iter().map(|&(n, m)| (n, &m.turnaround.0)),
            );
        with_replica_gauges(text, &reps).render()
    }

    /// [`Metrics::status`] of an end serving several datasets: `self`'s
    /// keys, and `shards` mapping each shard's name to its own status.
    pub fn status_shards(
        &self,
        role: &str,
        shards: &[(String, Arc<Metrics>)],
    ) -> serde_json::Value {
        let mut o = self.status(role);
        let each: serde_json::Map<String, serde_json::Value> = shards
            .iter()
            .map(|(n, m)| (n.clone(), m.status(role)))
            .collect();
        o["shards"] = serde_json::Value::Object(each);
        o
    }

    /// The same as a JSON object: the visited values keyed by their fields
    /// (so the log head is `head`, as the status has always had it), the
    /// role, the mean turnaround and the replica table. Keys kept as they
    /// were: scripts and tests read them.
    pub fn status(&self, role: &str) -> serde_json::Value {
        let mut o = serde_json::Map::new();
        self.visit(&mut |m| {
            o.insert(m.field.into(), m.value.into());
        });
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
/// are added by [`Metrics::prometheus`]); each name is `qr_kv_` + this one,
/// each `/status` key the field's.
impl Counters for Metrics {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            sync_full: Counter, Count, "Sessions begun by full sync.";
            sync_partial_ok: Counter, Count, "Sessions resumed by partial resync.";
            sync_partial_err: Counter, Count, "Partial resyncs refused (a full sync followed).";
            reconnects: Counter, Count, "Connections re-established.";
            snapshot_bytes: Counter, Bytes, "Snapshot bytes moved.";
            snapshot_source_bytes: Counter, Bytes, "Snapshot bytes received from the data's source (the Redis master).";
            log_bytes: Counter, Bytes, "Log bytes moved.";
            malformed: Counter, Count, "Malformed inputs that closed a link.";
            link_errors: Counter, Count, "Links closed by an error.";
            auth_failures: Counter, Count, "Replica connections refused for a missing or wrong password.";
            commands_refused: Counter, Count, "Commands on the Redis port answered with an error (unknown, inline, bad arguments).";
            master_link_up: Gauge, Count, "1 while the upstream relay follows the Redis master's command stream, else 0.";
            master_changes: Counter, Count, "Times the upstream relay followed the master to another server (failovers).";
            stored_snapshot_restored: Counter, Count, "Snapshots kept on disk by a previous process and served again after a restart.";
            stored_snapshot_refused: Counter, Count, "Kept snapshots refused at start (changed on disk, another history, older than the master's backlog).";
            backlog_bytes: Gauge, Bytes, "Bytes in the backlog.";
            head => log_head_bytes: Gauge, Bytes, "Log head: the replication offset, in bytes.";
        );
    }
}

/// `text` with the per-replica lag gauges added, labelled by session (ids
/// unique in the process) and by who the replica is ([`ReplicaStatus::peer`]).
fn with_replica_gauges(text: Text, reps: &[(u64, ReplicaStatus)]) -> Text {
    let labels = |id: &u64, r: &ReplicaStatus| {
        vec![
            ("session".to_string(), id.to_string()),
            ("replica".to_string(), r.peer.clone()),
        ]
    };
    text.labelled_gauges(
        "qr_kv_replica_lag_bytes",
        "Log bytes a replica lacks.",
        reps.iter().map(|(id, r)| (labels(id, r), r.lag_bytes)),
    )
    .labelled_float_gauges(
        "qr_kv_replica_lag_seconds",
        "Age of the oldest log byte a replica lacks.",
        reps.iter().map(|(id, r)| (labels(id, r), r.lag_seconds)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn prometheus_text_names_every_metric() {
        let m = Metrics::default();
        m.sync_full.fetch_add(2, Relaxed);
        m.turnaround(Duration::from_millis(4));
        m.set_replica(
            7,
            ReplicaStatus {
                lag_bytes: 12,
                peer: "10.0.0.5:6380".into(),
                ..ReplicaStatus::default()
            },
        );
        let t = m.prometheus("upstream");
        assert!(
            t.contains("qr_kv_sync_full_total{role=\"upstream\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "qr_kv_replica_lag_bytes{role=\"upstream\",session=\"7\",replica=\"10.0.0.5:6380\"} 12\n"
            ),
            "{t}"
        );
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
        assert_eq!(m.status("upstream")["replicas"]["7"]["lag_bytes"], 12);
        assert_eq!(
            m.status("upstream")["replicas"]["7"]["peer"],
            "10.0.0.5:6380"
        );
    }
}
