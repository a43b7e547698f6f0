//! Row `quinn-proto/ideal`: the ceiling any fabric under quinn-proto can reach.
//!
//! Two quinn-proto endpoints, each busy-polled on its own pinned thread (as
//! the engine rows are), joined by a "wire" that costs nothing per byte: a
//! transmit's buffer is handed to the other thread whole (an in-process
//! channel moves the `Vec`, no copy), cut into its datagrams without copying
//! (`BytesMut::split_to`) and passed to `Endpoint::handle`. No registered
//! memory, no GRH, no send or receive queues, no completions, no peer table:
//! none of the work a UD provider and our socket do. What is left is what
//! every QUIC stack on quinn-proto pays per byte — stream framing (one copy
//! into the packet), AES-GCM sealing and opening, header protection, ACK and
//! loss bookkeeping — plus the application's copy out of the stream, at the
//! fabric MTU (4096) and with the same transport and TLS configuration as the
//! engine rows. A provider that did all its work in hardware (a real RDMA NIC)
//! would approach this row; no quic-rdma path can beat it, so the bulk and CPU
//! goals it cannot reach against a peer are beyond quinn-proto at this MTU,
//! not beyond better fabric code.
//!
//! Handing the buffer over whole beat the alternative of copying each datagram
//! out on the receiver and returning the buffer to its sender (1 GiB, six
//! interleaved pairs of runs: 14.0–21.6 against 8.4–17.6 Gbit/s), so the
//! ceiling uses it. The sides live in one process (the wire is a channel): no
//! two-process placement.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_proto::{
    ClientConfig, ConnectionHandle, DatagramEvent, Dir, Endpoint, Event, ServerConfig, StreamId,
};

use super::exchange::{
    bulk_client, bulk_server, handshakes_client, reply_ok, rtt_client, rtt_server, Driver,
};
use super::{
    BulkOutcome, BulkParams, HandshakeOutcome, ProcessSide, Row, RttOutcome, SentPackets,
    SideOutcome,
};
use crate::affinity::Placement;
use crate::data::{self, SinkBuf};
use crate::side::{run_pair, DoneOnDrop, HANG_GUARD};
use crate::tls::{Tls, SERVER_NAME};

/// The fabric MTU the engine rows run at (RoCE's largest).
const MTU: usize = 4096;
/// Datagrams quinn-proto may build into one transmit (one buffer moved whole).
const MAX_SEGMENTS: usize = 16;
/// Longest sleep of an idle side in the instruction-count mode.
const IDLE_PARK_MAX: Duration = Duration::from_millis(1);

/// One transmit on the wire: datagrams of `seg` bytes (the last may be shorter).
struct Dgrams {
    buf: Vec<u8>,
    seg: usize,
}

/// The row (see the [module docs](self)).
#[derive(Debug, Default)]
pub struct Ideal {
    tls: Tls,
}

impl Ideal {
    /// The row.
    pub fn new() -> Self {
        Ideal { tls: Tls::new() }
    }

    /// (client, server) nodes joined by a fresh wire.
    fn nodes(&self, place: Placement) -> (Node, Node) {
        let transport = crate::tuning::transport(MTU);
        let server_cfg = Arc::new(self.tls.quinn_server(transport.clone()));
        let client_cfg = self.tls.quinn_client(transport);
        let (c_tx, s_rx) = channel();
        let (s_tx, c_rx) = channel();
        let addr = |port| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let (c_addr, s_addr) = (addr(1), addr(2));
        let spin = place == Placement::SeparateCores;
        let client = Node::new(None, Some(client_cfg), (c_tx, c_rx), s_addr, spin, 0xc1);
        let server = Node::new(Some(server_cfg), None, (s_tx, s_rx), c_addr, spin, 0x5e);
        (client, server)
    }
}

/// One endpoint, its connections and its end of the wire.
struct Node {
    ep: Endpoint,
    client_cfg: Option<ClientConfig>,
    conns: HashMap<ConnectionHandle, quinn_proto::Connection>,
    tx: Sender<Dgrams>,
    rx: Receiver<Dgrams>,
    /// The other node's address (the only one on this wire).
    peer: SocketAddr,
    /// Application events of the last poll.
    ev: Vec<(ConnectionHandle, Event)>,
    /// Stateless responses (version negotiation, retry, close) and accepts.
    resp: Vec<u8>,
    /// The next transmit's buffer (kept when quinn-proto had nothing to send).
    spare: Vec<u8>,
    /// A transmit taken off the wire while waiting idle, handled next poll.
    stash: Option<Dgrams>,
    spin: bool,
    deadline: Instant,
}

impl Node {
    fn new(
        server: Option<Arc<ServerConfig>>,
        client_cfg: Option<ClientConfig>,
        (tx, rx): (Sender<Dgrams>, Receiver<Dgrams>),
        peer: SocketAddr,
        spin: bool,
        routing_key: u32,
    ) -> Self {
        let ep_cfg = quic_rdma::quic::endpoint_config(MTU, routing_key);
        Node {
            ep: Endpoint::new(Arc::new(ep_cfg), server, false, None),
            client_cfg,
            conns: HashMap::new(),
            tx,
            rx,
            peer,
            ev: Vec::with_capacity(64),
            resp: Vec::with_capacity(MTU),
            spare: Vec::new(),
            stash: None,
            spin,
            deadline: Instant::now() + HANG_GUARD,
        }
    }

    fn conn(&mut self, ch: ConnectionHandle) -> anyhow::Result<&mut quinn_proto::Connection> {
        self.conns
            .get_mut(&ch)
            .ok_or_else(|| anyhow::anyhow!("connection {ch:?} is gone"))
    }

    /// Receive, run timers, pass endpoint events, collect application events
    /// (in `self.ev`), transmit. Idles (spin or yield) when nothing happened.
    fn poll(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        anyhow::ensure!(
            now < self.deadline,
            "side did not finish within {HANG_GUARD:?}"
        );
        self.ev.clear();
        let mut work = 0usize;
        while let Some(d) = self.stash.take().or_else(|| self.rx.try_recv().ok()) {
            work += 1;
            // A unique `Bytes` over a `Vec` becomes a `BytesMut` without a copy.
            let mut b = BytesMut::from(Bytes::from(d.buf));
            while !b.is_empty() {
                let one = b.split_to(d.seg.min(b.len()));
                self.resp.clear();
                match self
                    .ep
                    .handle(now, self.peer, None, None, one, &mut self.resp)
                {
                    Some(DatagramEvent::ConnectionEvent(ch, e)) => {
                        if let Some(c) = self.conns.get_mut(&ch) {
                            c.handle_event(e);
                        }
                    }
                    Some(DatagramEvent::NewConnection(inc)) => {
                        self.resp.clear();
                        match self.ep.accept(inc, now, &mut self.resp, None) {
                            Ok((ch, c)) => {
                                self.conns.insert(ch, c);
                            }
                            Err(e) => anyhow::bail!("accept: {}", e.cause),
                        }
                    }
                    Some(DatagramEvent::Response(t)) => {
                        let buf = self.resp[..t.size].to_vec();
                        let _ = self.tx.send(Dgrams { buf, seg: t.size });
                    }
                    None => {}
                }
            }
        }
        let mut drained = vec![];
        for (&ch, c) in &mut self.conns {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
                work += 1;
            }
            while let Some(e) = c.poll_endpoint_events() {
                if e.is_drained() {
                    drained.push(ch);
                }
                if let Some(ce) = self.ep.handle_event(ch, e) {
                    c.handle_event(ce);
                }
            }
            while let Some(e) = c.poll() {
                self.ev.push((ch, e));
            }
            loop {
                if self.spare.capacity() == 0 {
                    self.spare = Vec::with_capacity(MAX_SEGMENTS * MTU);
                }
                self.spare.clear();
                let Some(t) = c.poll_transmit(now, MAX_SEGMENTS, &mut self.spare) else {
                    break;
                };
                let mut buf = std::mem::take(&mut self.spare);
                work += 1;
                buf.truncate(t.size);
                let seg = t.segment_size.unwrap_or(t.size);
                // The other side gone: like a packet lost on the wire.
                let _ = self.tx.send(Dgrams { buf, seg });
            }
        }
        for ch in drained {
            self.conns.remove(&ch);
        }
        work += self.ev.len();
        if work == 0 {
            self.idle(now);
        }
        Ok(())
    }

    /// Nothing happened: spin (own core), yield (shared core), or — for
    /// instruction counts ([`super::engine::set_idle_sleep`]) — sleep until a
    /// transmit arrives or the next timer, so idle polls are not counted.
    fn idle(&mut self, now: Instant) {
        if self.spin {
            std::hint::spin_loop();
        } else if super::engine::idle_sleep() {
            let next = self
                .conns
                .values_mut()
                .filter_map(|c| c.poll_timeout())
                .min();
            let wait = next.map_or(IDLE_PARK_MAX, |t| t.saturating_duration_since(now));
            self.stash = self.rx.recv_timeout(wait.min(IDLE_PARK_MAX)).ok();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Driver for Node {
    type Conn = ConnectionHandle;
    type Stream = StreamId;
    /// The wire joins two nodes: a client connects to the other end.
    type Target = ();

    fn poll(&mut self) -> anyhow::Result<()> {
        Node::poll(self)
    }

    fn check_lost(&self, ch: ConnectionHandle) -> anyhow::Result<()> {
        for (c, e) in &self.ev {
            if let Event::ConnectionLost { reason } = e {
                anyhow::ensure!(*c != ch, "connection lost: {reason}");
            }
        }
        Ok(())
    }

    fn connect(&mut self, _: &()) -> anyhow::Result<ConnectionHandle> {
        let cfg = self
            .client_cfg
            .clone()
            .ok_or_else(|| anyhow::anyhow!("not a client"))?;
        let (ch, c) = self
            .ep
            .connect(Instant::now(), cfg, self.peer, SERVER_NAME)?;
        self.conns.insert(ch, c);
        loop {
            self.poll()?;
            self.check_lost(ch)?;
            if self
                .ev
                .iter()
                .any(|(c, e)| *c == ch && matches!(e, Event::Connected))
            {
                return Ok(ch);
            }
        }
    }

    fn accept(&mut self) -> anyhow::Result<ConnectionHandle> {
        loop {
            self.poll()?;
            if let Some((ch, _)) = self.ev.iter().find(|(_, e)| matches!(e, Event::Connected)) {
                return Ok(*ch);
            }
        }
    }

    fn open_bi(&mut self, ch: ConnectionHandle) -> anyhow::Result<StreamId> {
        self.conn(ch)?
            .streams()
            .open(Dir::Bi)
            .ok_or_else(|| anyhow::anyhow!("no stream credit"))
    }

    fn accept_stream(&mut self, ch: ConnectionHandle) -> anyhow::Result<StreamId> {
        loop {
            if let Some(s) = self.conn(ch)?.streams().accept(Dir::Bi) {
                return Ok(s);
            }
            self.poll()?;
            self.check_lost(ch)?;
        }
    }

    fn write_chunk(
        &mut self,
        ch: ConnectionHandle,
        s: StreamId,
        chunk: &mut Bytes,
    ) -> anyhow::Result<Option<usize>> {
        let mut chunks = [std::mem::take(chunk)];
        let r = self.conn(ch)?.send_stream(s).write_chunks(&mut chunks);
        let [rest] = chunks;
        *chunk = rest;
        match r {
            Ok(w) => Ok(Some(w.bytes)),
            Err(quinn_proto::WriteError::Blocked) => Ok(None),
            Err(e) => anyhow::bail!("write: {e}"),
        }
    }

    /// Queued now; sent by the next poll's transmit pass (there is no
    /// separate flush: a poll is the whole I/O step here).
    fn write_all(&mut self, ch: ConnectionHandle, s: StreamId, data: &[u8]) -> anyhow::Result<()> {
        let n = self.conn(ch)?.send_stream(s).write(data)?;
        anyhow::ensure!(n == data.len(), "write refused");
        self.poll()
    }

    fn finish(&mut self, ch: ConnectionHandle, s: StreamId) -> anyhow::Result<()> {
        Ok(self.conn(ch)?.send_stream(s).finish()?)
    }

    fn read_some(
        &mut self,
        ch: ConnectionHandle,
        s: StreamId,
        buf: &mut [u8],
        got: &mut usize,
    ) -> anyhow::Result<bool> {
        let c = self.conn(ch)?;
        let mut rs = c.recv_stream(s);
        let mut chunks = match rs.read(true) {
            Ok(ch) => ch,
            Err(e) => anyhow::bail!("read: {e:?}"),
        };
        let mut fin = false;
        while *got < buf.len() {
            match chunks.next(buf.len() - *got) {
                Ok(Some(k)) => {
                    buf[*got..*got + k.bytes.len()].copy_from_slice(&k.bytes);
                    *got += k.bytes.len();
                }
                Ok(None) => {
                    fin = true;
                    break;
                }
                Err(quinn_proto::ReadError::Blocked) => break,
                Err(e) => anyhow::bail!("read: {e}"),
            }
        }
        let _ = chunks.finalize();
        Ok(fin)
    }

    fn close_now(&mut self, ch: ConnectionHandle) -> anyhow::Result<()> {
        self.conn(ch)?
            .close(Instant::now(), 0u32.into(), Bytes::from_static(b"done"));
        Ok(())
    }

    fn drain(&mut self, limit: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + limit;
        while !self.conns.is_empty() && Instant::now() < until {
            self.poll()?;
        }
        Ok(())
    }
    fn sent_packets(&self, ch: ConnectionHandle) -> Option<SentPackets> {
        self.conns.get(&ch).map(|c| SentPackets::of(&c.stats()))
    }
}

impl Row for Ideal {
    fn name(&self) -> String {
        "quinn-proto/ideal".into()
    }

    fn description(&self) -> String {
        format!(
            "quinn-proto alone over a zero-copy in-process wire (the ceiling of any fabric \
             under quinn-proto), MTU {MTU}, busy-polled"
        )
    }

    fn bulk(&self, p: BulkParams, place: Placement) -> anyhow::Result<BulkOutcome> {
        let pattern = Bytes::from(data::pattern());
        let expected = p.verify.then(|| data::expected_digest(&pattern, p.bytes));
        let mut sink = SinkBuf::new(p.bytes, p.verify);
        let (mut cn, mut sn) = self.nodes(place);
        let done = AtomicBool::new(false);
        let (pattern, sink_ref, done) = (&pattern, &mut sink, &done);
        let ((secs, ccpu, reply), scpu) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                bulk_client(&mut cn, &(), p, pattern)
            },
            move || {
                let cpu = bulk_server(&mut sn, sink_ref)?;
                sn.linger(done)?;
                Ok(cpu)
            },
        )?;
        Ok(BulkOutcome {
            bytes: p.bytes,
            secs,
            sha256_ok: sink.received() == p.bytes && reply_ok(reply, expected),
            client_cpu: ccpu,
            server_cpu: scpu,
        })
    }

    fn rtt(&self, iters: usize, place: Placement) -> anyhow::Result<RttOutcome> {
        let (mut cn, mut sn) = self.nodes(place);
        let done = AtomicBool::new(false);
        let done = &done;
        let ((samples, client_sent), server_sent) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                rtt_client(&mut cn, &(), iters)
            },
            move || {
                let sent = rtt_server(&mut sn, done)?;
                sn.linger(done)?;
                Ok(sent)
            },
        )?;
        Ok(RttOutcome {
            samples_ns: samples,
            sent: client_sent.zip(server_sent),
        })
    }

    fn handshakes(&self, count: usize, place: Placement) -> anyhow::Result<HandshakeOutcome> {
        let (mut cn, mut sn) = self.nodes(place);
        let done = AtomicBool::new(false);
        let done = &done;
        let (secs, ()) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                handshakes_client(&mut cn, &(), count)
            },
            move || sn.linger(done),
        )?;
        Ok(HandshakeOutcome {
            count: count as u64,
            secs,
        })
    }

    fn crosses_processes(&self) -> bool {
        false
    }

    fn bulk_side(&self, _: BulkParams, _: ProcessSide<'_>) -> anyhow::Result<SideOutcome> {
        anyhow::bail!("the ideal wire lives inside one process: it cannot cross processes")
    }

    fn rtt_side(&self, _: usize, _: ProcessSide<'_>) -> anyhow::Result<Vec<u64>> {
        anyhow::bail!("the ideal wire lives inside one process: it cannot cross processes")
    }

    fn handshakes_side(&self, _: usize, _: ProcessSide<'_>) -> anyhow::Result<f64> {
        anyhow::bail!("the ideal wire lives inside one process: it cannot cross processes")
    }
}
