//! What the demo does on its connection: a bulk transfer verified by sha256, and a
//! small-message ping-pong timed round trip by round trip.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use sha2::{Digest, Sha256};

/// Chunk size of the bulk writer.
const CHUNK: usize = 256 * 1024;

/// What the bulk transfer found.
#[derive(Clone, Debug)]
pub(crate) struct TransferOutcome {
    /// Bytes the client wrote.
    pub(crate) bytes_sent: u64,
    /// Bytes the server read.
    pub(crate) bytes_received: u64,
    /// sha256 of what the client wrote.
    pub(crate) sha256_sent: [u8; 32],
    /// sha256 of what the server read.
    pub(crate) sha256_received: [u8; 32],
    /// From the first byte written to the server's verdict arriving back.
    pub(crate) elapsed: Duration,
}

/// Deterministic pseudo-random data (xorshift64): chunk `i` of a stream seeded by `seed`.
fn fill_chunk(buf: &mut [u8], seed: u64, i: u64) {
    let mut x = (seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for b in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
}

/// What the server side of the transfer read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    /// Bytes read to the end of the stream.
    pub(crate) bytes: u64,
    /// Their sha256.
    pub(crate) sha256: [u8; 32],
}

/// Server side of the transfer: read the stream to its end, hashing, then answer
/// with the byte count (8 bytes, big endian) and the sha256 of what arrived.
pub(crate) async fn serve_transfer(conn: quinn::Connection) -> Result<Received> {
    let (mut tx, mut rx) = conn.accept_bi().await.context("server: accept stream")?;
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = rx
        .read_chunk(usize::MAX, true)
        .await
        .context("server: read")?
    {
        n += chunk.bytes.len() as u64;
        h.update(&chunk.bytes);
    }
    let digest: [u8; 32] = h.finalize().into();
    tx.write_all(&n.to_be_bytes()).await?;
    tx.write_all(&digest).await?;
    tx.finish()?;
    let _ = tx.stopped().await;
    Ok(Received {
        bytes: n,
        sha256: digest,
    })
}

/// Client side of the transfer: write `len` seeded bytes, finish, read the verdict.
pub(crate) async fn run_transfer(
    conn: &quinn::Connection,
    len: u64,
    seed: u64,
) -> Result<TransferOutcome> {
    let (mut tx, mut rx) = conn.open_bi().await.context("client: open stream")?;
    let start = Instant::now();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let (mut left, mut i) = (len, 0u64);
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        fill_chunk(&mut buf[..n], seed, i);
        h.update(&buf[..n]);
        tx.write_all(&buf[..n]).await.context("client: write")?;
        left -= n as u64;
        i += 1;
    }
    tx.finish()?;
    let sha256_sent: [u8; 32] = h.finalize().into();
    let reply = rx.read_to_end(40).await.context("client: read verdict")?;
    let elapsed = start.elapsed();
    ensure!(
        reply.len() == 40,
        "server verdict is {} bytes, not 40",
        reply.len()
    );
    let mut count = [0u8; 8];
    count.copy_from_slice(&reply[..8]);
    let mut sha256_received = [0u8; 32];
    sha256_received.copy_from_slice(&reply[8..]);
    Ok(TransferOutcome {
        bytes_sent: len,
        bytes_received: u64::from_be_bytes(count),
        sha256_sent,
        sha256_received,
        elapsed,
    })
}

/// Server side of the ping-pong: echo whatever arrives on the next stream the
/// client opens until it ends (so the server need not know the ping size).
/// Returns the bytes echoed; 0 if the client closed the connection without
/// opening a ping stream (`--pings 0`).
pub(crate) async fn serve_pings(conn: quinn::Connection) -> Result<u64> {
    let (mut tx, mut rx) = match conn.accept_bi().await {
        Ok(s) => s,
        Err(quinn::ConnectionError::ApplicationClosed(_)) => return Ok(0),
        Err(e) => return Err(e).context("server: accept ping stream"),
    };
    let mut echoed = 0u64;
    while let Some(chunk) = rx
        .read_chunk(usize::MAX, true)
        .await
        .context("server: ping read")?
    {
        echoed += chunk.bytes.len() as u64;
        tx.write_all(&chunk.bytes).await.context("server: pong")?;
    }
    tx.finish()?;
    let _ = tx.stopped().await;
    Ok(echoed)
}

/// Client side of the ping-pong: `count` round trips of `size` bytes on one
/// bidirectional stream; each echo is checked. Returns every round-trip time.
pub(crate) async fn run_pings(
    conn: &quinn::Connection,
    count: u32,
    size: usize,
) -> Result<Vec<Duration>> {
    let (mut tx, mut rx) = conn.open_bi().await.context("client: open ping stream")?;
    let mut out = vec![0u8; size];
    let mut back = vec![0u8; size];
    let mut rtts = Vec::with_capacity(count as usize);
    for i in 0..count {
        out.iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i as usize).wrapping_add(j) as u8);
        let t = Instant::now();
        tx.write_all(&out).await.context("client: ping")?;
        rx.read_exact(&mut back).await.context("client: pong")?;
        rtts.push(t.elapsed());
        ensure!(back == out, "pong {i} differs from its ping");
    }
    tx.finish()?;
    // The server finishes its side once it sees ours end.
    let rest = rx
        .read_to_end(size)
        .await
        .context("client: ping stream end")?;
    ensure!(rest.is_empty(), "unexpected bytes after the last pong");
    Ok(rtts)
}
