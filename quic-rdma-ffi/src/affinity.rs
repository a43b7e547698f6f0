//! Pinning the calling thread to a CPU: a busy-polled engine belongs on a
//! core of its own (and, with a NIC, on the NIC's NUMA node).

use crate::error::{fail, guard, QR_EINVAL, QR_OK};

/// Pin the calling thread to CPU `cpu` (sched_setaffinity). `QR_EINVAL` when
/// the CPU does not exist or is not allowed to this process (a cgroup or
/// taskset limit); `qr_last_error` says which.
///
/// Returns: `QR_OK`, `QR_EINVAL` (no such CPU, or not allowed), `QR_EPANIC`.
#[no_mangle]
pub extern "C" fn qr_pin_thread(cpu: u32) -> i32 {
    guard(|| {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return Err(fail(QR_EINVAL, format!("cpu {cpu} is above CPU_SETSIZE")));
        }
        // SAFETY: cpu_set_t is plain bits; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` < CPU_SETSIZE, checked above; `set` is a valid cpu_set_t.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
        // SAFETY: pid 0 is the calling thread; `set` is valid for its size.
        let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(fail(
                QR_EINVAL,
                format!(
                    "cannot pin to cpu {cpu}: {err} (is it online and in this process's CPU set?)"
                ),
            ));
        }
        Ok(QR_OK)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_to_an_allowed_cpu_and_refuses_a_missing_one() {
        std::thread::spawn(|| {
            assert_eq!(qr_pin_thread(0), QR_OK);
            // SAFETY: sched_getcpu has no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() }, 0);
            assert_eq!(qr_pin_thread(100_000), QR_EINVAL);
            assert_eq!(qr_pin_thread(1023), QR_EINVAL);
        })
        .join()
        .unwrap();
    }
}
