//! Issue 25, item 2: the upstream relay follows the master through a
//! failover, and a replica behind the relays keeps its data and resumes
//! partially, as a direct replica of the promoted server would (PSYNC2: the
//! promoted replica keeps the old replication id as `master_replid2`).
//!
//! - Sentinel (`redis-sentinel` from Debian): the master is killed, Sentinel
//!   promotes its replica, the relay asks Sentinel
//!   (`--sentinel ... --master-name`) and links to the new master.
//! - Candidates (`--master A --master B`): an operator fails over by hand
//!   (`REPLICAOF NO ONE` on the replica, then the old master made its
//!   replica); the relay follows whichever one `ROLE` names master.
//!
//! After each: DEBUG DIGEST equal between the new master and the replica
//! behind the relays; the replica logged one full sync only (its first) and
//! a partial one after the failover; the promoted master served no full
//! sync; neither relay's full-sync count rose.
//!
//! Addresses: 127.0.113.100..104 (TCP 19340..19349) and 127.0.113.110..114
//! (TCP 19350..19359).

mod kv_support;

use std::time::Duration;

use kv_support::*;

const REDIS_ARGS: &[&str] = &[
    "--repl-diskless-sync-delay",
    "0",
    "--repl-backlog-size",
    "64mb",
];

/// `SENTINEL get-master-addr-by-name` as host:port, if known.
fn sentinel_master(sentinel: &str, name: &str) -> Option<String> {
    let mut c = Client::connect(sentinel).ok()?;
    match c.cmd(&["SENTINEL", "get-master-addr-by-name", name]) {
        Reply::Array(Some(v)) if v.len() == 2 => Some(format!("{}:{}", v[0].text(), v[1].text())),
        _ => None,
    }
}

/// A Redis Sentinel monitoring `master` as `name`, quorum 1, quick to act.
fn start_sentinel(dir: &TempDir, host: &str, port: u16, name: &str, master: &Redis) -> Proc {
    let conf = dir.path(&format!("sentinel-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind {host}\ndaemonize no\nlogfile \"\"\ndir {}\n\
             sentinel monitor {name} {} {} 1\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 4000\n",
            dir.path(".").display(),
            master.host,
            master.port
        ),
    )
    .unwrap();
    let p = Proc::spawn(
        "redis-sentinel",
        std::process::Command::new("redis-sentinel").arg(&conf),
        dir.path(&format!("sentinel-{port}.log")),
    );
    let addr = format!("{host}:{port}");
    assert!(
        wait_until(Duration::from_secs(20), || sentinel_master(&addr, name)
            == Some(master.addr())),
        "Sentinel did not start monitoring {}:\n{}",
        master.addr(),
        p.output()
    );
    p
}

/// Everything of one scenario: the servers, the relays and the replica
/// behind them, synced once.
struct Site {
    /// Removed with the site, after every process in it.
    _dir: TempDir,
    master: Redis,
    standby: Redis,
    replica: Redis,
    up: Proc,
    down: Proc,
    up_status: String,
    down_status: String,
    /// The Sentinel, if the scenario has one.
    sentinel: Option<Proc>,
}

impl Site {
    /// Addresses 127.0.113.`net`+0..4 and TCP ports from `port`; `source`
    /// gives the upstream relay's master arguments for (master, standby),
    /// and starts a Sentinel if the scenario has one.
    fn start(
        what: &str,
        net: u8,
        port: u16,
        source: impl FnOnce(&TempDir, &Redis, &Redis) -> (Vec<String>, Option<Proc>),
    ) -> Site {
        let ip = |k: u8| format!("127.0.113.{}", net + k);
        let dir = TempDir::new(what);
        let master = Redis::start(&dir, &ip(0), port, REDIS_ARGS);
        populate(&master, 20_000, 1);
        let standby = {
            let mut args = REDIS_ARGS.to_vec();
            let mp = master.port.to_string();
            // Announced, so Sentinel reaches it at the address it binds.
            args.extend(["--replicaof", &master.host, &mp]);
            let own = ip(1);
            args.extend(["--replica-announce-ip", &own]);
            Redis::start(&dir, &ip(1), port + 1, &args)
        };
        let pki = pki(&dir, &ip(2), &ip(3));
        let (source, sentinel) = source(&dir, &master, &standby);
        let source: Vec<&str> = source.iter().map(String::as_str).collect();
        let up = upstream_with(&dir, &pki, &ip(2), port + 2, port + 3, &source, &[]);
        let up_addr = format!("{}:{}", ip(2), port + 2);
        let down = downstream(&dir, &pki, &ip(3), port + 4, port + 5, &up_addr);
        let dp = (port + 4).to_string();
        let replica = Redis::start(&dir, &ip(4), port + 6, &["--replicaof", &ip(3), &dp]);
        let site = Site {
            up_status: format!("{}:{}", ip(2), port + 3),
            down_status: format!("{}:{}", ip(3), port + 5),
            _dir: dir,
            master,
            standby,
            replica,
            up,
            down,
            sentinel,
        };
        site.write("before");
        assert_same(&site.master, &site.replica, 1, &[&site.up, &site.down]);
        assert_same(&site.master, &site.standby, 1, &[]);
        site
    }

    fn write(&self, prefix: &str) {
        let server = if self.standby_is_master() {
            &self.standby
        } else {
            &self.master
        };
        let mut c = server.client();
        for i in 0..500 {
            c.ok(&["SET", &format!("{prefix}:{i}"), &i.to_string()]);
        }
        c.ok(&["INCR", &format!("{prefix}:counter")]);
    }

    fn standby_is_master(&self) -> bool {
        self.standby.client().info("replication")["role"] == "master"
    }

    fn logs(&self) -> String {
        [&self.up, &self.down, &self.replica.proc]
            .iter()
            .map(|p| format!("--- {} ---\n{}", p.name, p.output()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// After the failover to the standby: same data, partial resyncs only.
    fn check_followed(&self, old_id: &str) {
        self.write("after");
        assert_same(&self.standby, &self.replica, 1, &[&self.up, &self.down]);
        let si = self.standby.client().info("replication");
        assert_eq!(si["master_replid2"], old_id, "{si:?}");
        let ri = self.replica.client().info("replication");
        assert_eq!(
            ri["master_replid"],
            si["master_replid"],
            "{ri:?}\n{}",
            self.logs()
        );
        assert_eq!(ri["master_replid2"], old_id, "{ri:?}");
        // The promoted server served the relay by PSYNC, never a full sync.
        assert_eq!(self.standby.stat("sync_full"), 0, "{}", self.logs());
        assert!(self.standby.stat("sync_partial_ok") >= 1, "{}", self.logs());
        let log = self.replica.proc.output();
        assert_eq!(log.matches("Full resync from master").count(), 1, "{log}");
        assert!(
            log.contains("Master accepted a Partial Resynchronization"),
            "{}",
            self.logs()
        );
        let (us, ds) = (status(&self.up_status), status(&self.down_status));
        assert_eq!(us["sync_full"], 1, "{us}");
        assert_eq!(us["master_changes"], 1, "{us}");
        assert_eq!(us["master_link_up"], 1, "{us}");
        assert_eq!(ds["sync_full"], 1, "{ds}");
        let want = format!("the master is now {}", self.standby.addr());
        assert!(self.up.output().contains(&want), "{}", self.up.output());
    }
}

#[test]
fn relays_follow_a_sentinel_failover_and_the_replica_resumes_partially() {
    let mut site = Site::start("kv-failover-sentinel", 100, 19340, |dir, master, _| {
        let args = [
            // A Sentinel that is not there: asked first, skipped.
            "--sentinel",
            "127.0.113.104:19348",
            "--sentinel",
            "127.0.113.104:19349",
            "--master-name",
            "qrm",
        ];
        let sentinel = start_sentinel(dir, "127.0.113.104", 19349, "qrm", master);
        (args.map(String::from).to_vec(), Some(sentinel))
    });
    let old_id = site.master.client().info("replication")["master_replid"].clone();

    // The master dies; Sentinel promotes the standby.
    site.master.proc.kill();
    assert!(
        wait_until(Duration::from_secs(60), || sentinel_master(
            "127.0.113.104:19349",
            "qrm"
        ) == Some(site.standby.addr())
            && site.standby_is_master()),
        "Sentinel did not promote {}:\n{}",
        site.standby.addr(),
        site.sentinel.as_ref().unwrap().output()
    );
    site.check_followed(&old_id);
}

#[test]
fn relays_follow_a_failover_among_candidates() {
    let site = Site::start("kv-failover-candidates", 110, 19350, |_, m, s| {
        let args = ["--master", &m.addr(), "--master", &s.addr()];
        (args.map(String::from).to_vec(), None)
    });
    let old_id = site.master.client().info("replication")["master_replid"].clone();
    // By hand, as an operator does: promote the standby, then make the old
    // master its replica (which closes the old master's replica links).
    site.standby.client().ok(&["REPLICAOF", "NO", "ONE"]);
    let sp = site.standby.port.to_string();
    site.master
        .client()
        .ok(&["REPLICAOF", &site.standby.host, &sp]);
    site.check_followed(&old_id);
}
