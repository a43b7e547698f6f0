//! Issue 25, item 3: the relays are visible to Redis tools. redis-cli asks
//! the downstream relay's Redis port what it would ask a Redis master (PING,
//! ROLE, INFO replication and INFO ALL as a Prometheus exporter reads them,
//! CLIENT SETNAME/GETNAME/LIST) and gets Redis-shaped answers naming the real
//! replica behind it; an inline command and an unknown command get `-ERR` on
//! a connection that stays open; and the real master lists the upstream
//! relay at the address it announced (`--announce-ip`, `--announce-port`),
//! not a phantom `port=6379`. The replica's data stays identical to the
//! master's throughout (DEBUG DIGEST).
//!
//! Addresses: 127.0.112.90..94, TCP ports 19320..19326.

mod kv_support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use kv_support::*;

/// `key:value` lines of an INFO text.
fn fields(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn redis_cli_sees_a_master_and_the_master_sees_the_announced_relay() {
    let dir = TempDir::new("introspection");
    let master = Redis::start(
        &dir,
        "127.0.112.90",
        19320,
        &["--repl-diskless-sync-delay", "0"],
    );
    populate(&master, 5_000, 0);
    let pki = pki(&dir, "127.0.112.91", "127.0.112.92");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.91",
        19321,
        19322,
        &master.addr(),
        &["--announce-ip", "127.0.112.94", "--announce-port", "19326"],
    );
    let down = downstream(
        &dir,
        &pki,
        "127.0.112.92",
        19323,
        19324,
        "127.0.112.91:19321",
    );
    let replica = Redis::start(
        &dir,
        "127.0.112.93",
        19325,
        &[
            "--replicaof",
            "127.0.112.92",
            "19323",
            // Announced with REPLCONF ip-address: the relay must show it.
            "--replica-announce-ip",
            "127.0.112.93",
        ],
    );
    assert_same(&master, &replica, 0, &[&up, &down]);
    // A write after the sync, so the offsets below are past the snapshot's.
    master.client().ok(&["SET", "before-introspection", "yes"]);
    assert_same(&master, &replica, 0, &[&up, &down]);
    let relay = "127.0.112.92:19323";

    // The master lists the upstream relay where it said it is.
    let mi = master.client().info("replication");
    assert_eq!(mi["connected_slaves"], "1", "{mi:?}");
    assert!(
        mi["slave0"].starts_with("ip=127.0.112.94,port=19326,state=online,"),
        "{mi:?}"
    );

    assert_eq!(redis_cli(relay, &["PING"], None).trim(), "PONG");

    // ROLE: master, its offset, and the online replica as ip, port, offset.
    let role = redis_cli(relay, &["ROLE"], None);
    let lines: Vec<&str> = role.lines().collect();
    assert_eq!(lines.len(), 5, "{role}");
    assert_eq!(lines[0], "master");
    let offset: u64 = lines[1].parse().unwrap();
    assert!(offset > 0, "{role}");
    assert_eq!(&lines[2..4], ["127.0.112.93", "19325"], "{role}");
    assert!(lines[4].parse::<u64>().unwrap() <= offset, "{role}");

    // INFO replication, as a master's, naming the master's replication id.
    let ri = fields(&redis_cli(relay, &["INFO", "replication"], None));
    assert_eq!(ri["role"], "master", "{ri:?}");
    assert_eq!(ri["connected_slaves"], "1", "{ri:?}");
    assert!(
        ri["slave0"].starts_with("ip=127.0.112.93,port=19325,state=online,offset="),
        "{ri:?}"
    );
    assert_eq!(ri["master_replid"], mi["master_replid"], "{ri:?}");
    assert!(ri["master_repl_offset"].parse::<u64>().unwrap() > 0);

    // INFO ALL, as an exporter reads it: every section it parses is there.
    let all = redis_cli(relay, &["INFO", "ALL"], None);
    for s in ["# Server", "# Clients", "# Stats", "# Replication"] {
        assert!(all.contains(s), "{s} missing:\n{all}");
    }
    let af = fields(&all);
    assert_eq!(af["run_id"].len(), 40, "{all}");
    assert_eq!(af["tcp_port"], "19323", "{all}");
    assert_eq!(af["sync_full"], "1", "{all}");

    // CLIENT on one connection: the name sticks, and LIST shows it beside
    // the replica (flags=S).
    let out = redis_cli(
        relay,
        &[],
        Some("CLIENT SETNAME monitor\nCLIENT GETNAME\nCLIENT LIST\n"),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..2], ["OK", "monitor"], "{out}");
    assert!(lines.iter().any(|l| l.contains(" name=monitor ")), "{out}");
    assert!(lines.iter().any(|l| l.contains(" flags=S ")), "{out}");

    // Inline and unknown commands: an error each, and the connection lives.
    let mut s = TcpStream::connect(relay).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    let mut ask = |s: &mut TcpStream, wire: &[u8]| {
        s.write_all(wire).unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        line.clone()
    };
    let a = ask(&mut s, b"PING\r\n");
    assert!(a.starts_with("-ERR inline commands"), "{a:?}");
    let a = ask(&mut s, &encode(&[b"FLUSHALL"]));
    assert!(a.starts_with("-ERR unknown command 'flushall'"), "{a:?}");
    assert_eq!(ask(&mut s, &encode(&[b"PING"])), "+PONG\r\n");
    assert_eq!(ask(&mut s, &encode(&[b"QUIT"])), "+OK\r\n");
    assert_eq!(ask(&mut s, b""), "", "QUIT closes the connection");

    let ds = status("127.0.112.92:19324");
    assert_eq!(ds["commands_refused"], 2, "{ds}");
    assert_eq!(ds["malformed"], 0, "{ds}");
    // The downstream's head is the offset it delivered (ROLE's, or later
    // if the master's periodic PING came since), no longer 0.
    let head = ds["head"].as_u64().unwrap();
    assert!(head >= offset, "{ds}");
    let m = metrics("127.0.112.92:19324");
    let shown = m
        .lines()
        .find_map(|l| l.strip_prefix("qr_kv_log_head_bytes{role=\"downstream\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(shown >= Some(offset), "{m}");

    // The replica never noticed any of it.
    master.client().ok(&["SET", "after-introspection", "yes"]);
    assert_same(&master, &replica, 0, &[&up, &down]);
    assert_eq!(replica.client().ok(&["GET", "after-introspection"]), "yes");
}
