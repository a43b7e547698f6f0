//! Where the two sides of a workload run: the same core or separate cores.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// Placement of the client and server threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Both pinned to the first allowed CPU: every exchange is a context switch.
    SameCore,
    /// Client on the first allowed CPU, server on the second.
    SeparateCores,
}

impl Placement {
    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Placement::SameCore => "same core",
            Placement::SeparateCores => "separate cores",
        }
    }

    /// The CPUs for (client, server).
    pub fn cpus(self) -> (usize, usize) {
        let cpus = allowed_cpus();
        let a = cpus.first().copied().unwrap_or(0);
        let b = cpus.get(1).copied().unwrap_or(a);
        match self {
            Placement::SameCore => (a, a),
            Placement::SeparateCores => (a, b),
        }
    }
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return vec![0];
    };
    (0..CpuSet::count())
        .filter(|&i| set.is_set(i).unwrap_or(false))
        .collect()
}

/// Pin the calling thread to `cpu`. Returns `false` if the kernel refused.
pub fn pin_current_thread(cpu: usize) -> bool {
    let mut set = CpuSet::new();
    set.set(cpu % CpuSet::count()).is_ok() && sched_setaffinity(Pid::from_raw(0), &set).is_ok()
}
