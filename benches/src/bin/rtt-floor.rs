//! `rtt-floor`: the work of one 64-byte request/response round trip, both
//! sides on one thread, no other thread, no waiting.
//!
//! ```text
//! rtt-floor [--mode quinn-proto|engine|raw-ud|all] [--iters N] [--batches B]
//! ```
//! In a ping-pong every step is on the critical path: the client builds and
//! seals the request, the server opens it, hands it to the application, and
//! builds and seals the response, which the client opens. With both sides on
//! one thread, a round trip takes exactly that work and nothing else — no
//! cross-core cache misses, no polling phase, no wake-ups — so its time is a
//! floor for the two-thread rows of `compare` on this machine:
//! - `quinn-proto`: two quinn-proto connections passing datagrams by hand
//!   (each copied once into a receive staging buffer, as the engine does):
//!   quinn-proto + rustls/ring alone, the floor of any QUIC stack on them;
//! - `engine`: two engines over the in-process `sim` fabric, driven as the
//!   `engine/sim` row drives them (write + flush, poll, read);
//! - `raw-ud`: two UD sockets over `sim`, one SEND each way (the `raw-ud/sim`
//!   row's work): the fabric's and socket's share.
//!
//! Prints, per mode, the median and minimum over `B` batches of the mean
//! nanoseconds per round trip of a batch (`N` round trips after 2000 of
//! warm-up), and checks every response's bytes. Run under callgrind with two
//! values of `--iters` for instructions per round trip without any harness
//! noise.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use quic_rdma::engine::{ConnHandle, Engine, EngineConfig, EngineError, Event, StreamId};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::socket::{SocketConfig, UdSocket};
use quinn_proto::{Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint};

use quic_rdma_benches::rows::RTT_MSG;
use quic_rdma_benches::tls::{Tls, SERVER_NAME};

const MTU: usize = 4096;
const WARMUP: usize = 2000;
/// Give up on a step that never completes (a bug, not a slow machine).
const MAX_STEPS: usize = 1_000_000;

fn main() -> anyhow::Result<()> {
    let mut mode = "all".to_string();
    let mut iters = 20_000usize;
    let mut batches = 5usize;
    let mut it = quic_rdma_benches::cli::Words::from_env();
    while let Some(a) = it.next() {
        let mut val = || it.value(&a);
        match a.as_str() {
            "--mode" => mode = val()?,
            "--iters" => iters = val()?.parse()?,
            "--batches" => batches = val()?.parse()?,
            "-h" | "--help" => {
                println!(
                    "rtt-floor [--mode quinn-proto|engine|raw-ud|all] [--iters N] [--batches B]"
                );
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(
        iters > 0 && batches > 0,
        "--iters and --batches must be > 0"
    );
    let modes: Vec<&str> = match mode.as_str() {
        "all" => vec!["raw-ud", "quinn-proto", "engine"],
        m @ ("raw-ud" | "quinn-proto" | "engine") => vec![m],
        other => anyhow::bail!("unknown mode {other} (quinn-proto, engine, raw-ud, all)"),
    };
    for m in modes {
        let mut pair: Box<dyn PingPong> = match m {
            "raw-ud" => Box::new(RawPair::new()?),
            "quinn-proto" => Box::new(ProtoPair::new()?),
            _ => Box::new(EnginePair::new()?),
        };
        for _ in 0..WARMUP {
            pair.round_trip()?;
        }
        let mut means = Vec::with_capacity(batches);
        for _ in 0..batches {
            let t0 = Instant::now();
            for _ in 0..iters {
                pair.round_trip()?;
            }
            means.push(t0.elapsed().as_nanos() as f64 / iters as f64);
        }
        means.sort_by(f64::total_cmp);
        println!(
            "{m:12} ns per round trip: median {:.0}, min {:.0} ({batches} batches of {iters})",
            means[means.len() / 2],
            means[0]
        );
    }
    Ok(())
}

/// One side pair that can run a round trip.
trait PingPong {
    /// Client writes 64 bytes, server reads and answers 64, client reads them.
    fn round_trip(&mut self) -> anyhow::Result<()>;
}

const REQ: [u8; RTT_MSG] = [0x5A; RTT_MSG];
const RESP: [u8; RTT_MSG] = [0xA5; RTT_MSG];

fn sim_qps() -> anyhow::Result<(SimQp, SimQp)> {
    let fabric = SimFabric::new(SimConfig::default());
    let gid = |k: u16| std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, k).into();
    Ok((
        fabric.create_qp(gid(1), SimQpOptions::default())?,
        fabric.create_qp(gid(2), SimQpOptions::default())?,
    ))
}

// ---- raw UD -----------------------------------------------------------------

struct RawPair {
    c: UdSocket<SimQp>,
    s: UdSocket<SimQp>,
}

impl RawPair {
    fn new() -> anyhow::Result<Self> {
        let (c, s) = sim_qps()?;
        Ok(RawPair {
            c: UdSocket::new(c, SocketConfig::default())?,
            s: UdSocket::new(s, SocketConfig::default())?,
        })
    }
}

/// Receive one datagram on `s` into `buf`; its sender.
fn raw_recv(
    s: &mut UdSocket<SimQp>,
    buf: &mut [u8; RTT_MSG],
) -> anyhow::Result<quic_rdma::fabric::UdAddr> {
    for _ in 0..MAX_STEPS {
        let mut from = None;
        s.reap_sends();
        s.recv(1, |r| {
            if r.data.len() == RTT_MSG {
                buf.copy_from_slice(r.data);
                from = Some(r.src);
            }
        });
        if let Some(f) = from {
            return Ok(f);
        }
    }
    anyhow::bail!("no datagram arrived")
}

impl PingPong for RawPair {
    fn round_trip(&mut self) -> anyhow::Result<()> {
        let mut buf = [0u8; RTT_MSG];
        self.c.send(self.s.local_addr(), 0, &REQ, None)?;
        let from = raw_recv(&mut self.s, &mut buf)?;
        anyhow::ensure!(buf == REQ, "request bytes");
        self.s.send(from, 0, &RESP, None)?;
        raw_recv(&mut self.c, &mut buf)?;
        anyhow::ensure!(buf == RESP, "response bytes");
        Ok(())
    }
}

// ---- the engine over sim -----------------------------------------------------

struct EnginePair {
    c: Engine<SimQp>,
    s: Engine<SimQp>,
    cc: ConnHandle,
    sc: ConnHandle,
    cs: StreamId,
    ss: Option<StreamId>,
    ev: Vec<Event>,
}

impl EnginePair {
    fn new() -> anyhow::Result<Self> {
        let tls = Tls::new();
        let transport = quic_rdma_benches::tuning::transport(MTU);
        let (cq, sq) = sim_qps()?;
        let mut s = Engine::new(
            sq,
            EngineConfig {
                server: Some(Arc::new(tls.quinn_server(transport.clone()))),
                routing_key: 0x5e,
                ..EngineConfig::default()
            },
        )?;
        let mut c = Engine::new(
            cq,
            EngineConfig {
                client: Some(tls.quinn_client(transport)),
                routing_key: 0xc1,
                ..EngineConfig::default()
            },
        )?;
        let cc = c.connect(Instant::now(), s.local_addr(), SERVER_NAME)?;
        let mut ev = Vec::with_capacity(64);
        let (mut c_up, mut sc) = (false, None);
        for _ in 0..MAX_STEPS {
            ev.clear();
            c.poll(Instant::now(), &mut ev);
            c_up |= ev.contains(&Event::Connected { conn: cc });
            ev.clear();
            s.poll(Instant::now(), &mut ev);
            for e in &ev {
                if let Event::Connected { conn } = e {
                    sc = Some(*conn);
                }
            }
            if c_up && sc.is_some() {
                break;
            }
        }
        let sc = sc.ok_or_else(|| anyhow::anyhow!("handshake did not complete"))?;
        anyhow::ensure!(c_up, "handshake did not complete");
        let cs = c.open_bi(cc)?;
        Ok(EnginePair {
            c,
            s,
            cc,
            sc,
            cs,
            ss: None,
            ev,
        })
    }
}

/// Poll `e` until `read` has `RTT_MSG` bytes of stream `s` (`None`: the first
/// stream the peer opens) in `buf`; the stream.
fn engine_read(
    e: &mut Engine<SimQp>,
    ev: &mut Vec<Event>,
    conn: ConnHandle,
    s: Option<StreamId>,
    buf: &mut [u8; RTT_MSG],
) -> anyhow::Result<StreamId> {
    let mut s = s;
    let mut got = 0;
    for _ in 0..MAX_STEPS {
        ev.clear();
        e.poll(Instant::now(), ev);
        if s.is_none() {
            s = ev.iter().find_map(|e| match e {
                Event::StreamOpened { conn: c, stream } if *c == conn => Some(*stream),
                _ => None,
            });
        }
        let Some(id) = s else { continue };
        match e.read(conn, id, &mut buf[got..]) {
            Ok(r) => got += r.len,
            Err(EngineError::WouldBlock) => {}
            Err(err) => return Err(err.into()),
        }
        if got == RTT_MSG {
            return Ok(id);
        }
    }
    anyhow::bail!("no message arrived")
}

impl PingPong for EnginePair {
    fn round_trip(&mut self) -> anyhow::Result<()> {
        let mut buf = [0u8; RTT_MSG];
        anyhow::ensure!(
            self.c.write(self.cc, self.cs, &REQ)? == RTT_MSG,
            "write refused"
        );
        self.c.flush(Instant::now());
        let ss = engine_read(&mut self.s, &mut self.ev, self.sc, self.ss, &mut buf)?;
        self.ss = Some(ss);
        anyhow::ensure!(buf == REQ, "request bytes");
        anyhow::ensure!(
            self.s.write(self.sc, ss, &RESP)? == RTT_MSG,
            "write refused"
        );
        self.s.flush(Instant::now());
        engine_read(&mut self.c, &mut self.ev, self.cc, Some(self.cs), &mut buf)?;
        anyhow::ensure!(buf == RESP, "response bytes");
        Ok(())
    }
}

// ---- quinn-proto alone ----------------------------------------------------------

/// One quinn-proto endpoint with its single connection.
struct ProtoSide {
    ep: Endpoint,
    conn: Option<(ConnectionHandle, Connection)>,
    peer: SocketAddr,
    /// Receive staging, split per datagram (the engine's `rx_buf`).
    rx: BytesMut,
    /// Transmit buffer, reused.
    tx: Vec<u8>,
    resp: Vec<u8>,
}

impl ProtoSide {
    fn new(server: Option<Arc<quinn_proto::ServerConfig>>, key: u32, peer: SocketAddr) -> Self {
        ProtoSide {
            ep: Endpoint::new(
                Arc::new(quic_rdma::quic::endpoint_config(MTU, key)),
                server,
                false,
                None,
            ),
            conn: None,
            peer,
            rx: BytesMut::with_capacity(MTU * 64),
            tx: Vec::with_capacity(MTU),
            resp: Vec::with_capacity(MTU),
        }
    }

    fn conn(&mut self) -> anyhow::Result<&mut Connection> {
        self.conn
            .as_mut()
            .map(|(_, c)| c)
            .ok_or_else(|| anyhow::anyhow!("no connection"))
    }

    /// One engine-like poll minus the receive: timers, endpoint events,
    /// application events (accepting new streams), then every transmit,
    /// appended to `out` in buffers taken from `pool` (no allocation per packet).
    fn transmit(&mut self, now: Instant, out: &mut Vec<Vec<u8>>, pool: &mut Vec<Vec<u8>>) {
        let Some((ch, c)) = self.conn.as_mut() else {
            return;
        };
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        while let Some(ev) = c.poll_endpoint_events() {
            if let Some(back) = self.ep.handle_event(*ch, ev) {
                c.handle_event(back);
            }
        }
        while let Some(ev) = c.poll() {
            if let quinn_proto::Event::Stream(quinn_proto::StreamEvent::Opened { dir }) = ev {
                while c.streams().accept(dir).is_some() {}
            }
        }
        loop {
            self.tx.clear();
            let Some(t) = c.poll_transmit(now, 1, &mut self.tx) else {
                break;
            };
            let mut v = pool.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(&self.tx[..t.size]);
            out.push(v);
        }
    }

    /// Hand one datagram to quinn-proto.
    fn receive(&mut self, now: Instant, d: &[u8]) -> anyhow::Result<()> {
        if self.rx.capacity() < d.len() {
            self.rx.reserve(MTU * 64);
        }
        self.rx.extend_from_slice(d);
        let data = self.rx.split();
        self.resp.clear();
        match self
            .ep
            .handle(now, self.peer, None, None, data, &mut self.resp)
        {
            Some(DatagramEvent::ConnectionEvent(_, ev)) => self.conn()?.handle_event(ev),
            Some(DatagramEvent::NewConnection(inc)) => {
                self.resp.clear();
                let (ch, c) = self
                    .ep
                    .accept(inc, now, &mut self.resp, None)
                    .map_err(|e| anyhow::anyhow!("accept: {}", e.cause))?;
                self.conn = Some((ch, c));
            }
            Some(DatagramEvent::Response(_)) | None => {}
        }
        Ok(())
    }

    /// Read `RTT_MSG` bytes of `stream` into `buf`; whether all were there.
    fn read(&mut self, stream: StreamId, buf: &mut [u8; RTT_MSG]) -> anyhow::Result<bool> {
        let c = self.conn()?;
        let mut rs = c.recv_stream(stream);
        let mut chunks = rs.read(true)?;
        let mut got = 0;
        while got < RTT_MSG {
            match chunks.next(RTT_MSG - got) {
                Ok(Some(k)) => {
                    buf[got..got + k.bytes.len()].copy_from_slice(&k.bytes);
                    got += k.bytes.len();
                }
                Ok(None) | Err(quinn_proto::ReadError::Blocked) => break,
                Err(e) => anyhow::bail!("read: {e}"),
            }
        }
        let _ = chunks.finalize();
        Ok(got == RTT_MSG)
    }
}

/// Two quinn-proto endpoints joined by hand.
struct ProtoPair {
    c: ProtoSide,
    s: ProtoSide,
    stream: Option<StreamId>,
    /// Datagrams of the current hand-over, and spare buffers.
    wire: Vec<Vec<u8>>,
    pool: Vec<Vec<u8>>,
}

impl ProtoPair {
    fn new() -> anyhow::Result<Self> {
        let tls = Tls::new();
        let transport = quic_rdma_benches::tuning::transport(MTU);
        let addr = |port| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let (c_addr, s_addr) = (addr(1), addr(2));
        let s = ProtoSide::new(
            Some(Arc::new(tls.quinn_server(transport.clone()))),
            0x5e,
            c_addr,
        );
        let mut c = ProtoSide::new(None, 0xc1, s_addr);
        let (ch, conn) = c.ep.connect(
            Instant::now(),
            tls.quinn_client(transport),
            s_addr,
            SERVER_NAME,
        )?;
        c.conn = Some((ch, conn));
        let mut p = ProtoPair {
            c,
            s,
            stream: None,
            wire: Vec::new(),
            pool: Vec::new(),
        };
        let up = |s: &ProtoSide| s.conn.as_ref().is_some_and(|(_, c)| !c.is_handshaking());
        for _ in 0..10_000 {
            p.exchange(true)?;
            p.exchange(false)?;
            if up(&p.c) && up(&p.s) {
                p.stream = p.c.conn()?.streams().open(Dir::Bi);
                anyhow::ensure!(p.stream.is_some(), "no stream credit");
                return Ok(p);
            }
        }
        anyhow::bail!("handshake did not complete")
    }

    /// Everything the client (`client`) or the server has to send, handed to
    /// the other side.
    fn exchange(&mut self, client: bool) -> anyhow::Result<()> {
        let now = Instant::now();
        let (from, to) = if client {
            (&mut self.c, &mut self.s)
        } else {
            (&mut self.s, &mut self.c)
        };
        from.transmit(now, &mut self.wire, &mut self.pool);
        for d in &self.wire {
            to.receive(now, d)?;
        }
        self.pool.append(&mut self.wire);
        Ok(())
    }
}

impl PingPong for ProtoPair {
    fn round_trip(&mut self) -> anyhow::Result<()> {
        let mut buf = [0u8; RTT_MSG];
        let st = self.stream.ok_or_else(|| anyhow::anyhow!("no stream"))?;
        anyhow::ensure!(
            self.c.conn()?.send_stream(st).write(&REQ)? == RTT_MSG,
            "write refused"
        );
        self.exchange(true)?;
        // As in the engine: the poll that received the request flushes
        // (timers, events, transmits) before the application reads.
        self.exchange(false)?;
        anyhow::ensure!(self.s.read(st, &mut buf)?, "request not all there");
        anyhow::ensure!(buf == REQ, "request bytes");
        anyhow::ensure!(
            self.s.conn()?.send_stream(st).write(&RESP)? == RTT_MSG,
            "write refused"
        );
        self.exchange(false)?;
        // The client's poll that received the response flushes too.
        self.exchange(true)?;
        anyhow::ensure!(self.c.read(st, &mut buf)?, "response not all there");
        anyhow::ensure!(buf == RESP, "response bytes");
        Ok(())
    }
}
