//! The ping-pong: the client writes a message on a second bidirectional stream
//! and waits for its echo, round trip by round trip, timing each; the server
//! echoes until the client finishes the stream.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

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
