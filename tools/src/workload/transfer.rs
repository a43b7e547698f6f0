//! The bulk transfer: the client writes seeded pseudo-random bytes on one
//! bidirectional stream and finishes it; the server reads to the end, hashing,
//! and answers with the byte count (8 bytes, big endian) and the sha256 of what
//! arrived, which the client compares with the sha256 of what it wrote.

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
