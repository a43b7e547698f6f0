//! A connection whose peer stops taking bytes is dropped: a write that makes
//! no progress for the stall timeout fails with `TimedOut`. Reads are not
//! timed here (the protocol times a request head; between requests the
//! connection is idle and may be evicted), so a long computation before a
//! response, which neither reads nor writes, is never cut short.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `io` with a stall timeout on writes.
#[derive(Debug)]
pub struct StallTimeout<T> {
    io: T,
    timeout: Duration,
    /// Armed by the first write that could not proceed; cleared by progress.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> StallTimeout<T> {
    /// Wrap `io`: a write blocked for `timeout` fails.
    pub fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            deadline: None,
        }
    }

    /// After a write-side poll: clear the deadline on progress, arm it (and
    /// check it) while blocked.
    fn judge<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if r.is_ready() {
            self.deadline = None;
            return r;
        }
        let timeout = self.timeout;
        let d = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(d.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer took no bytes for {timeout:?}"),
        )))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.judge(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.judge(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.judge(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.judge(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_nothing_fails_the_write_after_the_timeout() {
        // A 64-byte pipe nobody reads: the second write blocks.
        let (a, _b) = tokio::io::duplex(64);
        let mut w = StallTimeout::new(a, Duration::from_secs(5));
        w.write_all(&[0; 64]).await.unwrap();
        let t0 = tokio::time::Instant::now();
        let e = w.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_taking_bytes_is_not_cut_off() {
        let (a, mut b) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 16];
            let mut got = 0;
            while got < 1024 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                got += b.read(&mut buf).await.unwrap();
            }
            got
        });
        let mut w = StallTimeout::new(a, Duration::from_secs(5));
        // 1 KiB at 16 bytes per second: 64 s in all, never 5 s without progress.
        w.write_all(&[7; 1024]).await.unwrap();
        assert_eq!(reader.await.unwrap(), 1024);
    }
}
