//! The accept loop shared by every TCP listener.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use super::{Limits, ListenerStats, Slot, Slots};

/// How a connection's handler ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Closed by either side, or by an error other than a timeout.
    Closed,
    /// Dropped by the request or stall timeout.
    TimedOut,
}

/// Accept on `tcp` until the task is dropped, running `handle` for each
/// connection admitted under `limits` (see the module docs). A connection
/// chosen for eviction is dropped mid-await: its handler need not watch for
/// it. `handle` marks its requests with [`Slot::busy`].
pub async fn serve<F, Fut>(tcp: TcpListener, limits: Limits, stats: Arc<ListenerStats>, handle: F)
where
    F: Fn(TcpStream, Arc<Slot>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ended> + Send + 'static,
{
    let slots = Slots::new(limits.max_connections);
    let handle = Arc::new(handle);
    let mut log = ErrorLog::default();
    let mut backoff = Duration::ZERO;
    loop {
        let sock = match tcp.accept().await {
            Ok((sock, _)) => {
                backoff = Duration::ZERO;
                sock
            }
            Err(e) => {
                stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                log.error(&e);
                // Out of descriptors: closing an idle connection gives one
                // back; the evicted task needs a moment to run.
                let out_of_fds = matches!(e.raw_os_error(), Some(23 | 24));
                if out_of_fds && slots.evict_oldest_idle() {
                    stats.evicted.fetch_add(1, Ordering::Relaxed);
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(1), Duration::from_millis(500));
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let slot = match slots.admit() {
            Ok((slot, how)) => {
                if how == super::Admitted::Evicted {
                    stats.evicted.fetch_add(1, Ordering::Relaxed);
                }
                Arc::new(slot)
            }
            Err(_) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.store(slots.open() as u64, Ordering::Relaxed);
        let (handle, stats, slots) = (handle.clone(), stats.clone(), slots.clone());
        tokio::spawn(async move {
            let conn = handle(sock, slot.clone());
            tokio::select! {
                ended = conn => {
                    if ended == Ended::TimedOut {
                        stats.timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
                () = slot.evicted() => {}
            }
            drop(slot);
            stats.open.store(slots.open() as u64, Ordering::Relaxed);
        });
    }
}

/// Accept errors logged without flooding: the first at WARN, then one
/// summary at most every 10 s.
#[derive(Debug, Default)]
struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl ErrorLog {
    fn error(&mut self, e: &std::io::Error) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(10))
        {
            self.suppressed += 1;
            return;
        }
        let hint = match e.raw_os_error() {
            Some(23 | 24) => {
                " (out of file descriptors: raise `ulimit -n` or lower --tcp-max-connections)"
            }
            _ => "",
        };
        tracing::warn!(
            "accept: {e}{hint}; {} more since the last report",
            self.suppressed
        );
        self.last = Some(now);
        self.suppressed = 0;
    }
}
