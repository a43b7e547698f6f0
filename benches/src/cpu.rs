//! Per-thread CPU time: `getrusage(RUSAGE_THREAD)`, user + system.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// See [`measure_whole_process`].
static WHOLE_PROCESS: AtomicBool = AtomicBool::new(false);

/// Make every [`CpuSpan`] of this process measure the whole process
/// (`RUSAGE_SELF`) instead of the calling thread: for the side processes of the
/// two-process placement, where one process is one side, threads and all.
pub fn measure_whole_process() {
    WHOLE_PROCESS.store(true, Ordering::Relaxed);
}

/// CPU time (user, system) the calling thread (or, after
/// [`measure_whole_process`], the process) has used so far.
pub fn thread_cpu() -> (Duration, Duration) {
    let who = if WHOLE_PROCESS.load(Ordering::Relaxed) {
        libc::RUSAGE_SELF
    } else {
        libc::RUSAGE_THREAD
    };
    // SAFETY: `rusage` is plain old data for which all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD and RUSAGE_SELF are valid on Linux and `ru` is a valid,
    // exclusively borrowed `rusage` that getrusage fills in; it retains no pointer.
    let rc = unsafe { libc::getrusage(who, &mut ru) };
    assert_eq!(rc, 0, "getrusage({who}) failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// A span of the calling thread's CPU time.
#[derive(Clone, Copy, Debug)]
pub struct CpuSpan {
    user: Duration,
    sys: Duration,
}

/// CPU seconds a thread spent in a span.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuUsed {
    /// User-mode seconds.
    pub user_s: f64,
    /// Kernel-mode seconds.
    pub sys_s: f64,
}

impl CpuUsed {
    /// User + system seconds.
    pub fn total_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

impl CpuSpan {
    /// Start measuring on the calling thread.
    pub fn start() -> Self {
        let (user, sys) = thread_cpu();
        CpuSpan { user, sys }
    }

    /// CPU used by the calling thread since [`CpuSpan::start`] (call on the same thread).
    pub fn stop(&self) -> CpuUsed {
        let (u, s) = thread_cpu();
        CpuUsed {
            user_s: u.saturating_sub(self.user).as_secs_f64(),
            sys_s: s.saturating_sub(self.sys).as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_thread_uses_cpu() {
        let span = CpuSpan::start();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(span.stop().total_s() > 0.0);
    }
}
