//! Running the two sides of a workload: each in its own pinned OS thread.

use std::future::Future;
use std::time::Duration;

use crate::affinity::{pin_current_thread, Placement};

/// How long one side may take before the harness gives up on it: a guard
/// against hangs, not a timing check.
pub const HANG_GUARD: Duration = Duration::from_secs(300);

/// Run `client` and `server` at once, each in a thread pinned as `place` says,
/// and return both results (the first error wins).
pub fn run_pair<C, S, CR, SR>(place: Placement, client: C, server: S) -> anyhow::Result<(CR, SR)>
where
    C: FnOnce() -> anyhow::Result<CR> + Send,
    S: FnOnce() -> anyhow::Result<SR> + Send,
    CR: Send,
    SR: Send,
{
    let (c_cpu, s_cpu) = place.cpus();
    std::thread::scope(|scope| {
        let s = std::thread::Builder::new()
            .name("server".into())
            .spawn_scoped(scope, move || {
                pin_current_thread(s_cpu);
                server()
            })?;
        let c = std::thread::Builder::new()
            .name("client".into())
            .spawn_scoped(scope, move || {
                pin_current_thread(c_cpu);
                client()
            })?;
        let cr = c
            .join()
            .map_err(|_| anyhow::anyhow!("client side panicked"))?;
        let sr = s
            .join()
            .map_err(|_| anyhow::anyhow!("server side panicked"))?;
        match (cr, sr) {
            (Ok(c), Ok(s)) => Ok((c, s)),
            (Err(c), Ok(_)) => Err(c.context("client side")),
            (Ok(_), Err(s)) => Err(s.context("server side")),
            (Err(c), Err(s)) => Err(c.context(format!("client side (server side: {s:#})"))),
        }
    })
}

/// Sets the flag when dropped: a client side tells its server side it is
/// done even when it fails (the server lingers until then).
pub struct DoneOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Run `fut` to completion on a fresh single-threaded tokio runtime on this
/// thread (so every task of this side, quinn's endpoint driver included, runs
/// here and is charged to this thread's CPU time), bounded by [`HANG_GUARD`].
pub fn block_on<T>(fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    run_on(tokio::runtime::Builder::new_current_thread(), fut)
}

/// [`block_on`] on a runtime that never sleeps while a task is ready and
/// polls its I/O driver (epoll, zero timeout) between every two task polls:
/// with a task that wakes itself when it would wait
/// ([`crate::rows::stack::SpinRead`]), the thread busy-polls, as a
/// low-latency user of tokio would run it.
pub fn block_on_spinning<T>(fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.event_interval(1);
    run_on(b, fut)
}

fn run_on<T>(
    mut builder: tokio::runtime::Builder,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let rt = builder.enable_all().build()?;
    rt.block_on(async {
        tokio::time::timeout(HANG_GUARD, fut)
            .await
            .map_err(|_| anyhow::anyhow!("side did not finish within {HANG_GUARD:?}"))?
    })
}
