//! Per-thread CPU time: `getrusage(RUSAGE_THREAD)`, user + system.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use nix::unistd::{sysconf, SysconfVar};

/// The machine's 1/5/15-minute load averages (`/proc/loadavg`; NaN where
/// unreadable): recorded with every run beside its CPU times.
pub fn load_avg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(f64::NAN));
    [
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
    ]
}

/// Busy CPU time of the whole machine so far, all CPUs: every `/proc/stat`
/// `cpu` column but idle and iowait (proc(5)), steal included — time the
/// hypervisor gave to other guests is time this run did not get either.
pub fn machine_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse::<u64>().ok())
                .enumerate()
                // user nice system idle iowait irq softirq steal (guest time
                // is already inside user/nice).
                .filter(|&(i, _)| i < 8 && i != 3 && i != 4)
                .map(|(_, v)| v)
                .sum()
        })
        .unwrap_or(0);
    let hz = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// `getrusage(who)` as (user, system) time.
fn usage(who: UsageWho) -> nix::Result<(Duration, Duration)> {
    let ru = getrusage(who)?;
    let tv = |t: TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    Ok((tv(ru.user_time()), tv(ru.system_time())))
}

/// CPU that this process's waited-for children have used so far
/// (`getrusage(RUSAGE_CHILDREN)`): around one child that is started and
/// waited for with no other child reaped meanwhile, the delta is that child's.
pub fn children_cpu() -> CpuUsed {
    usage(UsageWho::RUSAGE_CHILDREN).map_or(CpuUsed::default(), |(u, s)| CpuUsed {
        user_s: u.as_secs_f64(),
        sys_s: s.as_secs_f64(),
    })
}

/// CPU this process and its waited-for children (the two-process sides) used.
fn own_cpu() -> Duration {
    let sum = |who| usage(who).map_or(Duration::ZERO, |(u, s)| u + s);
    sum(UsageWho::RUSAGE_SELF) + sum(UsageWho::RUSAGE_CHILDREN)
}

/// What the rest of the machine used while a run went on: the machine's busy
/// time minus this process's own, as a share of all its CPUs' time. The load
/// average cannot say this: the harness's own spinning sides raise it.
#[derive(Debug)]
pub struct OthersSpan {
    busy: Duration,
    own: Duration,
    at: std::time::Instant,
}

impl OthersSpan {
    /// Start counting now.
    pub fn start() -> Self {
        OthersSpan {
            busy: machine_busy(),
            own: own_cpu(),
            at: std::time::Instant::now(),
        }
    }

    /// The share (0..=1) of the machine's CPU time other processes (and the
    /// hypervisor's steal) took since [`start`](Self::start), over `cpus` CPUs.
    pub fn share(&self, cpus: usize) -> f64 {
        let busy = machine_busy().saturating_sub(self.busy);
        let own = own_cpu().saturating_sub(self.own);
        let wall = self.at.elapsed().as_secs_f64() * cpus.max(1) as f64;
        (busy.saturating_sub(own).as_secs_f64() / wall.max(1e-9)).clamp(0.0, 1.0)
    }
}

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
        UsageWho::RUSAGE_SELF
    } else {
        UsageWho::RUSAGE_THREAD
    };
    usage(who).unwrap_or_else(|e| panic!("getrusage({who:?}) failed: {e}"))
}

/// User and system CPU another process (a child this process started) has
/// used so far: `utime` and `stime` of `/proc/PID/stat` (proc(5)), in clock ticks.
pub fn process_cpu(pid: u32) -> anyhow::Result<CpuUsed> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count
    // fields after its closing one. utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: no command field"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> anyhow::Result<f64> {
        let v: f64 = f
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: short"))?
            .parse()?;
        Ok(v / clock_ticks_per_s())
    };
    // Field 3 (state) is rest[0], so field N is rest[N - 3].
    Ok(CpuUsed {
        user_s: tick(14 - 3)?,
        sys_s: tick(15 - 3)?,
    })
}

fn clock_ticks_per_s() -> f64 {
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
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

    #[test]
    fn process_cpu_from_proc_counts_this_threads_work() {
        let before = process_cpu(std::process::id()).unwrap();
        let span = CpuSpan::start();
        let mut x = 0u64;
        for i in 0..100_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let mine = span.stop().total_s();
        let after = process_cpu(std::process::id()).unwrap();
        // The process used at least what this thread did (ticks are 10 ms).
        assert!(mine > 0.0);
        assert!(
            after.total_s() - before.total_s() >= mine - 0.03,
            "{before:?} {after:?} {mine}"
        );
    }
}
