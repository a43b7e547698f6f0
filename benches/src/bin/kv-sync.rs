//! KV sync benchmark: a full sync of a large Redis dataset through
//! `qr kv-relay upstream` → fabric (`soft`, mutual TLS) → `qr kv-relay
//! downstream`, against Redis's own replication over TCP, in one run; then
//! the replication lag of both replicas side by side under a steady
//! `redis-benchmark` write load.
//!
//! ```sh
//! cargo build --release -p quic-rdma-tools --bin qr
//! cargo run --release -p quic-rdma-benches --bin kv-sync -- [--gib 1.0] [--out benches/results/kv_sync.json]
//! ```
//!
//! Needs `redis-server` and `redis-benchmark` on PATH; `qr` is taken from
//! next to this binary (the same target directory) unless `--qr` names it.
//! Addresses 127.0.112.80..86, TCP ports 19280..19299.
//!
//! Full sync, "cold": the relays start with nothing; the clock runs from
//! starting the upstream relay (which then syncs from the master) to the
//! replica behind the downstream relay being online at the master's offset —
//! the whole path, every hop pipelined. "warm": a second replica syncs
//! through relays that already hold the snapshot. "direct": a replica of the
//! master over TCP, from start to online. All replicas are fresh processes.
//!
//! Lag: while `redis-benchmark` runs SETs, a sampler reads both replicas'
//! offsets and the master's every 5 ms. A replica's lag at a sample is how
//! long ago the master was last at or below the replica's offset (0 when it
//! has everything), and the bytes it lacks.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Result<Proc> {
    let f = std::fs::File::create(log)?;
    Ok(Proc(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(f.try_clone()?))
            .stderr(Stdio::from(f))
            .spawn()
            .with_context(|| format!("spawning {cmd:?}"))?,
    ))
}

/// One-command-at-a-time RESP client (replies read as text).
struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: &str) -> Result<Client> {
        let w = TcpStream::connect(addr)?;
        w.set_read_timeout(Some(Duration::from_secs(600)))?;
        Ok(Client {
            r: BufReader::new(w.try_clone()?),
            w,
        })
    }

    fn cmd(&mut self, args: &[&str]) -> Result<String> {
        let mut v = format!("*{}\r\n", args.len());
        for a in args {
            v.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.w.write_all(v.as_bytes())?;
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let line = line.trim_end().to_string();
        match line.as_bytes().first() {
            Some(b'$') => {
                let n: i64 = line[1..].parse()?;
                if n < 0 {
                    return Ok(String::new());
                }
                let mut b = vec![0; n as usize + 2];
                self.r.read_exact(&mut b)?;
                b.truncate(n as usize);
                Ok(String::from_utf8_lossy(&b).into_owned())
            }
            Some(b'-') => bail!("{args:?}: {line}"),
            _ => Ok(line[1..].to_string()),
        }
    }

    fn info(&mut self, key: &str) -> Result<Option<String>> {
        let text = self.cmd(&["INFO", "replication"])?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .map(|v| v.trim().to_string()))
    }

    fn offset(&mut self) -> Result<u64> {
        Ok(self
            .info("master_repl_offset")?
            .unwrap_or_default()
            .parse()?)
    }

    fn online(&mut self) -> Result<bool> {
        Ok(self.info("master_link_status")?.as_deref() == Some("up"))
    }
}

fn redis(dir: &Path, host: &str, port: u16, extra: &[&str]) -> Result<Proc> {
    let data = dir.join(format!("r{port}"));
    std::fs::create_dir_all(&data)?;
    let p = spawn(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", host])
            .args(["--save", "", "--appendonly", "no", "--logfile", ""])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(&data)
            .args(extra),
        &dir.join(format!("redis-{port}.log")),
    )?;
    let addr = format!("{host}:{port}");
    let t = Instant::now();
    while Client::connect(&addr)
        .and_then(|mut c| c.cmd(&["PING"]))
        .is_err()
    {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("redis-server {addr} did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

/// Wait until `replica` is online at least at the master's current offset.
fn wait_synced(replica: &str, master: &str, limit: Duration) -> Result<()> {
    let t = Instant::now();
    loop {
        if let Ok(mut r) = Client::connect(replica) {
            if r.online().unwrap_or(false) {
                let want = Client::connect(master)?.offset()?;
                if r.offset()? >= want {
                    return Ok(());
                }
            }
        }
        if t.elapsed() > limit {
            bail!("{replica} did not sync within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_port(addr: &str) -> Result<()> {
    let t = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if t.elapsed() > Duration::from_secs(20) {
            bail!("{addr} never listened");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Lag samples of one replica against the master's offset history.
fn lag_stats(history: &[(f64, u64)], samples: &[(f64, u64)]) -> serde_json::Value {
    let mut secs = Vec::new();
    let mut bytes = Vec::new();
    for &(t, off) in samples {
        // The master's latest sample at or below `off`, no later than `t`.
        let i = history.partition_point(|&(tm, _)| tm <= t);
        let head = history[..i].last().map_or(0, |h| h.1);
        bytes.push(head.saturating_sub(off) as f64);
        let last_at = history[..i]
            .iter()
            .rev()
            .find(|h| h.1 <= off)
            .map_or(t, |h| h.0);
        secs.push(if off >= head { 0.0 } else { t - last_at });
    }
    serde_json::json!({
        "samples": samples.len(),
        "lag_ms_p50": percentile(&mut secs, 0.5) * 1e3,
        "lag_ms_p99": percentile(&mut secs, 0.99) * 1e3,
        "lag_ms_max": percentile(&mut secs, 1.0) * 1e3,
        "lag_bytes_p50": percentile(&mut bytes, 0.5),
        "lag_bytes_p99": percentile(&mut bytes, 0.99),
        "lag_bytes_max": percentile(&mut bytes, 1.0),
    })
}

fn main() -> Result<()> {
    let mut gib = 1.0f64;
    let mut out = PathBuf::from("benches/results/kv_sync.json");
    let mut qr = std::env::current_exe()?.with_file_name("qr");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gib" => gib = args.next().context("--gib N")?.parse()?,
            "--out" => out = args.next().context("--out FILE")?.into(),
            "--qr" => qr = args.next().context("--qr PATH")?.into(),
            other => bail!("unknown option {other}"),
        }
    }
    if !qr.exists() {
        bail!(
            "{} missing: cargo build --release -p quic-rdma-tools --bin qr",
            qr.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("qr-kv-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir, &qr, gib);
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(p) = out.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")?;
    eprintln!("kv-sync: results in {}", out.display());
    Ok(())
}

/// SETs of the steady write load: 4 clients, no pipelining (a load the
/// replicas can follow on this machine, not a saturation test).
const LOAD_N: &str = "400000";

fn run(dir: &Path, qr: &Path, gib: f64) -> Result<serde_json::Value> {
    const M: &str = "127.0.112.80:19280";
    let _master = redis(
        dir,
        "127.0.112.80",
        19280,
        &[
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            "--repl-backlog-size",
            "256mb",
        ],
    )?;
    let mut mc = Client::connect(M)?;
    let value = 1000usize;
    let keys = ((gib * (1u64 << 30) as f64) / value as f64).ceil() as u64;
    let t = Instant::now();
    mc.cmd(&[
        "DEBUG",
        "POPULATE",
        &keys.to_string(),
        "key",
        &value.to_string(),
    ])?;
    let used: u64 = mc
        .cmd(&["INFO", "memory"])?
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .context("used_memory")?
        .trim()
        .parse()?;
    eprintln!(
        "kv-sync: {keys} keys of {value} B, used_memory {used} B (populate {:?})",
        t.elapsed()
    );

    // Direct: Redis's own replication over TCP.
    let t = Instant::now();
    let direct = redis(
        dir,
        "127.0.112.81",
        19281,
        &["--replicaof", "127.0.112.80", "19280"],
    )?;
    wait_synced("127.0.112.81:19281", M, Duration::from_secs(1800))?;
    let direct_s = t.elapsed().as_secs_f64();
    eprintln!("kv-sync: direct full sync {direct_s:.2} s");

    // Through the relays, cold.
    let pki = dir.join("pki");
    let st = Command::new(qr)
        .args(["cert", "--dir"])
        .arg(&pki)
        .args(["--leaf", "up=127.0.112.82", "--leaf", "down=127.0.112.83"])
        .output()?;
    if !st.status.success() {
        bail!("qr cert: {st:?}");
    }
    let mtls = |n: &str| -> Vec<String> {
        vec![
            "--cert".into(),
            pki.join(format!("{n}.pem")).display().to_string(),
            "--key".into(),
            pki.join(format!("{n}-key.pem")).display().to_string(),
            "--ca".into(),
            pki.join("ca.pem").display().to_string(),
        ]
    };
    let live = [
        "--idle-timeout",
        "10s",
        "--keep-alive",
        "1s",
        "--progress",
        "off",
    ];
    let t = Instant::now();
    let _up = spawn(
        Command::new(qr)
            .args([
                "kv-relay",
                "upstream",
                "--ip",
                "127.0.112.82",
                "--service-port",
                "19282",
            ])
            .args([
                "--metrics",
                "127.0.112.82:19283",
                "--master",
                M,
                "--backlog",
                "256M",
            ])
            .arg("--dir")
            .arg(dir.join("snap"))
            .args(mtls("up"))
            .args(live),
        &dir.join("up.log"),
    )?;
    wait_port("127.0.112.82:19282")?;
    let _down = spawn(
        Command::new(qr)
            .args([
                "kv-relay",
                "downstream",
                "--ip",
                "127.0.112.83",
                "--upstream",
                "127.0.112.82:19282",
            ])
            .args([
                "--listen",
                "127.0.112.83:19284",
                "--metrics",
                "127.0.112.83:19285",
            ])
            .args(mtls("down"))
            .args(live),
        &dir.join("down.log"),
    )?;
    wait_port("127.0.112.83:19284")?;
    let relayed = redis(
        dir,
        "127.0.112.84",
        19286,
        &["--replicaof", "127.0.112.83", "19284"],
    )?;
    wait_synced("127.0.112.84:19286", M, Duration::from_secs(1800))
        .with_context(|| std::fs::read_to_string(dir.join("down.log")).unwrap_or_default())?;
    let cold_s = t.elapsed().as_secs_f64();
    eprintln!("kv-sync: relayed full sync (cold) {cold_s:.2} s");
    let t = Instant::now();
    let warm = redis(
        dir,
        "127.0.112.85",
        19287,
        &["--replicaof", "127.0.112.83", "19284"],
    )?;
    wait_synced("127.0.112.85:19287", M, Duration::from_secs(1800))?;
    let warm_s = t.elapsed().as_secs_f64();
    eprintln!("kv-sync: relayed full sync (warm) {warm_s:.2} s");
    drop(warm);
    let digest = |a: &str| Client::connect(a).and_then(|mut c| c.cmd(&["DEBUG", "DIGEST"]));
    let d = (
        digest(M)?,
        digest("127.0.112.81:19281")?,
        digest("127.0.112.84:19286")?,
    );
    let identical = d.0 == d.1 && d.0 == d.2;
    if !identical {
        bail!("digests differ: {d:?}");
    }

    // Lag under write load, both replicas at once.
    let bench = spawn(
        Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.112.80",
                "-p",
                "19280",
                "-t",
                "set",
                "-n",
                "2000000",
            ])
            .args(["-d", "100", "-c", "20", "-P", "8", "-r", "1000000", "-q"]),
        &dir.join("benchmark.log"),
    )?;
    let mut bench = bench;
    let (mut m, mut a, mut b) = (
        Client::connect(M)?,
        Client::connect("127.0.112.81:19281")?,
        Client::connect("127.0.112.84:19286")?,
    );
    let t0 = Instant::now();
    let (mut hist, mut sa, mut sb) = (Vec::new(), Vec::new(), Vec::new());
    while bench.0.try_wait()?.is_none() && t0.elapsed() < Duration::from_secs(120) {
        hist.push((t0.elapsed().as_secs_f64(), m.offset()?));
        sa.push((t0.elapsed().as_secs_f64(), a.offset()?));
        sb.push((t0.elapsed().as_secs_f64(), b.offset()?));
        std::thread::sleep(Duration::from_millis(5));
    }
    let load_s = t0.elapsed().as_secs_f64();
    let mut rate = String::new();
    let _ = std::fs::File::open(dir.join("benchmark.log"))?.read_to_string(&mut rate);
    wait_synced("127.0.112.84:19286", M, Duration::from_secs(120))?;
    wait_synced("127.0.112.81:19281", M, Duration::from_secs(120))?;
    let d = (
        digest(M)?,
        digest("127.0.112.81:19281")?,
        digest("127.0.112.84:19286")?,
    );
    if !(d.0 == d.1 && d.0 == d.2) {
        bail!("digests differ after the load: {d:?}");
    }
    drop(direct);
    drop(relayed);
    Ok(serde_json::json!({
        "dataset": { "keys": keys, "value_bytes": value, "used_memory": used },
        "full_sync": {
            "direct_tcp_s": direct_s,
            "relay_soft_cold_s": cold_s,
            "relay_soft_warm_s": warm_s,
            "cold_over_direct": cold_s / direct_s,
            "warm_over_direct": warm_s / direct_s,
            "digests_identical": identical,
        },
        "lag_under_load": {
            "load": format!("redis-benchmark -t set -n {LOAD_N} -d 100 -c 4 -r 1000000"),
            // Its progress lines end in CR; the summary is after the last one.
            "benchmark_output": rate.trim().rsplit('\r').next().unwrap_or("").trim(),
            "seconds": load_s,
            "direct_tcp": lag_stats(&hist, &sa),
            "relay_soft": lag_stats(&hist, &sb),
        },
    }))
}
