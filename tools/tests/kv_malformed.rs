//! Issue 12, must-show (e): malformed input from either side closes only
//! that link, with a clear error, counted; the relay keeps serving.
//!
//! - A fake replica (plain TCP) speaks broken RESP to a downstream relay that
//!   also serves a real replica: the fake's link closes, the real replica
//!   keeps replicating.
//! - A fake master (plain TCP) answers an upstream relay's PSYNC with broken
//!   RDB framing, then with a valid snapshot followed by a broken command
//!   stream: each time the link closes with an error naming the fault, and
//!   the relay reconnects.
//!
//! Addresses: 127.0.112.50..56, TCP ports 19250..19259.

mod kv_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use kv_support::*;

#[test]
fn a_fake_replica_speaking_garbage_closes_only_its_own_link() {
    let dir = TempDir::new("malformed-replica");
    let master = Redis::start(
        &dir,
        "127.0.112.50",
        19250,
        &["--repl-diskless-sync-delay", "0"],
    );
    populate(&master, 2_000, 0);
    let pki = pki(&dir, "127.0.112.51", "127.0.112.52");
    let up = upstream(
        &dir,
        &pki,
        "127.0.112.51",
        19251,
        19252,
        &master.addr(),
        &[],
    );
    let mut down = downstream(
        &dir,
        &pki,
        "127.0.112.52",
        19253,
        19254,
        "127.0.112.51:19251",
    );
    let replica = Redis::start(
        &dir,
        "127.0.112.53",
        19255,
        &["--replicaof", "127.0.112.52", "19253"],
    );
    assert_same(&master, &replica, 0, &[&up, &down]);

    // (A line of words is an inline command: answered -ERR on an open
    // connection, kv_introspection.rs; these are not RESP at all.)
    let garbage: [&[u8]; 3] = [
        b"*1\r\nhello there\r\n",
        b"*1\r\n$4\r\nPING\r\n*1\r\n$3\r\nXYZW\r\n",
        b"*2\r\n$5\r\nPSYNC\r\n$99999999999\r\n",
    ];
    for (i, g) in garbage.iter().enumerate() {
        let mut s = TcpStream::connect("127.0.112.52:19253").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(g).unwrap();
        // The relay answers what was valid, then closes: read to the end.
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        if i == 1 {
            assert!(got.starts_with(b"+PONG\r\n"), "{got:?}");
        }
        assert!(down.alive(), "the relay died on garbage #{i}");
    }
    // The relay counts a malformed link as it closes it, which may be just
    // after this side saw the close.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ds = loop {
        let ds = status("127.0.112.52:19254");
        if ds["malformed"] == 3 || std::time::Instant::now() > deadline {
            break ds;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ds["malformed"], 3, "{ds}");
    let log = down.output();
    assert!(
        log.contains("malformed RESP from the peer: expected a bulk string"),
        "{log}"
    );
    assert!(log.contains("not terminated by CRLF"), "{log}");
    assert!(log.contains("exceeds the limit"), "{log}");

    // The real replica's link never noticed.
    master.client().ok(&["SET", "after-garbage", "yes"]);
    assert_same(&master, &replica, 0, &[&up, &down]);
    assert_eq!(replica.client().ok(&["GET", "after-garbage"]), "yes");
    assert_eq!(ds["sync_full"], 1, "{ds}");
}

/// Serve one fake-master connection: answer the handshake, then `after_psync`.
fn fake_master_conn(l: &TcpListener, after_psync: &[u8]) {
    let (s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut c = Client::from_stream(s);
    loop {
        let Reply::Array(Some(args)) = c.read() else {
            panic!("the relay sent a non-command");
        };
        let name = args[0].text().to_ascii_uppercase();
        match name.as_str() {
            "PING" => w.write_all(b"+PONG\r\n").unwrap(),
            "PSYNC" => {
                w.write_all(after_psync).unwrap();
                // Hold the link until the relay drops it.
                let mut rest = Vec::new();
                let _ = c.read_to_end(&mut rest);
                return;
            }
            _ => w.write_all(b"+OK\r\n").unwrap(),
        }
    }
}

#[test]
fn a_fake_master_sending_garbage_closes_the_link_and_the_relay_reconnects() {
    let dir = TempDir::new("malformed-master");
    let l = TcpListener::bind("127.0.112.55:19256").unwrap();
    let pki = pki(&dir, "127.0.112.56", "127.0.112.57");
    let mut up = upstream(
        &dir,
        &pki,
        "127.0.112.56",
        19257,
        19258,
        "127.0.112.55:19256",
        &[],
    );
    let replid = "0123456789abcdef0123456789abcdef01234567";
    let mark = "m".repeat(40);
    // 1: RDB framing whose payload is not an RDB file.
    fake_master_conn(
        &l,
        format!("+FULLRESYNC {replid} 0\r\n$EOF:{mark}\r\nNOT-AN-RDB-FILE{mark}").as_bytes(),
    );
    // 2: a bad bulk header.
    fake_master_conn(&l, format!("+FULLRESYNC {replid} 0\r\n$12x\r\n").as_bytes());
    // 3: a valid (sized) snapshot, then a command stream that is not RESP.
    // The relay comes back with PSYNC for what it holds.
    fake_master_conn(
        &l,
        format!("+FULLRESYNC {replid} 0\r\n$9\r\nREDIS0010*1\r\n$4\r\nPING\r\n*1\r\n:oops\r\n")
            .as_bytes(),
    );
    let ok = wait_until(Duration::from_secs(10), || {
        status("127.0.112.56:19258")["malformed"].as_u64() == Some(3)
    });
    let us = status("127.0.112.56:19258");
    assert!(ok, "{us}\n{}", up.output());
    assert!(up.alive(), "the relay died");
    let log = up.output();
    assert!(
        log.contains("malformed RDB framing from the master: the payload is not an RDB file"),
        "{log}"
    );
    assert!(
        log.contains("bad RDB bulk header: length is not a number"),
        "{log}"
    );
    assert!(
        log.contains("malformed RESP from the peer: expected a bulk string"),
        "{log}"
    );
    // What was valid before the garbage was kept (a PING and the next
    // header, 14 + 4 bytes): the relay resumes after it.
    assert_eq!(us["head"], 18, "{us}");
    // And it keeps trying: a fourth connection arrives.
    l.set_nonblocking(false).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 14];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"*1\r\n$4\r\nPING\r\n");
}
