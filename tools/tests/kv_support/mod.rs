//! Helpers for the KV relay tests: real `redis-server` processes, `qr
//! kv-relay` processes, a development PKI, a small RESP client, and the
//! dataset checks. Every process dies with the test (killed on drop).
#![allow(dead_code, unreachable_pub)]

#[path = "../common/http.rs"]
mod http;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A private directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "qr-kv-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("QR_KV_KEEP_DIRS").is_some() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed and reaped on drop; its stderr goes to `log`.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Proc {
        let err = std::fs::File::create(&log).unwrap();
        let out = err.try_clone().unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name} ({cmd:?}): {e}"));
        Proc {
            child: Some(child),
            log,
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// What it wrote so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kill it now (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// Its exit code once it has exited (None while running, or if a
    /// signal ended it).
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child.as_mut()?.try_wait().ok().flatten()?.code()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Poll `f` every 50 ms until it is true or `limit` passes; false on timeout.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A RESP reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    pub fn text(&self) -> String {
        match self {
            Reply::Simple(s) | Reply::Error(s) => s.clone(),
            Reply::Int(i) => i.to_string(),
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            Reply::Bulk(None) | Reply::Array(None) => "(nil)".into(),
            Reply::Array(Some(v)) => format!("{v:?}"),
        }
    }
}

/// A blocking RESP client.
pub struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

impl Client {
    pub fn connect(addr: &str) -> std::io::Result<Client> {
        let w = TcpStream::connect(addr)?;
        w.set_read_timeout(Some(Duration::from_secs(120)))?;
        let r = BufReader::new(w.try_clone()?);
        Ok(Client { w, r })
    }

    /// A client over an accepted socket (a fake peer in a test).
    pub fn from_stream(w: TcpStream) -> Client {
        let r = BufReader::new(w.try_clone().unwrap());
        Client { w, r }
    }

    /// Read whatever comes until the peer closes (or the read timeout).
    pub fn read_to_end(&mut self, out: &mut Vec<u8>) -> std::io::Result<usize> {
        self.r.read_to_end(out)
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        self.w.write_all(&encode(args)).unwrap();
    }

    pub fn send_raw(&mut self, b: &[u8]) {
        self.w.write_all(b).unwrap();
    }

    pub fn read(&mut self) -> Reply {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let line = line.trim_end_matches("\r\n");
        let (t, rest) = line.split_at(1.min(line.len()));
        match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Reply::Bulk(None);
                }
                let mut b = vec![0; n as usize + 2];
                self.r.read_exact(&mut b).unwrap();
                b.truncate(n as usize);
                Reply::Bulk(Some(b))
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Reply::Array(None);
                }
                Reply::Array(Some((0..n).map(|_| self.read()).collect()))
            }
            _ => panic!("bad reply line {line:?}"),
        }
    }

    pub fn cmd(&mut self, args: &[&str]) -> Reply {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send(&a);
        self.read()
    }

    pub fn ok(&mut self, args: &[&str]) -> String {
        match self.cmd(args) {
            Reply::Error(e) => panic!("{args:?}: {e}"),
            r => r.text(),
        }
    }

    /// INFO section as a map.
    pub fn info(&mut self, section: &str) -> HashMap<String, String> {
        self.ok(&["INFO", section])
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }
}

/// A `redis-server` on host:port with its data dir in `dir`.
pub struct Redis {
    pub host: String,
    pub port: u16,
    pub proc: Proc,
}

impl Redis {
    pub fn start(dir: &TempDir, host: &str, port: u16, extra: &[&str]) -> Redis {
        let data = dir.path(&format!("redis-{port}"));
        std::fs::create_dir_all(&data).unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", host])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(&data)
            .args(["--logfile", ""])
            .args(extra);
        let proc = Proc::spawn(
            &format!("redis {port}"),
            &mut cmd,
            dir.path(&format!("redis-{port}.log")),
        );
        let r = Redis {
            host: host.into(),
            port,
            proc,
        };
        let addr = r.addr();
        assert!(
            wait_until(Duration::from_secs(10), || Client::connect(&addr)
                .map(|mut c| c.cmd(&["PING"]) == Reply::Simple("PONG".into()))
                .unwrap_or(false)),
            "redis-server on {addr} did not start:\n{}",
            r.proc.output()
        );
        r
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.addr()).unwrap()
    }

    pub fn digest(&self) -> String {
        self.client().ok(&["DEBUG", "DIGEST"])
    }

    /// The replication offset this server has processed (master or replica).
    pub fn offset(&self) -> u64 {
        self.client().info("replication")["master_repl_offset"]
            .parse()
            .unwrap()
    }

    /// INFO stats counter.
    pub fn stat(&self, name: &str) -> u64 {
        self.client().info("stats")[name].parse().unwrap()
    }
}

/// Development certificates for the two relay roles.
pub fn pki(dir: &TempDir, up_ip: &str, down_ip: &str) -> PathBuf {
    let p = dir.path("pki");
    let out = Command::new(env!("CARGO_BIN_EXE_qr"))
        .arg("cert")
        .arg("--dir")
        .arg(&p)
        .args(["--leaf", &format!("up={up_ip}")])
        .args(["--leaf", &format!("down={down_ip}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    p
}

fn mtls_args(pki: &Path, name: &str) -> Vec<String> {
    vec![
        "--cert".into(),
        pki.join(format!("{name}.pem")).display().to_string(),
        "--key".into(),
        pki.join(format!("{name}-key.pem")).display().to_string(),
        "--ca".into(),
        pki.join("ca.pem").display().to_string(),
    ]
}

/// Liveness for relays on a loaded 2-core test machine.
const LIVENESS: [&str; 4] = ["--idle-timeout", "5s", "--keep-alive", "500ms"];

/// `qr kv-relay upstream` following `master`.
pub fn upstream(
    dir: &TempDir,
    pki: &Path,
    ip: &str,
    service_port: u16,
    metrics_port: u16,
    master: &str,
    extra: &[&str],
) -> Proc {
    let source = ["--master", master];
    upstream_with(dir, pki, ip, service_port, metrics_port, &source, extra)
}

/// `qr kv-relay upstream` finding its master with `source` (`--master ...`
/// or `--sentinel ... --master-name ...`).
pub fn upstream_with(
    dir: &TempDir,
    pki: &Path,
    ip: &str,
    service_port: u16,
    metrics_port: u16,
    source: &[&str],
    extra: &[&str],
) -> Proc {
    let snap = dir.path(&format!("up-{service_port}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qr"));
    cmd.args(["kv-relay", "upstream", "--ip", ip])
        .args(["--service-port", &service_port.to_string()])
        .args(["--metrics", &format!("{ip}:{metrics_port}")])
        .args(source)
        .arg("--dir")
        .arg(&snap)
        .args(mtls_args(pki, "up"))
        .args(LIVENESS)
        .args(extra);
    // A restarted relay logs to a file of its own (`up-PORT.2.log`, ...):
    // its predecessor's log stays readable for failure messages.
    let (name, log) = (1..)
        .map(|n| match n {
            1 => (
                "upstream relay".to_string(),
                format!("up-{service_port}.log"),
            ),
            n => (
                format!("upstream relay #{n}"),
                format!("up-{service_port}.{n}.log"),
            ),
        })
        .find(|(_, log)| !dir.path(log).exists())
        .unwrap();
    let p = Proc::spawn(&name, &mut cmd, dir.path(&log));
    // The bootstrap service listens a moment before the metrics do: a test
    // asking /status at once must find both.
    let probes = [
        format!("{ip}:{service_port}"),
        format!("{ip}:{metrics_port}"),
    ];
    assert!(
        wait_until(Duration::from_secs(20), || probes
            .iter()
            .all(|a| TcpStream::connect(a).is_ok())),
        "upstream relay did not start\n{}",
        p.output()
    );
    p
}

/// `qr kv-relay downstream`.
pub fn downstream(
    dir: &TempDir,
    pki: &Path,
    ip: &str,
    listen_port: u16,
    metrics_port: u16,
    upstream: &str,
) -> Proc {
    downstream_with(dir, pki, ip, listen_port, metrics_port, upstream, &[])
}

/// `qr kv-relay downstream` with `extra` options.
pub fn downstream_with(
    dir: &TempDir,
    pki: &Path,
    ip: &str,
    listen_port: u16,
    metrics_port: u16,
    upstream: &str,
    extra: &[&str],
) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qr"));
    cmd.args(["kv-relay", "downstream", "--ip", ip])
        .args(["--upstream", upstream])
        .args(["--listen", &format!("{ip}:{listen_port}")])
        .args(["--metrics", &format!("{ip}:{metrics_port}")])
        .args(mtls_args(pki, "down"))
        .args(LIVENESS)
        .args(extra);
    let p = Proc::spawn(
        "downstream relay",
        &mut cmd,
        dir.path(&format!("down-{listen_port}.log")),
    );
    let probe = format!("{ip}:{listen_port}");
    assert!(
        wait_until(Duration::from_secs(20), || TcpStream::connect(&probe)
            .is_ok()),
        "downstream relay did not start"
    );
    p
}

/// GET a relay's /status as JSON.
pub fn status(addr: &str) -> serde_json::Value {
    let (code, body) = http::get(addr, "/status").unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// GET a relay's /metrics.
pub fn metrics(addr: &str) -> String {
    let (code, body) = http::get(addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{body}");
    body
}

/// Fill `r` with `n` keys of mixed types — strings (DEBUG POPULATE), hashes,
/// lists, sets, sorted sets in equal shares of the rest — plus `big` values
/// of at least 1 MiB (a string, a hash field, a list element in turn).
pub fn populate(r: &Redis, n: usize, big: usize) {
    let mut c = r.client();
    let strings = n / 2;
    c.ok(&["DEBUG", "POPULATE", &strings.to_string(), "key", "64"]);
    let each = (n - strings) / 4;
    let mut pending = 0;
    let mut buf = Vec::new();
    for i in 0..each {
        let (h, l, s, z) = (
            format!("hash:{i}"),
            format!("list:{i}"),
            format!("set:{i}"),
            format!("zset:{i}"),
        );
        let v = format!("value-{i}");
        buf.extend(encode(&[
            b"HSET",
            h.as_bytes(),
            b"f1",
            v.as_bytes(),
            b"f2",
            b"x",
            b"n",
            i.to_string().as_bytes(),
        ]));
        buf.extend(encode(&[b"RPUSH", l.as_bytes(), b"a", v.as_bytes(), b"c"]));
        buf.extend(encode(&[b"SADD", s.as_bytes(), b"m1", v.as_bytes(), b"m3"]));
        buf.extend(encode(&[
            b"ZADD",
            z.as_bytes(),
            b"1",
            b"one",
            i.to_string().as_bytes(),
            v.as_bytes(),
        ]));
        pending += 4;
        if pending >= 4000 {
            c.send_raw(&buf);
            buf.clear();
            for _ in 0..pending {
                assert!(!matches!(c.read(), Reply::Error(_)));
            }
            pending = 0;
        }
    }
    // The remainder keeps the key count exact.
    for i in 0..(n - strings - 4 * each) {
        let k = format!("extra:{i}");
        buf.extend(encode(&[b"SET", k.as_bytes(), b"x"]));
        pending += 1;
    }
    c.send_raw(&buf);
    for _ in 0..pending {
        assert!(!matches!(c.read(), Reply::Error(_)));
    }
    for i in 0..big {
        let v = big_value(i);
        let k = format!("big:{i}");
        let r = match i % 3 {
            0 => {
                c.send(&[b"SET", k.as_bytes(), &v]);
                c.read()
            }
            1 => {
                c.send(&[b"HSET", k.as_bytes(), b"blob", &v]);
                c.read()
            }
            _ => {
                c.send(&[b"RPUSH", k.as_bytes(), b"head", &v]);
                c.read()
            }
        };
        assert!(!matches!(r, Reply::Error(_)), "{r:?}");
    }
}

/// The `i`th big value: 1 MiB + i KiB of a pattern that depends on `i`.
pub fn big_value(i: usize) -> Vec<u8> {
    (0..(1 << 20) + (i << 10))
        .map(|k| (k.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8)
        .collect()
}

/// What each of `procs` wrote so far, each under a `--- name ---` line: for
/// failure messages.
pub fn dump(procs: &[&Proc]) -> String {
    procs
        .iter()
        .map(|p| format!("--- {} ---\n{}", p.name, p.output()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait until `replica` has processed everything `master` has, then require
/// identical, non-empty `DEBUG DIGEST`s and equal `DBSIZE`s; the size. `logs`
/// are printed with a failure.
pub fn same_digest(master: &Redis, replica: &Redis, logs: &[&Proc]) -> String {
    let ok = wait_until(Duration::from_secs(120), || {
        let link = replica.client().info("replication");
        link.get("master_link_status").map(String::as_str) == Some("up")
            && replica.offset() >= master.offset()
    });
    let dump = || dump(logs);
    assert!(
        ok,
        "replica {} did not catch up with {}: master offset {}, replica {:?}\n{}",
        replica.addr(),
        master.addr(),
        master.offset(),
        replica.client().info("replication"),
        dump()
    );
    let (dm, dr) = (master.digest(), replica.digest());
    assert_eq!(
        dm,
        dr,
        "DEBUG DIGEST of {} and {} differs\n{}",
        master.addr(),
        replica.addr(),
        dump()
    );
    assert_ne!(
        dm, "0000000000000000000000000000000000000000",
        "empty dataset"
    );
    let size = master.client().ok(&["DBSIZE"]);
    assert_eq!(size, replica.client().ok(&["DBSIZE"]));
    size
}

/// [`same_digest`], then spot-check values of every type.
pub fn assert_same(master: &Redis, replica: &Redis, big: usize, logs: &[&Proc]) {
    same_digest(master, replica, logs);
    let (mut m, mut r) = (master.client(), replica.client());
    for k in ["key:0", "key:777", "hash:5", "list:9", "set:3", "zset:11"] {
        let t = m.ok(&["TYPE", k]);
        let q: Vec<&str> = match t.as_str() {
            "string" => vec!["GET", k],
            "hash" => vec!["HGETALL", k],
            "list" => vec!["LRANGE", k, "0", "-1"],
            "set" => vec!["SMEMBERS", k],
            "zset" => vec!["ZRANGE", k, "0", "-1", "WITHSCORES"],
            _ => continue,
        };
        let (mut a, mut b) = (m.cmd(&q), r.cmd(&q));
        if t == "set" {
            // Set members come in encoding order, which may differ.
            for x in [&mut a, &mut b] {
                if let Reply::Array(Some(v)) = x {
                    v.sort_by_key(Reply::text);
                }
            }
        }
        assert_eq!(a, b, "{k}");
    }
    for i in 0..big {
        let k = format!("big:{i}");
        let q: Vec<&str> = match i % 3 {
            0 => vec!["GET", &k],
            1 => vec!["HGET", &k, "blob"],
            _ => vec!["LINDEX", &k, "1"],
        };
        let want = Reply::Bulk(Some(big_value(i)));
        assert_eq!(r.cmd(&q), want, "{k} on the replica");
    }
}

/// Writes of every type in a loop until `stop`; counts them. As fast as the
/// master answers: a round of five pipelined commands adds about 200 bytes
/// to the replication stream, and on an idle machine this makes several MB
/// a second (use [`paced_writer`] where a test needs a bound on that).
pub fn writer(
    addr: String,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    writer_with(addr, stop, count, None)
}

/// [`writer`] doing at most `rounds_per_second` rounds of its five commands
/// (about 200 bytes of replication stream each): a stream whose volume over
/// a test's longest run is known.
pub fn paced_writer(
    addr: String,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    rounds_per_second: u64,
) -> std::thread::JoinHandle<()> {
    writer_with(addr, stop, count, Some(rounds_per_second))
}

fn writer_with(
    addr: String,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    pace: Option<u64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = Client::connect(&addr).unwrap();
        let began = Instant::now();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if let Some(rate) = pace {
                // Round i is due i/rate seconds after the start.
                let due = began + Duration::from_micros(i * 1_000_000 / rate.max(1));
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let s = i.to_string();
            let k = format!("w:{}", i % 5000);
            for cmd in [
                vec!["SET", k.as_str(), s.as_str()],
                vec!["INCR", "w:counter"],
                vec!["HSET", "w:hash", s.as_str(), "v"],
                vec!["LPUSH", "w:list", s.as_str()],
                vec!["ZADD", "w:zset", s.as_str(), s.as_str()],
            ] {
                let a: Vec<&[u8]> = cmd.iter().map(|x| x.as_bytes()).collect();
                c.send(&a);
            }
            for _ in 0..5 {
                assert!(!matches!(c.read(), Reply::Error(_)));
            }
            count.fetch_add(5, Ordering::Relaxed);
            i += 1;
        }
    })
}

/// Run `redis-cli -h host -p port ARGS...` (with `input` on its stdin, one
/// command a line, when given) and return what it printed.
pub fn redis_cli(addr: &str, args: &[&str], input: Option<&str>) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", host, "-p", port])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("redis-cli (Debian redis-tools)");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(i) = input {
        stdin.write_all(i.as_bytes()).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
