//! Issue 25, "Beyond one master": one `qr kv-relay` pair replicates every
//! shard of a three-master Redis Cluster (Debian's redis-server,
//! cluster-enabled) to a plain standby per shard at the other site. The
//! upstream relay finds the shards with `CLUSTER SHARDS` and follows each
//! shard's master in its own session; every session travels on the one QUIC
//! connection between the relays; the downstream relay serves each shard on
//! a listener of its own (`--shard SLOTS=ADDR`).
//!
//! Checked: DEBUG DIGEST of each standby equals its shard master's; then a
//! `CLUSTER FAILOVER` on the replica of shard 0-5460, more writes, and the
//! relay followed (per-shard `master_changes` in /status), the standby's
//! digest equals the new master's, and it resumed partially (its log shows
//! one full sync, its first; the promoted master served no full sync; the
//! relays' full-sync counts did not rise), and a replica asking for a shard
//! the upstream does not serve is refused.
//!
//! Addresses: 127.0.125.1..4, TCP 19401..19429 (cluster bus 29401..29404).

mod kv_support;

use std::time::Duration;

use kv_support::*;

const H: &str = "127.0.125.1";
const STANDBY_IP: &str = "127.0.125.2";
const UP_IP: &str = "127.0.125.3";
const DOWN_IP: &str = "127.0.125.4";

/// The shards as the cluster is built, by name (`CLUSTER SHARDS` slot ranges).
const SHARDS: [(&str, u16, u16); 3] = [
    ("0-5460", 0, 5460),
    ("5461-10922", 5461, 10922),
    ("10923-16383", 10923, 16383),
];

/// CRC16-XMODEM of a key (Redis Cluster spec, "Key distribution model"):
/// its hash slot is this mod 16384 (no hash tags in the keys written here).
fn slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in key.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

fn shard_of(key: &str) -> usize {
    let s = slot(key);
    SHARDS
        .iter()
        .position(|&(_, a, b)| (a..=b).contains(&s))
        .unwrap()
}

fn cluster_node(dir: &TempDir, port: u16) -> Redis {
    Redis::start(
        dir,
        H,
        port,
        &[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "3000",
            // Outgoing bus links from our address, not 127.0.0.1: peers
            // learn a node's address from where its MEET came from.
            "--bind-source-addr",
            H,
            // Which then is not 127.0.0.1, the one address protected mode
            // admits without a password.
            "--protected-mode",
            "no",
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "64mb",
        ],
    )
}

fn cluster_info(r: &Redis) -> String {
    r.client().ok(&["CLUSTER", "INFO"])
}

/// Every node sees every other and all slots served.
fn cluster_ready(nodes: &[&Redis]) -> bool {
    nodes.iter().all(|n| {
        let i = cluster_info(n);
        i.contains("cluster_state:ok")
            && i.contains(&format!("cluster_known_nodes:{}", nodes.len()))
    })
}

fn why_not_ready(nodes: &[&Redis]) -> String {
    nodes
        .iter()
        .map(|n| format!("--- {} ---\n{}", n.addr(), cluster_info(n)))
        .collect()
}

/// `n` keys `{prefix}:{i}` of three types, each sent to its shard's master
/// (pipelined per master); the last one an INCR per shard.
fn write(masters: &[&Redis; 3], prefix: &str, n: usize) {
    let mut clients: Vec<Client> = masters.iter().map(|m| m.client()).collect();
    let mut sent = [0usize; 3];
    for i in 0..n {
        let k = format!("{prefix}:{i}");
        let s = shard_of(&k);
        let v = i.to_string();
        let cmd: Vec<&str> = match i % 3 {
            0 => vec!["SET", &k, &v],
            1 => vec!["HSET", &k, "f", &v],
            _ => vec!["RPUSH", &k, &v, "x"],
        };
        let a: Vec<&[u8]> = cmd.iter().map(|x| x.as_bytes()).collect();
        clients[s].send(&a);
        sent[s] += 1;
    }
    for (c, n) in clients.iter_mut().zip(sent) {
        for _ in 0..n {
            let r = c.read();
            assert!(!matches!(r, Reply::Error(_)), "{r:?}");
        }
    }
}

/// Wait until `standby` has processed all `master` has, then require equal
/// DEBUG DIGEST (and DBSIZE, not empty).
fn same(master: &Redis, standby: &Redis, logs: &[&Proc]) {
    let size = same_digest(master, standby, logs);
    assert!(size.parse::<u64>().unwrap() > 100, "{size}");
}

#[test]
fn one_relay_pair_replicates_every_shard_and_follows_a_failover_in_one() {
    // The CRC16-XMODEM check value (0x31C3 < 16384, so also its slot).
    assert_eq!(slot("123456789"), 0x31C3, "CRC16 check value");
    let dir = TempDir::new("kv-cluster");
    let nodes: Vec<Redis> = (19401..=19404).map(|p| cluster_node(&dir, p)).collect();
    // The cluster by hand (cluster tutorial, "Create a Redis Cluster"):
    // distinct config epochs, slots per master, then MEET.
    for (i, (n, &(_, a, b))) in nodes.iter().zip(&SHARDS).enumerate() {
        let mut c = n.client();
        c.ok(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
        c.ok(&["CLUSTER", "ADDSLOTSRANGE", &a.to_string(), &b.to_string()]);
    }
    for n in &nodes[1..] {
        nodes[0]
            .client()
            .ok(&["CLUSTER", "MEET", H, &n.port.to_string()]);
    }
    let all: Vec<&Redis> = nodes.iter().collect();
    assert!(
        wait_until(Duration::from_secs(60), || cluster_ready(&all)),
        "the cluster did not form:\n{}",
        why_not_ready(&all)
    );
    // The fourth node replicates shard 0-5460's master.
    let id0 = nodes[0].client().ok(&["CLUSTER", "MYID"]);
    nodes[3].client().ok(&["CLUSTER", "REPLICATE", &id0]);
    assert!(
        wait_until(Duration::from_secs(60), || {
            nodes[3]
                .client()
                .info("replication")
                .get("master_link_status")
                .map(String::as_str)
                == Some("up")
        }),
        "the cluster replica did not sync: {:?}\n{}\n{}",
        nodes[3].client().info("replication"),
        nodes[3].proc.output(),
        nodes[0].proc.output()
    );
    let keys_in = |n: &Redis, k: &str| n.client().ok(&["CLUSTER", "KEYSLOT", k]);
    for k in ["key:0", "hash:77", "a", "before:8999"] {
        assert_eq!(keys_in(&nodes[0], k), slot(k).to_string(), "{k}");
    }
    let masters = [&nodes[0], &nodes[1], &nodes[2]];
    write(&masters, "before", 9000);

    // Every node lists the replica in its shard before the relay asks.
    assert!(
        wait_until(Duration::from_secs(60), || nodes.iter().all(|n| {
            let Reply::Array(Some(shards)) = n.client().cmd(&["CLUSTER", "SHARDS"]) else {
                return false;
            };
            shards.len() == 3
        })),
        "CLUSTER SHARDS did not settle on 3 shards"
    );
    let pki = pki(&dir, UP_IP, DOWN_IP);
    let seed = nodes[1].addr();
    let up = upstream_with(&dir, &pki, UP_IP, 19420, 19421, &["--cluster", &seed], &[]);
    let shard_args: Vec<String> = SHARDS
        .iter()
        .zip(19426..)
        .flat_map(|(&(name, _, _), port)| ["--shard".into(), format!("{name}={DOWN_IP}:{port}")])
        .collect();
    // And a shard the cluster does not have: its replicas are refused.
    let shard_args = [
        shard_args,
        vec!["--shard".into(), format!("1-2={DOWN_IP}:19429")],
    ]
    .concat();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_qr"));
    let pk = |f: &str| pki.join(f).display().to_string();
    cmd.args(["kv-relay", "downstream", "--ip", DOWN_IP])
        .args(["--upstream", &format!("{UP_IP}:19420")])
        .args(&shard_args)
        .args(["--metrics", &format!("{DOWN_IP}:19425")])
        .args([
            "--cert",
            &pk("down.pem"),
            "--key",
            &pk("down-key.pem"),
            "--ca",
            &pk("ca.pem"),
        ])
        .args(["--idle-timeout", "5s", "--keep-alive", "500ms"]);
    let down = Proc::spawn("downstream relay", &mut cmd, dir.path("down.log"));
    assert!(
        wait_until(Duration::from_secs(20), || std::net::TcpStream::connect(
            format!("{DOWN_IP}:19428")
        )
        .is_ok()),
        "downstream relay did not start:\n{}",
        down.output()
    );
    let standbys: Vec<Redis> = (19426..=19428)
        .zip(19411..)
        .map(|(dp, sp)| {
            Redis::start(
                &dir,
                STANDBY_IP,
                sp,
                &["--replicaof", DOWN_IP, &dp.to_string()],
            )
        })
        .collect();
    for (m, s) in masters.iter().zip(&standbys) {
        same(m, s, &[&up, &down, &s.proc]);
    }
    // One fabric connection carries all three shards.
    let us = status(&format!("{UP_IP}:19421"));
    assert_eq!(us["shards"].as_object().unwrap().len(), 3, "{us}");
    for &(name, _, _) in &SHARDS {
        let s = &us["shards"][name];
        assert_eq!(s["sync_full"], 1, "{name}: {us}");
        assert_eq!(s["master_link_up"], 1, "{name}: {us}");
        assert_eq!(s["replicas"].as_object().unwrap().len(), 1, "{name}: {us}");
    }
    let text = metrics(&format!("{UP_IP}:19421"));
    assert!(
        text.contains("qr_kv_sync_full_total{role=\"upstream\",shard=\"0-5460\"} 1"),
        "{text}"
    );

    // A replica of a shard the upstream does not serve: refused with the
    // error a master without its own master link gives, and counted.
    let mut c = Client::connect(&format!("{DOWN_IP}:19429")).unwrap();
    assert_eq!(c.ok(&["REPLCONF", "capa", "eof", "capa", "psync2"]), "OK");
    let r = c.cmd(&["PSYNC", "?", "-1"]);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("NOMASTERLINK")),
        "{r:?}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || status(&format!(
            "{UP_IP}:19421"
        ))["link_errors"]
            .as_u64()
            .unwrap()
            >= 1),
        "{}",
        status(&format!("{UP_IP}:19421"))
    );

    // Failover inside shard 0-5460: its replica takes over (manual
    // failover, cluster spec "Manual failover"), the old master follows it.
    let old_id = nodes[0].client().info("replication")["master_replid"].clone();
    nodes[3].client().ok(&["CLUSTER", "FAILOVER"]);
    assert!(
        wait_until(Duration::from_secs(60), || {
            nodes[3].client().info("replication")["role"] == "master"
                && nodes[0].client().info("replication")["role"] == "slave"
                && cluster_info(&nodes[3]).contains("cluster_state:ok")
        }),
        "CLUSTER FAILOVER did not promote {}: {:?}",
        nodes[3].addr(),
        nodes[3].client().info("replication")
    );
    let masters = [&nodes[3], &nodes[1], &nodes[2]];
    write(&masters, "after", 3000);
    for (m, s) in masters.iter().zip(&standbys) {
        same(m, s, &[&up, &down, &s.proc]);
    }
    let logs = || {
        format!(
            "--- up ---\n{}\n--- down ---\n{}",
            up.output(),
            down.output()
        )
    };
    let us = status(&format!("{UP_IP}:19421"));
    let s0 = &us["shards"]["0-5460"];
    assert_eq!(s0["master_changes"], 1, "{us}\n{}", logs());
    assert_eq!(s0["master_link_up"], 1, "{us}");
    for &(name, _, _) in &SHARDS[1..] {
        assert_eq!(us["shards"][name]["master_changes"], 0, "{name}: {us}");
    }
    let want = format!("the master is now {}", nodes[3].addr());
    assert!(up.output().contains(&want), "{}", logs());
    // Partial, as a direct replica of the promoted node would resume: the
    // promoted node kept the old id as replid2 and served the relay by PSYNC.
    let pi = nodes[3].client().info("replication");
    assert_eq!(pi["master_replid2"], old_id, "{pi:?}");
    assert_eq!(nodes[3].stat("sync_full"), 0, "{}", logs());
    assert!(nodes[3].stat("sync_partial_ok") >= 1, "{}", logs());
    let si = standbys[0].client().info("replication");
    assert_eq!(si["master_replid"], pi["master_replid"], "{si:?}");
    let log = standbys[0].proc.output();
    eprintln!(
        "standby 0-5460: full syncs {}, partial {}",
        log.matches("Full resync from master").count(),
        log.matches("Master accepted a Partial Resynchronization")
            .count()
    );
    assert_eq!(log.matches("Full resync from master").count(), 1, "{log}");
    assert!(
        log.contains("Master accepted a Partial Resynchronization"),
        "{log}\n{}",
        logs()
    );
    let (us, ds) = (
        status(&format!("{UP_IP}:19421")),
        status(&format!("{DOWN_IP}:19425")),
    );
    for &(name, _, _) in &SHARDS {
        assert_eq!(us["shards"][name]["sync_full"], 1, "{name}: {us}");
        assert_eq!(ds["shards"][name]["sync_full"], 1, "{name}: {ds}");
    }
    // The downstream relay dialed once (it counts every redial) and every
    // shard's sessions ran on that one connection, failover included.
    assert_eq!(ds["reconnects"], 0, "{ds}");
    // The other shards' standbys never resynced.
    for s in &standbys[1..] {
        let l = s.proc.output();
        assert_eq!(l.matches("Full resync from master").count(), 1, "{l}");
    }
}
