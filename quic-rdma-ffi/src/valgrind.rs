//! Memcheck client requests: data the library hands out is marked defined.
//!
//! memcheck cannot follow definedness through ring's assembly, so the keys a
//! handshake derives, and every byte decrypted with them, look uninitialised
//! to it; a C program that branches on a received byte (or a stream id, a
//! length, an RTT) would see errors in its own code. The library marks what
//! crosses the boundary outwards as defined — the bytes are authenticated by
//! AES-GCM before they are handed out — and `valgrind.supp` silences the same
//! reports inside the library, so a caller's own code is checked in full.
//!
//! Outside valgrind a request is four rotates and an `xchg rbx, rbx` that
//! change nothing (valgrind.h's "special instruction preamble"): a few cycles.

/// `VG_USERREQ__MAKE_MEM_DEFINED` (memcheck.h): `VG_USERREQ_TOOL_BASE('M','C') + 2`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const MAKE_MEM_DEFINED: u64 = (((b'M' as u64) << 24) | ((b'C' as u64) << 16)) + 2;

/// Tell memcheck the `len` bytes at `p` are defined (no-op elsewhere).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline]
pub(crate) fn mark_defined(p: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let args: [u64; 6] = [MAKE_MEM_DEFINED, p as u64, len as u64, 0, 0, 0];
    // SAFETY: valgrind.h's client-request sequence for amd64: rdi is rotated
    // by 3+13+61+51 = 128 bits (unchanged, declared clobbered anyway),
    // `xchg rbx, rbx` is a no-op, rdx receives the result (its input when not
    // under valgrind). It reads `args` (live on the stack for the asm) and,
    // under valgrind, changes only memcheck's shadow state, not memory.
    unsafe {
        std::arch::asm!(
            "rol rdi, 3",
            "rol rdi, 13",
            "rol rdi, 61",
            "rol rdi, 51",
            "xchg rbx, rbx",
            in("rax") args.as_ptr(),
            inout("rdx") 0u64 => _,
            inout("rdi") 0u64 => _,
            options(nostack, readonly),
        );
    }
}

/// Elsewhere: nothing to tell.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline]
pub(crate) fn mark_defined(_: *const u8, _: usize) {}

/// `v`, marked defined: a return value computed from decrypted data.
#[inline]
pub(crate) fn defined<T: Copy>(v: T) -> T {
    let slot = std::hint::black_box(v);
    mark_defined((&slot as *const T).cast(), size_of::<T>());
    // A read from memory after the request, not a register copy of `v`.
    // SAFETY: `slot` is a live, initialised local.
    unsafe { std::ptr::read_volatile(&slot) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests_are_no_ops_outside_valgrind() {
        let buf = [1u8, 2, 3];
        super::mark_defined(buf.as_ptr(), buf.len());
        assert_eq!(super::defined(42i64), 42);
        assert_eq!(buf, [1, 2, 3]);
    }
}
