//! Multi-core engine scaling: 1 shard per side (1 thread, 1
//! connection) against 2 shards per side (2 threads, 2 connections, one
//! each), the same total bytes, runs interleaved.
//!
//! Each shard is an [`EngineGroup`] engine on a thread of its own; shard *i*
//! of the client uploads `total / shards` bytes on one stream of its
//! connection to shard *i* of the server. Per side it reports the CPU time of
//! that side's threads (`getrusage(RUSAGE_THREAD)`, user + system) per GiB
//! moved, and the throughput; and the wrong-core counter, which must be 0.
//!
//! Idle policy (`--idle`): `sleep` (the default but over a shared `soft`
//! port) parks an idle thread on the engine's waker (`sim`) or in `poll(2)`
//! on its socket (`soft-ports`), so CPU time is the work itself — a
//! shared-state cost shows as more CPU per GiB; `yield` gives the core away
//! and polls again (the only choice for shards sharing a `soft` port, which
//! wake each other through a waker, not the socket): on this 2-core machine
//! both cores are then always busy, idle polls count, and CPU per GiB
//! mirrors throughput.
//!
//! ```text
//! multicore [--provider sim|soft|soft-ports] [--mib N] [--rounds R] [--idle sleep|yield] [--shards N]
//! ```
//! `soft` puts a group's QPs on one port (one GID, one UDP socket, the
//! port's demultiplexer shared); `soft-ports` gives each shard a port (GID)
//! of its own, 127.0.151.x. `--shards N` runs only N shards per side (for
//! `valgrind --tool=callgrind --separate-threads=yes`: thread 1 is `main`,
//! 2 the sim wire thread, then the N server shards, then the N client shards).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use anyhow::bail;
use quic_rdma::engine::{Engine, EngineConfig, EngineGroup, Event};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{Provider, UdQueuePair, DEFAULT_QKEY};
use quic_rdma_benches::cpu::thread_cpu;
use quic_rdma_benches::tls::{Tls, SERVER_NAME};
use quic_rdma_benches::tuning;

/// Bytes per write.
const CHUNK: usize = 256 * 1024;
/// A run that takes longer has hung.
const HANG_GUARD: Duration = Duration::from_secs(120);
/// Longest park of an idle thread (a bound, in case a wake-up is missed).
const PARK_MAX: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Idle {
    Sleep,
    Yield,
}

struct Opts {
    provider: Provider,
    /// `soft-ports`: each shard a `soft` port (GID) of its own rather than
    /// all shards of a side on one port.
    port_per_shard: bool,
    bytes: u64,
    rounds: usize,
    idle: Idle,
    /// Shard counts run in each round, in order.
    shards: Vec<usize>,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        provider: Provider::Sim,
        port_per_shard: false,
        bytes: 1 << 30,
        rounds: 5,
        idle: Idle::Sleep,
        shards: vec![1, 2],
    };
    let mut idle_set = false;
    let mut args = quic_rdma_benches::cli::Words::from_env();
    while let Some(a) = args.next() {
        let mut val = || args.value(&a);
        match a.as_str() {
            "--provider" => {
                (o.provider, o.port_per_shard) = match val()?.as_str() {
                    "sim" => (Provider::Sim, false),
                    "soft" => (Provider::Soft, false),
                    "soft-ports" => (Provider::Soft, true),
                    p => bail!("unknown provider {p}: sim, soft or soft-ports"),
                }
            }
            "--mib" => o.bytes = val()?.parse::<u64>()? << 20,
            "--rounds" => o.rounds = val()?.parse()?,
            "--shards" => o.shards = vec![val()?.parse()?],
            "--idle" => {
                idle_set = true;
                o.idle = match val()?.as_str() {
                    "sleep" => Idle::Sleep,
                    "yield" => Idle::Yield,
                    i => bail!("unknown idle policy {i}: sleep or yield"),
                }
            }
            _ => bail!("usage: multicore [--provider sim|soft|soft-ports] [--mib N] [--rounds R] [--idle sleep|yield] [--shards N]"),
        }
    }
    if o.provider == Provider::Soft && !o.port_per_shard {
        // A packet the other shard parked for this one wakes a waker, not the
        // socket this shard would sleep on.
        if idle_set && o.idle == Idle::Sleep {
            bail!("--idle sleep needs sim or soft-ports: shards sharing a soft port wake each other through a waker, not the socket");
        }
        o.idle = Idle::Yield;
    }
    Ok(o)
}

/// What one run measured.
struct Run {
    wall: Duration,
    /// CPU seconds (user + system) of each side's threads.
    client_cpu: f64,
    server_cpu: f64,
    wrong_shard: u64,
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Poll `e` until `done` says so; `work` runs after every poll with its events.
/// Returns the thread's CPU seconds over the loop.
fn drive<Q: UdQueuePair>(
    e: &mut Engine<Q>,
    idle: Idle,
    mut work: impl FnMut(&mut Engine<Q>, &[Event]) -> bool,
) -> f64 {
    let cpu0 = thread_cpu();
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let guard = Instant::now() + HANG_GUARD;
    let mut ev = Vec::with_capacity(256);
    let mut last = (0, 0);
    loop {
        let now = Instant::now();
        assert!(now < guard, "run hung");
        ev.clear();
        e.poll(now, &mut ev);
        if work(e, &ev) {
            break;
        }
        let s = e.socket_stats();
        let progress = (s.recv_packets, s.sent_wrs);
        if ev.is_empty() && progress == last {
            match idle {
                Idle::Yield => std::thread::yield_now(),
                Idle::Sleep => {
                    if !e.arm(&waker) {
                        let until = e
                            .next_deadline()
                            .map_or(PARK_MAX, |d| d.saturating_duration_since(now))
                            .min(PARK_MAX);
                        match e.readiness_fd() {
                            Some(fd) => wait_readable(fd, until),
                            None => std::thread::park_timeout(until),
                        }
                    }
                }
            }
        }
        last = progress;
    }
    let cpu1 = thread_cpu();
    (cpu1.0 + cpu1.1)
        .saturating_sub(cpu0.0 + cpu0.1)
        .as_secs_f64()
}

/// Sleep until `fd` is readable or `until` passed (`soft`: its socket).
fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, until: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = until.as_micros().div_ceil(1000).min(1000) as u16;
    // Readable, timed out or interrupted: the caller polls the engine either way.
    let _ = poll(
        &mut [PollFd::new(fd, PollFlags::POLLIN)],
        PollTimeout::from(ms),
    );
}

/// The queue pairs of one side's `shards`, on GIDs of side `side` (0 client, 1 server).
fn make_qps<Q>(
    shards: usize,
    side: u8,
    mut sim: impl FnMut(IpAddr) -> anyhow::Result<Q>,
) -> anyhow::Result<Vec<Q>> {
    (0..shards)
        .map(|_| sim(Ipv4Addr::new(127, 0, 151, 1 + side).into()))
        .collect()
}

fn run_sim(shards: usize, o: &Opts, tls: &Tls) -> anyhow::Result<Run> {
    let fabric = SimFabric::new(SimConfig::default());
    let qp = |ip: IpAddr| {
        let IpAddr::V4(v4) = ip else { unreachable!() };
        Ok(fabric.create_qp(v4.into(), SimQpOptions::default())?)
    };
    let c = make_qps(shards, 0, qp)?;
    let s = make_qps(shards, 1, qp)?;
    run(c, s, o, tls)
}

fn run_soft(shards: usize, o: &Opts, tls: &Tls) -> anyhow::Result<Run> {
    let side_qps = |side: u8| -> anyhow::Result<Vec<_>> {
        if !o.port_per_shard {
            let port =
                SoftPort::open(SoftConfig::new(Ipv4Addr::new(127, 0, 151, 1 + side).into()))?;
            (0..shards)
                .map(|_| Ok(port.create_qp(DEFAULT_QKEY)?))
                .collect()
        } else {
            (0..shards)
                .map(|i| {
                    let ip = Ipv4Addr::new(127, 0, 151, 10 + 10 * side + i as u8);
                    Ok(SoftPort::open(SoftConfig::new(ip.into()))?.create_qp(DEFAULT_QKEY)?)
                })
                .collect()
        }
    };
    let c = side_qps(0)?;
    let s = side_qps(1)?;
    run(c, s, o, tls)
}

fn run<Q: UdQueuePair + Send>(
    cqps: Vec<Q>,
    sqps: Vec<Q>,
    o: &Opts,
    tls: &Tls,
) -> anyhow::Result<Run> {
    let shards = cqps.len();
    let mtu = quic_rdma::socket::segment::datagram_mtu(cqps[0].attr().active_mtu.bytes());
    let transport = tuning::transport(mtu);
    let scfg = EngineConfig {
        server: Some(Arc::new(tls.quinn_server(transport.clone()))),
        ..EngineConfig::default()
    };
    let ccfg = EngineConfig {
        client: Some(tls.quinn_client(transport)),
        ..EngineConfig::default()
    };
    let server = EngineGroup::new(sqps, scfg)?;
    let mut client = EngineGroup::new(cqps, ccfg)?;
    let dir = server.addrs();
    let now = Instant::now();
    let conns = (0..shards)
        .map(|n| client.connect(now, n, &dir, SERVER_NAME))
        .collect::<Result<Vec<_>, _>>()?;
    let per_conn = o.bytes / shards as u64;
    // Shards whose server side has read its stream to the end.
    let finished = AtomicUsize::new(0);
    let idle = o.idle;
    let t0 = Instant::now();
    let (ccpu, scpu, wrong) = std::thread::scope(|sc| {
        let finished = &finished;
        let servers: Vec<_> = server
            .into_shards()
            .into_iter()
            .map(|mut e| {
                sc.spawn(move || {
                    let mut buf = vec![0u8; CHUNK];
                    let mut got = 0u64;
                    let mut fin = false;
                    let mut stream = None;
                    let cpu = drive(&mut e, idle, |e, ev| {
                        for x in ev {
                            if let Event::StreamOpened { conn, stream: s } = *x {
                                stream = Some((conn, s));
                            }
                        }
                        if let (Some((c, s)), false) = (stream, fin) {
                            while let Ok(r) = e.read(c, s, &mut buf) {
                                got += r.len as u64;
                                if r.fin {
                                    fin = true;
                                    finished.fetch_add(1, Ordering::Release);
                                    break;
                                }
                            }
                        }
                        finished.load(Ordering::Acquire) == shards
                    });
                    assert_eq!(got, per_conn, "server shard received all");
                    (cpu, e.routing_stats().wrong_shard)
                })
            })
            .collect();
        let clients: Vec<_> = client
            .into_shards()
            .into_iter()
            .zip(conns.iter().map(|c| c.1))
            .map(|(mut e, conn)| {
                sc.spawn(move || {
                    let data = vec![0x5au8; CHUNK];
                    let mut sent = 0u64;
                    let mut stream = None;
                    let mut fin = false;
                    let cpu = drive(&mut e, idle, |e, ev| {
                        if stream.is_none() && ev.contains(&Event::Connected { conn }) {
                            stream = Some(e.open_uni(conn).expect("open stream"));
                        }
                        if let Some(s) = stream {
                            while sent < per_conn {
                                let n = (per_conn - sent).min(CHUNK as u64) as usize;
                                match e.write(conn, s, &data[..n]) {
                                    Ok(w) => sent += w as u64,
                                    Err(_) => break,
                                }
                            }
                            if sent == per_conn && !fin {
                                e.finish(conn, s).expect("finish");
                                fin = true;
                            }
                        }
                        finished.load(Ordering::Acquire) == shards
                    });
                    (cpu, e.routing_stats().wrong_shard)
                })
            })
            .collect();
        let sum = |v: Vec<std::thread::ScopedJoinHandle<'_, (f64, u64)>>| {
            v.into_iter()
                .map(|h| h.join().expect("side thread"))
                .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        };
        let (sc_, sw) = sum(servers);
        let (cc, cw) = sum(clients);
        (cc, sc_, sw + cw)
    });
    Ok(Run {
        wall: t0.elapsed(),
        client_cpu: ccpu,
        server_cpu: scpu,
        wrong_shard: wrong,
    })
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    let tls = Tls::new();
    let gib = o.bytes as f64 / f64::from(1u32 << 30);
    println!(
        "# multicore: provider {}, {} MiB per run, idle {:?}, {} rounds, interleaved 1/2 shards",
        if o.port_per_shard {
            "SoftPorts".to_string()
        } else {
            format!("{:?}", o.provider)
        },
        o.bytes >> 20,
        o.idle,
        o.rounds
    );
    println!("round shards  Gbit/s  client_cpu_s/GiB  server_cpu_s/GiB  wrong_core  load(1/5/15)");
    let mut per: [Vec<(f64, f64, f64)>; 2] = Default::default();
    for r in 0..o.rounds {
        for (k, &shards) in o.shards.iter().enumerate() {
            let run = match o.provider {
                Provider::Sim => run_sim(shards, &o, &tls)?,
                Provider::Soft => run_soft(shards, &o, &tls)?,
                Provider::Verbs => bail!("multicore has no verbs run"),
            };
            let gbps = o.bytes as f64 * 8.0 / run.wall.as_secs_f64() / 1e9;
            let (c, s) = (run.client_cpu / gib, run.server_cpu / gib);
            println!(
                "{r:5} {shards:6}  {gbps:6.2}  {c:16.3}  {s:16.3}  {:10}  {}",
                run.wrong_shard,
                load()
            );
            assert_eq!(run.wrong_shard, 0, "a packet landed on the wrong core");
            per[k].push((gbps, c, s));
        }
    }
    if o.shards.len() != 2 {
        return Ok(());
    }
    let range = |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| {
        let xs: Vec<f64> = v.iter().map(f).collect();
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(0.0, f64::max);
        let mut s = xs.clone();
        s.sort_by(f64::total_cmp);
        (lo, s[s.len() / 2], hi)
    };
    println!("# summary (min / median / max)");
    for (k, v) in per.iter().enumerate() {
        let g = range(v, |x| x.0);
        let c = range(v, |x| x.1);
        let s = range(v, |x| x.2);
        println!(
            "shards {}: Gbit/s {:.2}/{:.2}/{:.2}  client CPU-s/GiB {:.3}/{:.3}/{:.3}  server CPU-s/GiB {:.3}/{:.3}/{:.3}",
            k + 1, g.0, g.1, g.2, c.0, c.1, c.2, s.0, s.1, s.2
        );
    }
    // Ratio of medians of the per-round ratios (each round's pair ran back to back).
    let ratios = |f: fn(&(f64, f64, f64)) -> f64| {
        let mut r: Vec<f64> = per[1]
            .iter()
            .zip(&per[0])
            .map(|(b, a)| f(b) / f(a))
            .collect();
        r.sort_by(f64::total_cmp);
        (r[0], r[r.len() / 2], r[r.len() - 1])
    };
    let c = ratios(|x| x.1);
    let s = ratios(|x| x.2);
    let g = ratios(|x| x.0);
    println!(
        "2 vs 1 shards, per-round ratios (min/median/max): client CPU/GiB {:.2}/{:.2}/{:.2}, server CPU/GiB {:.2}/{:.2}/{:.2}, throughput {:.2}/{:.2}/{:.2}",
        c.0, c.1, c.2, s.0, s.1, s.2, g.0, g.1, g.2
    );
    Ok(())
}
