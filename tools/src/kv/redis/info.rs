//! What `INFO` and `ROLE` answer on the downstream relay's Redis port: the
//! relay is a master to its replicas, so it reports as one, with the field
//! names of Redis's own INFO (https://redis.io/docs/latest/commands/info/)
//! and ROLE (https://redis.io/docs/latest/commands/role/) replies, which
//! monitoring tools parse (a Prometheus Redis exporter reads `INFO ALL` for
//! `role:`, `connected_slaves:`, `slaveN:ip=…,port=…,state=…,offset=…,lag=…`,
//! `master_repl_offset:` and `master_replid:`).

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::clients::{Client, ReplicaState};
use super::history::{Ids, NO_REPLID};
use super::reply::Reply;
use crate::kv::metrics::Metrics;

/// Facts about this relay process that INFO server reports.
#[derive(Clone, Debug)]
pub struct Server {
    /// `run_id`: 40 random hex digits, new each start (as Redis's).
    pub run_id: String,
    /// When the process started serving.
    pub started: Instant,
    /// The Redis port's TCP port.
    pub tcp_port: u16,
    /// The most connections the port keeps (`--tcp-max-connections`).
    pub maxclients: usize,
}

impl Server {
    /// A new run id, started now.
    pub fn new(tcp_port: u16, maxclients: usize) -> Server {
        use rand::Rng;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut rng = rand::thread_rng();
        let run_id = (0..40).map(|_| HEX[rng.gen_range(0..16)] as char).collect();
        Server {
            run_id,
            started: Instant::now(),
            tcp_port,
            maxclients,
        }
    }
}

/// Everything INFO and ROLE read, at one moment.
#[derive(Debug)]
pub struct View<'a> {
    /// The process.
    pub server: &'a Server,
    /// The port's connections.
    pub clients: &'a [Client],
    /// The replication history served.
    pub ids: Ids,
    /// The relay's counters.
    pub metrics: &'a Metrics,
}

/// Sections `INFO` with no argument (or `default`) shows.
const DEFAULT: &[&str] = &["server", "clients", "stats", "replication", "keyspace"];

/// The INFO text for `sections` (names as the client gave them; none means
/// the default set; `all` and `everything` mean every section). Unknown
/// sections are left out, as Redis does.
pub fn info(view: &View<'_>, sections: &[String]) -> String {
    let wanted: Vec<String> = sections.iter().map(|s| s.to_ascii_lowercase()).collect();
    let every = wanted
        .iter()
        .any(|s| matches!(s.as_str(), "all" | "everything" | "default"));
    let show = |name: &str| wanted.is_empty() || every || wanted.iter().any(|s| s == name);
    let mut out = Vec::new();
    for &name in DEFAULT {
        if show(name) {
            out.push(section(view, name));
        }
    }
    out.join("\r\n")
}

fn section(v: &View<'_>, name: &str) -> String {
    let mut s = String::new();
    let mut field = |k: &str, val: &dyn std::fmt::Display| {
        let _ = write!(s, "{k}:{val}\r\n");
    };
    match name {
        "server" => {
            let up = v.server.started.elapsed().as_secs();
            field("redis_version", &env!("CARGO_PKG_VERSION"));
            field("redis_mode", &"standalone");
            field("qr_kv_relay", &"downstream");
            field("arch_bits", &(usize::BITS));
            field("process_id", &std::process::id());
            field("run_id", &v.server.run_id);
            field("tcp_port", &v.server.tcp_port);
            field("uptime_in_seconds", &up);
            field("uptime_in_days", &(up / 86_400));
        }
        "clients" => {
            field("connected_clients", &v.clients.len());
            field("maxclients", &v.server.maxclients);
            field("blocked_clients", &0);
            field("tracking_clients", &0);
        }
        "stats" => {
            field("sync_full", &v.metrics.sync_full.load(Relaxed));
            field("sync_partial_ok", &v.metrics.sync_partial_ok.load(Relaxed));
            field(
                "sync_partial_err",
                &v.metrics.sync_partial_err.load(Relaxed),
            );
        }
        "replication" => replication(v, &mut field),
        _ => {}
    }
    let title = match name {
        "server" => "Server",
        "clients" => "Clients",
        "stats" => "Stats",
        "replication" => "Replication",
        _ => "Keyspace",
    };
    format!("# {title}\r\n{s}")
}

/// INFO replication as a master writes it (replication.c `genRedisInfoString`).
fn replication(v: &View<'_>, field: &mut dyn FnMut(&str, &dyn std::fmt::Display)) {
    let replicas: Vec<&Client> = v.clients.iter().filter(|c| c.replica.is_some()).collect();
    field("role", &"master");
    field("connected_slaves", &replicas.len());
    for (i, c) in replicas.iter().enumerate() {
        let Some(r) = &c.replica else { continue };
        field(
            &format!("slave{i}"),
            &format_args!(
                "ip={},port={},state={},offset={},lag={}",
                c.replica_ip(),
                c.listening_port,
                r.state.as_str(),
                r.ack,
                r.ack_at.elapsed().as_secs()
            ),
        );
    }
    field("master_failover_state", &"no-failover");
    field(
        "master_replid",
        &v.ids.replid.as_deref().unwrap_or(NO_REPLID),
    );
    let previous = v.ids.previous.as_ref();
    field(
        "master_replid2",
        &previous.map_or(NO_REPLID, |p| p.replid.as_str()),
    );
    field("master_repl_offset", &v.ids.offset);
    // Redis shows the first offset *not* valid under replid2 (its
    // `second_replid_offset` is the PSYNC argument's bound, one past the
    // last byte): our last valid position plus one.
    match previous {
        Some(p) => field("second_repl_offset", &(p.position + 1)),
        None => field("second_repl_offset", &-1),
    }
    // The backlog lives on the upstream relay; this one keeps none.
    field("repl_backlog_active", &0);
    field("repl_backlog_size", &0);
    field("repl_backlog_first_byte_offset", &0);
    field("repl_backlog_histlen", &0);
}

/// ROLE as a master answers it: `master`, its offset, and each online
/// replica as `[ip, port, acknowledged offset]` (bulk strings, as Redis's
/// `roleCommand` sends them).
pub fn role(view: &View<'_>) -> Reply {
    let replicas = view
        .clients
        .iter()
        .filter_map(|c| {
            let r = c.replica.as_ref()?;
            (r.state == ReplicaState::Online).then(|| {
                Reply::Array(vec![
                    Reply::bulk(c.replica_ip()),
                    Reply::bulk(c.listening_port.to_string()),
                    Reply::bulk(r.ack.to_string()),
                ])
            })
        })
        .collect();
    Reply::Array(vec![
        Reply::bulk("master"),
        Reply::Int(view.ids.offset as i64),
        Reply::Array(replicas),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::redis::clients::ReplicaLink;

    fn client(id: u64, replica: Option<ReplicaState>) -> Client {
        let now = Instant::now();
        Client {
            id,
            addr: Some("127.0.0.9:5000".parse().unwrap()),
            laddr: None,
            name: None,
            since: now,
            active: now,
            last_cmd: "ping".into(),
            listening_port: 6390,
            announced_ip: None,
            replica: replica.map(|state| ReplicaLink {
                state,
                ack: 77,
                ack_at: now,
            }),
        }
    }

    #[test]
    fn a_master_s_fields_and_role() {
        let server = Server::new(6380, 512);
        let metrics = Metrics::default();
        let clients = [
            client(1, None),
            client(2, Some(ReplicaState::Online)),
            client(3, Some(ReplicaState::SendBulk)),
        ];
        let view = View {
            server: &server,
            clients: &clients,
            ids: Ids {
                replid: Some("a".repeat(40)),
                offset: 99,
                previous: None,
            },
            metrics: &metrics,
        };
        let text = info(&view, &["replication".into()]);
        assert!(text.starts_with("# Replication\r\nrole:master\r\nconnected_slaves:2\r\n"));
        assert!(text.contains("slave0:ip=127.0.0.9,port=6390,state=online,offset=77,lag=0\r\n"));
        assert!(text.contains("slave1:ip=127.0.0.9,port=6390,state=send_bulk,"));
        assert!(text.contains(&format!("master_replid:{}\r\n", "a".repeat(40))));
        assert!(text.contains(&format!("master_replid2:{NO_REPLID}\r\n")));
        assert!(text.contains("master_repl_offset:99\r\nsecond_repl_offset:-1\r\n"));
        assert!(!text.contains("# Server"));
        let all = info(&view, &["ALL".into()]);
        for s in [
            "# Server",
            "# Clients",
            "# Stats",
            "# Replication",
            "# Keyspace",
        ] {
            assert!(all.contains(s), "{s}");
        }
        assert!(all.contains("connected_clients:3\r\n"));
        assert_eq!(info(&view, &["nosuch".into()]), "");
        // Only the online replica is listed, as [ip, port, offset].
        assert_eq!(
            role(&view).encode(),
            b"*3\r\n$6\r\nmaster\r\n:99\r\n*1\r\n*3\r\n$9\r\n127.0.0.9\r\n$4\r\n6390\r\n$2\r\n77\r\n"
                .to_vec()
        );
    }
}
