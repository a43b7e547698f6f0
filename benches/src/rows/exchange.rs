//! The workloads' exchanges, written once for every poll-driven row.
//!
//! The engine rows ([`super::engine`]) and the quinn-proto ceiling
//! ([`super::ideal`]) drive QUIC by polling on their own thread; each
//! implements [`Driver`], and the bulk, RTT and handshake exchanges below run
//! over either, so the ceiling measures exactly the exchange the engine rows do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{BulkParams, SentPackets, RTT_MSG, RTT_WARMUP, WRITE_CHUNK};
use crate::cpu::{CpuSpan, CpuUsed};
use crate::data::{self, SinkBuf};

/// One poll-driven QUIC side.
pub(super) trait Driver {
    /// A connection.
    type Conn: Copy + PartialEq;
    /// A stream of a connection.
    type Stream: Copy;
    /// Where a client connects to.
    type Target;

    /// One poll: receive, timers, transmit; idles as the row does when nothing happened.
    fn poll(&mut self) -> anyhow::Result<()>;
    /// Fail if `c` was lost in the last poll.
    fn check_lost(&self, c: Self::Conn) -> anyhow::Result<()>;
    /// Client: connect to `to` and poll until the handshake completes.
    fn connect(&mut self, to: &Self::Target) -> anyhow::Result<Self::Conn>;
    /// Server: poll until a connection completes its handshake.
    fn accept(&mut self) -> anyhow::Result<Self::Conn>;
    /// Open a bidirectional stream.
    fn open_bi(&mut self, c: Self::Conn) -> anyhow::Result<Self::Stream>;
    /// Server: poll until the peer opens a stream on `c`.
    fn accept_stream(&mut self, c: Self::Conn) -> anyhow::Result<Self::Stream>;
    /// Hand (part of) `chunk` to the stream without copying; `None` when the
    /// stream takes nothing now.
    fn write_chunk(
        &mut self,
        c: Self::Conn,
        s: Self::Stream,
        chunk: &mut Bytes,
    ) -> anyhow::Result<Option<usize>>;
    /// Write all of `data` (small messages: the windows have room) and send it now.
    fn write_all(&mut self, c: Self::Conn, s: Self::Stream, data: &[u8]) -> anyhow::Result<()>;
    /// End the stream.
    fn finish(&mut self, c: Self::Conn, s: Self::Stream) -> anyhow::Result<()>;
    /// Copy what the stream has into `buf[*got..]`; `Ok(true)` at its end.
    fn read_some(
        &mut self,
        c: Self::Conn,
        s: Self::Stream,
        buf: &mut [u8],
        got: &mut usize,
    ) -> anyhow::Result<bool>;
    /// Start closing `c` (not waiting for it).
    fn close_now(&mut self, c: Self::Conn) -> anyhow::Result<()>;
    /// Poll until no connection is left or `limit` passed.
    fn drain(&mut self, limit: Duration) -> anyhow::Result<()>;
    /// What `c` has sent so far (`None` once it is gone).
    fn sent_packets(&self, c: Self::Conn) -> Option<SentPackets>;

    /// Close `c` and poll until it drained (bounded).
    fn close(&mut self, c: Self::Conn) -> anyhow::Result<()> {
        self.close_now(c)?;
        self.drain(Duration::from_secs(2))
    }

    /// Server: poll until the client says it is done, then let closes drain.
    fn linger(&mut self, done: &AtomicBool) -> anyhow::Result<()> {
        while !done.load(Ordering::Acquire) {
            self.poll()?;
        }
        self.drain(Duration::from_millis(200))
    }
}

/// The client's reply buffer holds the server's 34 bytes: the one-byte
/// acknowledgement, 1 (a digest follows), the sha256 — equal to `expected`
/// when verifying.
pub(super) fn reply_ok((got, reply): (usize, [u8; 64]), expected: Option<[u8; 32]>) -> bool {
    got == 34
        && match expected {
            Some(e) => reply[1] == 1 && reply[2..34] == e[..],
            None => true,
        }
}

/// The client of a bulk transfer: connect to `to`, send `p.bytes` of
/// `pattern` in [`WRITE_CHUNK`] pieces, stop clock and CPU at the one-byte
/// acknowledgement, read the reply, close.
pub(super) fn bulk_client<D: Driver>(
    d: &mut D,
    to: &D::Target,
    p: BulkParams,
    pattern: &Bytes,
) -> anyhow::Result<(f64, CpuUsed, (usize, [u8; 64]))> {
    let c = d.connect(to)?;
    let s = d.open_bi(c)?;
    let t0 = Instant::now();
    let cpu = CpuSpan::start();
    let (mut off, mut finished) = (0u64, false);
    // Room past the 34 reply bytes: a read into a full buffer cannot see the end.
    let mut reply = [0u8; 64];
    let mut got = 0;
    let mut acked: Option<(f64, CpuUsed)> = None;
    loop {
        while off < p.bytes {
            let mut chunk = data::bytes_at(pattern, off, WRITE_CHUNK, p.bytes);
            match d.write_chunk(c, s, &mut chunk)? {
                Some(n) => off += n as u64,
                None => break,
            }
        }
        if off == p.bytes && !finished {
            d.finish(c, s)?;
            finished = true;
        }
        let fin = d.read_some(c, s, &mut reply, &mut got)?;
        if got >= 1 && acked.is_none() {
            acked = Some((t0.elapsed().as_secs_f64(), cpu.stop()));
        }
        if fin {
            break;
        }
        d.poll()?;
        d.check_lost(c)?;
    }
    d.close(c)?;
    let (secs, ccpu) = acked.ok_or_else(|| anyhow::anyhow!("no acknowledgement"))?;
    Ok((secs, ccpu, (got, reply)))
}

/// The server of a bulk transfer: accept, receive into `sink`, acknowledge the
/// last byte (CPU stops), reply with the digest and finish the stream.
pub(super) fn bulk_server<D: Driver>(d: &mut D, sink: &mut SinkBuf) -> anyhow::Result<CpuUsed> {
    let c = d.accept()?;
    let cpu = CpuSpan::start();
    let s = d.accept_stream(c)?;
    loop {
        anyhow::ensure!(!sink.overrun(), "peer sent more than announced");
        let mut n = 0;
        let fin = d.read_some(c, s, sink.spare(), &mut n)?;
        sink.advance(n);
        if fin {
            break;
        }
        if n == 0 {
            d.poll()?;
            d.check_lost(c)?;
        }
    }
    d.write_all(c, s, &[1])?;
    let cpu = cpu.stop();
    let mut reply = [0u8; 33];
    if let Some(digest) = sink.digest() {
        reply[0] = 1;
        reply[1..].copy_from_slice(&digest);
    }
    d.write_all(c, s, &reply)?;
    d.finish(c, s)?;
    Ok(cpu)
}

/// The client of the RTT workload: connect to `to`, `RTT_WARMUP + iters`
/// 64-byte requests, each answered before the next, close; the sampled round
/// trips in nanoseconds and what the connection sent before the close.
pub(super) fn rtt_client<D: Driver>(
    d: &mut D,
    to: &D::Target,
    iters: usize,
) -> anyhow::Result<(Vec<u64>, Option<SentPackets>)> {
    let c = d.connect(to)?;
    let s = d.open_bi(c)?;
    let req = [0x5Au8; RTT_MSG];
    let mut resp = [0u8; RTT_MSG];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..RTT_WARMUP + iters {
        let t0 = Instant::now();
        d.write_all(c, s, &req)?;
        let mut got = 0;
        while got < RTT_MSG {
            d.poll()?;
            d.check_lost(c)?;
            anyhow::ensure!(
                !d.read_some(c, s, &mut resp, &mut got)?,
                "stream ended early"
            );
        }
        if i >= RTT_WARMUP {
            samples.push(t0.elapsed().as_nanos() as u64);
        }
    }
    anyhow::ensure!(resp == [0xA5; RTT_MSG], "response bytes");
    let sent = d.sent_packets(c);
    d.close(c)?;
    Ok((samples, sent))
}

/// The server of the RTT workload: accept, then answer each request until the
/// client closes the connection or `done` is set; what the connection sent
/// (read when the loop ends: the client's close has arrived by then, ours
/// not sent yet).
pub(super) fn rtt_server<D: Driver>(
    d: &mut D,
    done: &AtomicBool,
) -> anyhow::Result<Option<SentPackets>> {
    let c = d.accept()?;
    let s = d.accept_stream(c)?;
    let mut req = [0u8; RTT_MSG];
    let resp = [0xA5u8; RTT_MSG];
    let mut got = 0;
    while !done.load(Ordering::Acquire) {
        let fin = match d.read_some(c, s, &mut req, &mut got) {
            Ok(fin) => fin,
            Err(_) => break, // the client closed
        };
        if got == RTT_MSG {
            got = 0;
            d.write_all(c, s, &resp)?;
        }
        if fin {
            break;
        }
        d.poll()?;
    }
    Ok(d.sent_packets(c))
}

/// The client of the handshake workload: `count` connections to `to` one
/// after another, each closed before the next; the seconds they took.
pub(super) fn handshakes_client<D: Driver>(
    d: &mut D,
    to: &D::Target,
    count: usize,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..count {
        let c = d.connect(to)?;
        d.close_now(c)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    d.drain(Duration::from_secs(2))?;
    Ok(secs)
}
