//! KV sync benchmark: Redis replication through `qr kv-relay upstream` →
//! fabric (`soft`, mutual TLS) → `qr kv-relay downstream`, against Redis's
//! own replication over TCP, in one run: full syncs (repeats interleaved),
//! catch-up after write bursts, replication lag under a steady write load,
//! and how replicas resume after their link is cut.
//!
//! ```sh
//! cargo build --release -p quic-rdma-tools --bin qr
//! cargo run --release -p quic-rdma-benches --bin kv-sync -- [--gib 1.0] [--repeats 3] [--quick] [--out benches/results/kv_sync.json]
//! ```
//!
//! Needs `redis-server` and `redis-benchmark` on PATH; `qr` is taken from
//! next to this binary (the same target directory) unless `--qr` names it.
//! Addresses 127.0.112.80..86, TCP ports 19280..19299.
//!
//! Full sync, per repeat: "direct", a fresh replica of the master over TCP,
//! from start to online at the master's offset; "cold", the relays started
//! with an empty `--dir` and a fresh replica behind them, the clock running
//! from starting the upstream relay (every hop pipelined); "warm", a second
//! fresh replica through relays that hold the snapshot. Odd repeats run the
//! relays first.
//!
//! Catch-up: one direct and one relayed replica follow the master through
//! write bursts of 120 MB (`burst_args`); each burst's catch-up is the time
//! from its end until the replica holds the master's offset at that end.
//!
//! Lag: while `redis-benchmark` runs SETs, a sampler reads both replicas'
//! offsets and the master's every 5 ms. A replica's lag at a sample is how
//! long ago the master was last at or below the replica's offset (0 when it
//! has everything), and the bytes it lacks.
//!
//! Resyncs: each replica's link is cut three times during writes (`CLIENT
//! KILL TYPE master` on the replica); partial and full resyncs are counted
//! on the master (direct) and on the upstream relay (relayed). `DEBUG
//! DIGEST` of master and both replicas must be equal after every phase.
//!
//! `--quick` shrinks the bursts and the load tenfold (with a small `--gib`,
//! `benches/tests/kv_sync_quick.rs` runs it in the test command).

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
    let mut repeats = 3usize;
    let mut quick = false;
    let mut out = PathBuf::from("benches/results/kv_sync.json");
    let mut qr = std::env::current_exe()?.with_file_name("qr");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gib" => gib = args.next().context("--gib N")?.parse()?,
            "--out" => out = args.next().context("--out FILE")?.into(),
            "--qr" => qr = args.next().context("--qr PATH")?.into(),
            "--repeats" => repeats = args.next().context("--repeats N")?.parse()?,
            "--quick" => quick = true,
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
    let result = run(&dir, &qr, gib, repeats, quick);
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

/// The steady write load the lag is sampled under (`redis-benchmark`
/// arguments; the JSON's description is built from these). `--quick` runs
/// a tenth of it.
fn load_args(quick: bool) -> Vec<&'static str> {
    let n = if quick { "200000" } else { "2000000" };
    vec![
        "-t", "set", "-n", n, "-d", "100", "-c", "20", "-P", "8", "-r", "1000000",
    ]
}

/// One write burst: 1200 SETs of 100 kB values, pipelined — 120 MB of
/// values as fast as the master takes them (the issue's burst size);
/// `--quick`: 12 MB.
fn burst_args(quick: bool) -> Vec<&'static str> {
    let n = if quick { "120" } else { "1200" };
    vec![
        "-t", "set", "-n", n, "-d", "100000", "-c", "20", "-P", "16", "-r", "1000000",
    ]
}

const M: &str = "127.0.112.80:19280";
/// The direct replica.
const DIRECT: (&str, u16) = ("127.0.112.81", 19281);
/// The replica behind the relays, kept for the burst, lag and resync phases.
const RELAYED: (&str, u16) = ("127.0.112.84", 19286);
/// Fresh replicas timed through the relays.
const RELAYED_FRESH: (&str, u16) = ("127.0.112.85", 19287);
const UP_METRICS: &str = "127.0.112.82:19283";

fn addr((h, p): (&str, u16)) -> String {
    format!("{h}:{p}")
}

/// A fresh replica (empty data dir) of `of`, timed from its start until it
/// is online at the master's offset.
fn fresh_replica(dir: &Path, at: (&str, u16), of: &str) -> Result<(Proc, f64)> {
    let data = dir.join(format!("r{}", at.1));
    let _ = std::fs::remove_dir_all(&data);
    let (h, p) = of.split_once(':').context("host:port")?;
    let t = Instant::now();
    let r = redis(dir, at.0, at.1, &["--replicaof", h, p])?;
    wait_synced(&addr(at), M, Duration::from_secs(1800))?;
    Ok((r, t.elapsed().as_secs_f64()))
}

/// The two relays (mutual TLS over `soft`), the upstream's `--dir` emptied
/// first: a cold start.
struct Relays {
    _down: Proc,
    _up: Proc,
}

fn start_relays(dir: &Path, qr: &Path) -> Result<Relays> {
    let pki = dir.join("pki");
    if !pki.join("ca.pem").exists() {
        let st = Command::new(qr)
            .args(["cert", "--dir"])
            .arg(&pki)
            .args(["--leaf", "up=127.0.112.82", "--leaf", "down=127.0.112.83"])
            .output()?;
        if !st.status.success() {
            bail!("qr cert: {st:?}");
        }
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
    let snap = dir.join("snap");
    let _ = std::fs::remove_dir_all(&snap);
    let up = spawn(
        Command::new(qr)
            .args(["kv-relay", "upstream", "--ip", "127.0.112.82"])
            .args(["--service-port", "19282", "--metrics", UP_METRICS])
            .args(["--master", M, "--backlog", "256M"])
            .arg("--dir")
            .arg(&snap)
            .args(mtls("up"))
            .args(live),
        &dir.join("up.log"),
    )?;
    wait_port("127.0.112.82:19282")?;
    let down = spawn(
        Command::new(qr)
            .args(["kv-relay", "downstream", "--ip", "127.0.112.83"])
            .args(["--upstream", "127.0.112.82:19282"])
            .args(["--listen", "127.0.112.83:19284"])
            .args(["--metrics", "127.0.112.83:19285"])
            .args(mtls("down"))
            .args(live),
        &dir.join("down.log"),
    )?;
    wait_port("127.0.112.83:19284")?;
    Ok(Relays {
        _down: down,
        _up: up,
    })
}

const DOWN: &str = "127.0.112.83:19284";

/// The sum of every series of `name` on a `/metrics` page.
fn metric_sum(at: &str, name: &str) -> Result<f64> {
    let mut s = TcpStream::connect(at)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// A counter of the master's `INFO stats`.
fn master_stat(key: &str) -> Result<u64> {
    let text = Client::connect(M)?.cmd(&["INFO", "stats"])?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .context(key.to_string())?
        .trim()
        .parse()
        .map_err(Into::into)
}

fn benchmark(dir: &Path, args: &[&str], log: &str) -> Result<Proc> {
    spawn(
        Command::new("redis-benchmark")
            .args(["-h", "127.0.112.80", "-p", "19280", "-q"])
            .args(args),
        &dir.join(log),
    )
}

fn median(v: &[f64]) -> f64 {
    percentile(&mut v.to_vec(), 0.5)
}

fn run(dir: &Path, qr: &Path, gib: f64, repeats: usize, quick: bool) -> Result<serde_json::Value> {
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

    // Full syncs, interleaved: each repeat times a fresh direct replica, the
    // relays started cold with a fresh replica behind them (the clock runs
    // from starting the upstream relay), and a second fresh replica behind
    // the now-warm relays; odd repeats run the relays first.
    let (mut direct_s, mut cold_s, mut warm_s) = (vec![], vec![], vec![]);
    let mut relays = None;
    for i in 0..repeats {
        let mut direct = || -> Result<()> {
            let (_r, s) = fresh_replica(dir, DIRECT, M)?;
            eprintln!("kv-sync: [{i}] direct full sync {s:.2} s");
            direct_s.push(s);
            Ok(())
        };
        if i % 2 == 0 {
            direct()?;
        }
        drop(relays.take()); // the previous relays stop before the cold start
        let t = Instant::now();
        relays = Some(start_relays(dir, qr)?);
        let (cold, _) = fresh_replica(dir, RELAYED_FRESH, DOWN)
            .with_context(|| std::fs::read_to_string(dir.join("down.log")).unwrap_or_default())?;
        cold_s.push(t.elapsed().as_secs_f64());
        drop(cold);
        let (warm, s) = fresh_replica(dir, RELAYED_FRESH, DOWN)?;
        warm_s.push(s);
        eprintln!(
            "kv-sync: [{i}] relays cold {:.2} s, warm {s:.2} s",
            cold_s[i]
        );
        drop(warm);
        if i % 2 == 1 {
            direct()?;
        }
    }
    let _relays = relays.context("--repeats 0")?;

    // The replicas the rest follows with: one direct, one behind the relays.
    let (direct, _) = fresh_replica(dir, DIRECT, M)?;
    let (relayed, _) = fresh_replica(dir, RELAYED, DOWN)?;
    let digest = |a: &str| Client::connect(a).and_then(|mut c| c.cmd(&["DEBUG", "DIGEST"]));
    let same_digests = |when: &str| -> Result<()> {
        wait_synced(&addr(DIRECT), M, Duration::from_secs(120))?;
        wait_synced(&addr(RELAYED), M, Duration::from_secs(120))?;
        let d = (digest(M)?, digest(&addr(DIRECT))?, digest(&addr(RELAYED))?);
        if !(d.0 == d.1 && d.0 == d.2) {
            bail!("digests differ {when}: {d:?}");
        }
        Ok(())
    };
    same_digests("after the full syncs")?;

    // Catch-up after write bursts: the time from the burst's end until each
    // replica holds the master's offset at that end.
    let (mut a, mut b, mut m) = (
        Client::connect(&addr(DIRECT))?,
        Client::connect(&addr(RELAYED))?,
        Client::connect(M)?,
    );
    let (mut catch_direct, mut catch_relayed, mut burst_bytes, mut burst_s) =
        (vec![], vec![], vec![], vec![]);
    for i in 0..repeats.max(3) {
        let before = m.offset()?;
        let started = Instant::now();
        let mut burst = benchmark(dir, &burst_args(quick), "burst.log")?;
        burst.0.wait()?;
        let end = m.offset()?;
        burst_s.push(started.elapsed().as_secs_f64());
        let t = Instant::now();
        let (mut da, mut db) = (None, None);
        while da.is_none() || db.is_none() {
            if da.is_none() && a.offset()? >= end {
                da = Some(t.elapsed().as_secs_f64());
            }
            if db.is_none() && b.offset()? >= end {
                db = Some(t.elapsed().as_secs_f64());
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("burst {i}: a replica did not catch up within 120 s");
            }
        }
        let (da, db) = (da.unwrap_or_default(), db.unwrap_or_default());
        eprintln!(
            "kv-sync: burst {i}: {} B, caught up direct {:.3} s, relays {:.3} s",
            end - before,
            da,
            db
        );
        catch_direct.push(da);
        catch_relayed.push(db);
        burst_bytes.push((end - before) as f64);
    }
    same_digests("after the bursts")?;

    // Lag under a steady write load, both replicas at once.
    let mut bench = benchmark(dir, &load_args(quick), "benchmark.log")?;
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
    same_digests("after the load")?;

    // Partial resyncs: each replica's link to its master is cut
    // (`CLIENT KILL TYPE master` on the replica); it reconnects with PSYNC.
    // Direct: the master's counters; through the relays: the upstream
    // relay's (the replica's PSYNC reaches it over the fabric).
    let counts = || -> Result<[f64; 4]> {
        Ok([
            master_stat("sync_partial_ok")? as f64,
            master_stat("sync_full")? as f64,
            metric_sum(UP_METRICS, "qr_kv_sync_partial_ok_total")?,
            metric_sum(UP_METRICS, "qr_kv_sync_full_total")?,
        ])
    };
    let cuts = 3;
    let c0 = counts()?;
    for _ in 0..cuts {
        let mut w = benchmark(dir, &["-t", "set", "-n", "20000", "-d", "100"], "cut.log")?;
        a.cmd(&["CLIENT", "KILL", "TYPE", "master"])?;
        b.cmd(&["CLIENT", "KILL", "TYPE", "master"])?;
        w.0.wait()?;
        same_digests("after a cut link")?;
    }
    let c1 = counts()?;
    let resync = serde_json::json!({
        "links_cut": cuts,
        "direct_partial": c1[0] - c0[0],
        "direct_full": c1[1] - c0[1],
        "relays_partial": c1[2] - c0[2],
        "relays_full": c1[3] - c0[3],
    });
    eprintln!("kv-sync: resyncs after {cuts} cut links: {resync}");
    drop(direct);
    drop(relayed);
    Ok(serde_json::json!({
        "dataset": { "keys": keys, "value_bytes": value, "used_memory": used },
        "repeats": repeats,
        "full_sync": {
            "direct_tcp_s": direct_s,
            "relay_soft_cold_s": cold_s,
            "relay_soft_warm_s": warm_s,
            "median_cold_over_direct": median(&cold_s) / median(&direct_s),
            "median_warm_over_direct": median(&warm_s) / median(&direct_s),
            "digests_identical": true,
        },
        "catch_up_after_burst": {
            "burst": format!("redis-benchmark {}", burst_args(quick).join(" ")),
            "burst_bytes": burst_bytes,
            "direct_tcp_s": catch_direct,
            "relay_soft_s": catch_relayed,
            "burst_s": burst_s,
            // No ratio when the direct replica was caught up before the
            // sampler could tell (below a millisecond).
            "median_relay_over_direct": (median(&catch_direct) >= 1e-3)
                .then(|| median(&catch_relayed) / median(&catch_direct)),
        },
        "lag_under_load": {
            "load": format!("redis-benchmark {}", load_args(quick).join(" ")),
            // Its progress lines end in CR; the summary is after the last one.
            "benchmark_output": rate.trim().rsplit('\r').next().unwrap_or("").trim(),
            "seconds": load_s,
            "direct_tcp": lag_stats(&hist, &sa),
            "relay_soft": lag_stats(&hist, &sb),
        },
        "partial_resync": resync,
    }))
}
