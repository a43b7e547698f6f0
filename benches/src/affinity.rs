//! Where the two sides of a workload run: the same core or separate cores.

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
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` is a valid, exclusively borrowed
    // `cpu_set_t` of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the bit size of `set`.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Pin the calling thread to `cpu`. Returns `false` if the kernel refused.
pub fn pin_current_thread(cpu: usize) -> bool {
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET only writes the bit of `cpu` inside `set`, checked below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid `cpu_set_t` of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}
