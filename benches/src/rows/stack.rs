//! Async transports (quinn over anything, TCP, TLS): a narrow trait, and the
//! workloads written once over it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{
    BulkOutcome, BulkParams, HandshakeOutcome, ProcessSide, Row, RttOutcome, SideOutcome, RTT_MSG,
    RTT_WARMUP, WRITE_CHUNK,
};
use crate::affinity::Placement;
use crate::cpu::{CpuSpan, CpuUsed};
use crate::data::{self, SinkBuf};
use crate::side::{block_on, block_on_spinning, run_pair};

/// A boxed future of one side (runs on that side's single-threaded runtime).
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + 'a>>;
/// The receiving half of a stream.
pub type Reader = Box<dyn AsyncRead + Unpin>;
/// The sending half of a stream.
pub type Writer = Box<dyn StreamWrite>;

/// What the workloads need of a sending half: `AsyncWrite`, and handing over a
/// whole buffer. A stack that can take the buffer without copying it does
/// (quinn's `write_chunk`); a byte-stream socket copies it (`write_all`), as
/// its API requires.
pub trait StreamWrite: AsyncWrite + Unpin {
    /// Send all of `data`.
    fn write_bytes(&mut self, data: bytes::Bytes) -> BoxFut<'_, ()>;
}

impl StreamWrite for quinn::SendStream {
    fn write_bytes(&mut self, data: bytes::Bytes) -> BoxFut<'_, ()> {
        Box::pin(async move { Ok(self.write_chunk(data).await?) })
    }
}

impl<S: AsyncWrite> StreamWrite for tokio::io::WriteHalf<S> {
    fn write_bytes(&mut self, data: bytes::Bytes) -> BoxFut<'_, ()> {
        Box::pin(async move { Ok(self.write_all(&data).await?) })
    }
}

/// An async transport: what a row must provide.
pub trait AsyncStack: Send + Sync {
    /// Short unique name.
    fn name(&self) -> String;
    /// One line on what runs.
    fn description(&self) -> String;
    /// In the server thread: start listening; returns the listener and the address to dial.
    fn listen(&self) -> BoxFut<'_, (Box<dyn Listener>, SocketAddr)>;
    /// In the client thread: something that connects to `addr`.
    fn dialer(&self, addr: SocketAddr) -> BoxFut<'_, Box<dyn Dialer>>;
    /// Whether client and server may live in different processes.
    fn crosses_processes(&self) -> bool {
        true
    }
}

/// The server end: accepts connections.
pub trait Listener {
    /// The next connection, handshake completed.
    fn accept(&mut self) -> BoxFut<'_, Box<dyn Session>>;
}

/// The client end: makes connections.
pub trait Dialer {
    /// A new connection, handshake completed.
    fn connect(&mut self) -> BoxFut<'_, Box<dyn Session>>;
    /// Let closes in flight reach the peer before the side exits.
    fn shutdown(self: Box<Self>) -> BoxFut<'static, ()>;
}

/// One connection.
pub trait Session {
    /// Client: open the connection's one bidirectional stream.
    fn open(&mut self) -> BoxFut<'_, (Reader, Writer)>;
    /// Server: accept it (may complete only when its first bytes arrive).
    fn accept(&mut self) -> BoxFut<'_, (Reader, Writer)>;
    /// Client: close now. Server: wait (bounded) for the client's close, so
    /// nothing the server sent is cut off.
    fn close(self: Box<Self>) -> BoxFut<'static, ()>;
}

/// Any [`AsyncStack`] as a [`Row`]: as its users run it (each side's tasks
/// sleep in the runtime until the kernel reports readiness), or busy-polled
/// ([`spinning`](Self::spinning)).
#[derive(Debug)]
pub struct AsyncRow<S>(S, Polling);

/// How the sides of an [`AsyncRow`] wait for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Polling {
    /// Sleep in epoll until something is ready.
    Sleep,
    /// Never sleep: readers wake themselves, the runtime polls epoll with a
    /// zero timeout every tick.
    Spin,
}

impl<S: AsyncStack> AsyncRow<S> {
    /// Wrap a stack.
    pub fn new(stack: S) -> Self {
        AsyncRow(stack, Polling::Sleep)
    }

    /// Wrap a stack, busy-polled: the fair latency peer of a busy-polled
    /// engine (`<name>+spin`; RTT only).
    pub fn spinning(stack: S) -> Self {
        AsyncRow(stack, Polling::Spin)
    }

    fn spins(&self) -> bool {
        self.1 == Polling::Spin
    }
}

/// How the RTT workload's readers wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadMode {
    /// As the stack's users run it: the task sleeps until woken.
    Sleep,
    /// Busy-poll ([`SpinRead`]).
    Spin,
    /// Busy-poll, giving the core away between polls (`sched_yield`): the two
    /// sides share one core, as the engine rows do there.
    SpinYield,
}

impl ReadMode {
    fn of(spin: bool, place: Placement) -> Self {
        match (spin, place) {
            (false, _) => ReadMode::Sleep,
            (true, Placement::SeparateCores) => ReadMode::Spin,
            (true, Placement::SameCore) => ReadMode::SpinYield,
        }
    }
}

/// A reader that never lets its task sleep: when the inner reader would wait,
/// it wakes its own task at once, so the runtime polls again (and polls the
/// kernel in between) instead of parking in `epoll_wait`.
pub struct SpinRead {
    inner: Reader,
    /// Yield the core each time nothing was ready (a shared core).
    yield_cpu: bool,
}

impl AsyncRead for SpinRead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_pending() {
            if self.yield_cpu {
                std::thread::yield_now();
            }
            cx.waker().wake_by_ref();
        }
        r
    }
}

/// `r`, read as `mode` says.
fn reader(r: Reader, mode: ReadMode) -> Reader {
    match mode {
        ReadMode::Sleep => r,
        ReadMode::Spin | ReadMode::SpinYield => Box::new(SpinRead {
            inner: r,
            yield_cpu: mode == ReadMode::SpinYield,
        }),
    }
}

/// Run `fut` on this thread's runtime, busy-polled when `spin`.
fn run_side<T>(spin: bool, fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    if spin {
        block_on_spinning(fut)
    } else {
        block_on(fut)
    }
}

/// Run `client(dialer)` and `server(listener)` on their own threads and runtimes.
fn two_sides<S, CR, SR>(
    stack: &S,
    spin: bool,
    place: Placement,
    client: impl for<'a> FnOnce(&'a mut dyn Dialer) -> BoxFut<'a, CR> + Send,
    server: impl for<'a> FnOnce(&'a mut dyn Listener) -> BoxFut<'a, SR> + Send,
) -> anyhow::Result<(CR, SR)>
where
    S: AsyncStack,
    CR: Send,
    SR: Send,
{
    let (tx, rx) = mpsc::channel::<SocketAddr>();
    run_pair(
        place,
        move || {
            let addr = rx
                .recv_timeout(Duration::from_secs(60))
                .map_err(|_| anyhow::anyhow!("server never listened"))?;
            run_side(spin, async {
                let mut d = stack.dialer(addr).await?;
                let r = client(&mut *d).await;
                d.shutdown().await?;
                r
            })
        },
        move || {
            run_side(spin, async {
                let (mut l, addr) = stack.listen().await?;
                tx.send(addr)?;
                server(&mut *l).await
            })
        },
    )
}

impl<S: AsyncStack> Row for AsyncRow<S> {
    fn name(&self) -> String {
        match self.1 {
            Polling::Sleep => self.0.name(),
            Polling::Spin => format!("{}+spin", self.0.name()),
        }
    }

    fn description(&self) -> String {
        match self.1 {
            Polling::Sleep => self.0.description(),
            Polling::Spin => format!(
                "{}; busy-polled: readers never sleep, the runtime polls epoll (zero timeout) \
                 every tick",
                self.0.description()
            ),
        }
    }

    fn rtt_only(&self) -> bool {
        // The busy-polled peers exist for the latency table.
        self.spins()
    }

    fn bulk(&self, p: BulkParams, place: Placement) -> anyhow::Result<BulkOutcome> {
        let pattern = data::pattern();
        let expected = p.verify.then(|| data::expected_digest(&pattern, p.bytes));
        let mut sink = SinkBuf::new(p.bytes, p.verify);
        // Owned by the futures (their lifetime is tied to the dialer/listener
        // borrow); shared slices of it are handed to the stream.
        let pattern = bytes::Bytes::from(pattern);
        let ((secs, ccpu, got), (scpu, sink)) = two_sides(
            &self.0,
            self.spins(),
            place,
            move |d| Box::pin(bulk_client(d, p, pattern)),
            move |l| {
                Box::pin(async move {
                    let cpu = bulk_server(l, &mut sink, p.bytes).await?;
                    Ok((cpu, sink))
                })
            },
        )?;
        let received = sink.received();
        let sha256_ok = match expected {
            Some(e) => got[0] == 1 && got[1..] == e[..] && received == p.bytes,
            None => received == p.bytes,
        };
        Ok(BulkOutcome {
            bytes: p.bytes,
            secs,
            sha256_ok,
            client_cpu: ccpu,
            server_cpu: scpu,
        })
    }

    fn crosses_processes(&self) -> bool {
        self.0.crosses_processes()
    }

    fn bulk_side(&self, p: BulkParams, side: ProcessSide<'_>) -> anyhow::Result<SideOutcome> {
        match side {
            ProcessSide::Server(ready) => {
                let mut sink = SinkBuf::new(p.bytes, p.verify);
                let cpu = block_on(async {
                    let (mut l, addr) = self.0.listen().await?;
                    ready(addr)?;
                    bulk_server(&mut *l, &mut sink, p.bytes).await
                })?;
                Ok(SideOutcome {
                    secs: 0.0,
                    cpu,
                    ok: sink.received() == p.bytes,
                })
            }
            ProcessSide::Client(addr) => {
                let pattern = data::pattern();
                let expected = p.verify.then(|| data::expected_digest(&pattern, p.bytes));
                let pattern = bytes::Bytes::from(pattern);
                let (secs, cpu, got) = block_on(async {
                    let mut d = self.0.dialer(addr).await?;
                    let r = bulk_client(&mut *d, p, pattern).await;
                    d.shutdown().await?;
                    r
                })?;
                let ok = match expected {
                    Some(e) => got[0] == 1 && got[1..] == e[..],
                    None => true,
                };
                Ok(SideOutcome { secs, cpu, ok })
            }
        }
    }

    fn rtt(&self, iters: usize, place: Placement) -> anyhow::Result<RttOutcome> {
        let mode = ReadMode::of(self.spins(), place);
        let (samples, ()) = two_sides(
            &self.0,
            self.spins(),
            place,
            move |d| Box::pin(rtt_client(d, iters, mode)),
            move |l| Box::pin(rtt_server(l, mode)),
        )?;
        Ok(RttOutcome {
            samples_ns: samples,
            sent: None,
        })
    }

    fn handshakes(&self, count: usize, place: Placement) -> anyhow::Result<HandshakeOutcome> {
        let (secs, ()) = two_sides(
            &self.0,
            self.spins(),
            place,
            move |d| Box::pin(handshakes_client(d, count)),
            move |l| Box::pin(handshakes_server(l, count)),
        )?;
        Ok(HandshakeOutcome {
            count: count as u64,
            secs,
        })
    }

    fn rtt_side(&self, iters: usize, side: ProcessSide<'_>) -> anyhow::Result<Vec<u64>> {
        // Each process is pinned to a core of its own.
        let mode = ReadMode::of(self.spins(), Placement::SeparateCores);
        self.side_process(
            side,
            |l| rtt_server(l, mode),
            |d| rtt_client(d, iters, mode),
        )
        .map(Option::unwrap_or_default)
    }

    fn handshakes_side(&self, count: usize, side: ProcessSide<'_>) -> anyhow::Result<f64> {
        self.side_process(
            side,
            |l| handshakes_server(l, count),
            |d| handshakes_client(d, count),
        )
        .map(|secs| secs.unwrap_or(0.0))
    }
}

impl<S: AsyncStack> AsyncRow<S> {
    /// One side of a workload in this process, on its own runtime: the
    /// server's (`None`) or the client's result.
    fn side_process<T>(
        &self,
        side: ProcessSide<'_>,
        server: impl for<'a> FnOnce(&'a mut dyn Listener) -> BoxFut<'a, ()>,
        client: impl for<'a> FnOnce(&'a mut dyn Dialer) -> BoxFut<'a, T>,
    ) -> anyhow::Result<Option<T>> {
        match side {
            ProcessSide::Server(ready) => run_side(self.spins(), async {
                let (mut l, addr) = self.0.listen().await?;
                ready(addr)?;
                server(&mut *l).await?;
                Ok(None)
            }),
            ProcessSide::Client(addr) => run_side(self.spins(), async {
                let mut d = self.0.dialer(addr).await?;
                let r = client(&mut *d).await;
                d.shutdown().await?;
                r.map(Some)
            }),
        }
    }
}

/// The client of the RTT workload: `RTT_WARMUP + iters` 64-byte requests, each
/// answered before the next; the sampled round trips in nanoseconds.
fn rtt_client(d: &mut dyn Dialer, iters: usize, mode: ReadMode) -> BoxFut<'_, Vec<u64>> {
    Box::pin(async move {
        let mut sess = d.connect().await?;
        let (r, mut w) = sess.open().await?;
        let mut r = reader(r, mode);
        let req = [0x5Au8; RTT_MSG];
        let mut resp = [0u8; RTT_MSG];
        let mut samples = Vec::with_capacity(iters);
        for i in 0..RTT_WARMUP + iters {
            let t0 = Instant::now();
            w.write_all(&req).await?;
            w.flush().await?;
            r.read_exact(&mut resp).await?;
            if i >= RTT_WARMUP {
                samples.push(t0.elapsed().as_nanos() as u64);
            }
        }
        anyhow::ensure!(resp == [0xA5; RTT_MSG], "response bytes");
        w.shutdown().await?;
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await?;
        sess.close().await?;
        Ok(samples)
    })
}

/// The server of the RTT workload: answer each request until the client
/// ends the stream.
fn rtt_server(l: &mut dyn Listener, mode: ReadMode) -> BoxFut<'_, ()> {
    Box::pin(async move {
        let mut sess = l.accept().await?;
        let (r, mut w) = sess.accept().await?;
        let mut r = reader(r, mode);
        let mut req = [0u8; RTT_MSG];
        let resp = [0xA5u8; RTT_MSG];
        loop {
            match r.read_exact(&mut req).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e.into()),
            }
            w.write_all(&resp).await?;
            w.flush().await?;
        }
        w.shutdown().await?;
        drop((r, w));
        sess.close().await?;
        Ok(())
    })
}

/// The client of the handshake workload: `count` connections one after
/// another, each closed before the next; the seconds they took.
fn handshakes_client(d: &mut dyn Dialer, count: usize) -> BoxFut<'_, f64> {
    Box::pin(async move {
        let t0 = Instant::now();
        for _ in 0..count {
            let sess = d.connect().await?;
            sess.close().await?;
        }
        Ok(t0.elapsed().as_secs_f64())
    })
}

/// The server of the handshake workload: accept `count` connections.
fn handshakes_server(l: &mut dyn Listener, count: usize) -> BoxFut<'_, ()> {
    Box::pin(async move {
        for _ in 0..count {
            // The session is dropped at once: the client closes it.
            let _ = l.accept().await?;
        }
        Ok(())
    })
}

/// The client of a bulk transfer: send `p.bytes` of the pattern, wait for the
/// one-byte acknowledgement (clock and CPU stop), then read the server's
/// 33-byte reply (1 = digest follows, then the sha256).
async fn bulk_client(
    d: &mut dyn Dialer,
    p: BulkParams,
    pattern: bytes::Bytes,
) -> anyhow::Result<(f64, CpuUsed, [u8; 33])> {
    let mut sess = d.connect().await?;
    let (mut r, mut w) = sess.open().await?;
    let t0 = Instant::now();
    let cpu = CpuSpan::start();
    let mut off = 0u64;
    while off < p.bytes {
        let s = data::bytes_at(&pattern, off, WRITE_CHUNK, p.bytes);
        off += s.len() as u64;
        w.write_bytes(s).await?;
    }
    // What a stack still buffers (rustls's last records when the socket was
    // full) goes out now: nothing else would send it before the server acks.
    w.flush().await?;
    // An empty stream reaches a quinn server only with its end, so a zero-byte
    // transfer (callgrind.sh's baseline run) ends it at once.
    if p.bytes == 0 {
        w.shutdown().await?;
    }
    let mut ack = [0u8; 1];
    r.read_exact(&mut ack).await?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu.stop();
    // The end of the stream, sent only now, is what lets the server start
    // hashing (see `bulk_server`).
    if p.bytes > 0 {
        w.shutdown().await?;
    }
    let mut got = [0u8; 33];
    r.read_exact(&mut got).await?;
    sess.close().await?;
    Ok((secs, cpu, got))
}

/// The server of a bulk transfer: receive `total` bytes into `sink`,
/// acknowledge the last one (CPU stops), then, once the client has ended its
/// half of the stream, reply with the digest. Returns the CPU used.
///
/// The digest waits for the client's end of stream, which the client sends
/// only after the acknowledgement reached it: hashing a whole transfer holds
/// this side's thread for a while, and a stack whose driver is a task on this
/// runtime (quinn) sends the acknowledgement only when that task runs — an
/// acknowledgement written just before the hash would leave after it, and the
/// client's clock would time the hash as well.
async fn bulk_server(
    l: &mut dyn Listener,
    sink: &mut SinkBuf,
    total: u64,
) -> anyhow::Result<CpuUsed> {
    let mut sess = l.accept().await?;
    let cpu = CpuSpan::start();
    let (mut r, mut w) = sess.accept().await?;
    while sink.received() < total {
        let n = r.read(sink.spare()).await?;
        anyhow::ensure!(
            n > 0,
            "peer ended the stream after {} of {total} bytes",
            sink.received()
        );
        sink.advance(n);
        anyhow::ensure!(!sink.overrun(), "peer sent more than announced");
    }
    anyhow::ensure!(sink.received() == total, "peer sent more than announced");
    w.write_all(&[1]).await?;
    w.flush().await?;
    let cpu = cpu.stop();
    let n = r.read(&mut [0u8; 1]).await?;
    anyhow::ensure!(n == 0, "peer sent more than announced");
    let mut reply = [0u8; 33];
    if let Some(d) = sink.digest() {
        reply[0] = 1;
        reply[1..].copy_from_slice(&d);
    }
    w.write_all(&reply).await?;
    w.shutdown().await?;
    drop((r, w));
    sess.close().await?;
    Ok(cpu)
}
