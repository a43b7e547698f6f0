//! Checked conversions of C pointers; the only place most `unsafe` lives.

use std::ffi::{c_char, CStr};
use std::mem::MaybeUninit;

use crate::error::{fail, QR_EINVAL, QR_ENULL, QR_ETOOSMALL};
use crate::valgrind::mark_defined;

/// `&mut *p`, or `QR_ENULL`.
///
/// # Safety
/// `p` is NULL or points to a live, exclusively accessible `T` for `'a`.
pub(crate) unsafe fn obj<'a, T>(p: *mut T) -> Result<&'a mut T, i32> {
    // SAFETY: non-null checked by `as_mut`; validity and exclusivity are the caller's contract.
    unsafe { p.as_mut() }.ok_or(QR_ENULL)
}

/// `&*p`, or `QR_ENULL`.
///
/// # Safety
/// `p` is NULL or points to a live `T` for `'a`.
pub(crate) unsafe fn obj_ref<'a, T>(p: *const T) -> Result<&'a T, i32> {
    // SAFETY: non-null checked by `as_ref`; validity is the caller's contract.
    unsafe { p.as_ref() }.ok_or(QR_ENULL)
}

/// A byte slice from (pointer, length); NULL is allowed only with length 0.
///
/// # Safety
/// If non-null, `p` points to `len` readable bytes for `'a`.
pub(crate) unsafe fn bytes<'a>(p: *const u8, len: usize) -> Result<&'a [u8], i32> {
    if p.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(QR_ENULL) };
    }
    // SAFETY: non-null, and the caller guarantees `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A mutable byte slice from (pointer, length); NULL is allowed only with length 0.
///
/// # Safety
/// If non-null, `p` points to `len` writable bytes, not aliased, for `'a`.
pub(crate) unsafe fn bytes_mut<'a>(p: *mut u8, len: usize) -> Result<&'a mut [u8], i32> {
    if p.is_null() {
        return if len == 0 { Ok(&mut []) } else { Err(QR_ENULL) };
    }
    // SAFETY: non-null, and the caller guarantees `len` writable, unaliased bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// A UTF-8 string from a NUL-terminated C string.
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string for `'a`.
pub(crate) unsafe fn text<'a>(p: *const c_char) -> Result<&'a str, i32> {
    if p.is_null() {
        return Err(QR_ENULL);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| QR_EINVAL)
}

/// Write `v` through `out`, or `QR_ENULL`.
///
/// # Safety
/// `out` is NULL or valid for writing a `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> Result<(), i32> {
    if out.is_null() {
        return Err(QR_ENULL);
    }
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(v) };
    mark_defined(out.cast(), size_of::<T>());
    Ok(())
}

/// Copy `src` out to the caller's `buf` of `cap` bytes with the size-query
/// protocol: `*len` (unless NULL) gets `src.len()`; `QR_ETOOSMALL` when it
/// does not fit, and then nothing is copied. `buf` may be NULL only with 0.
///
/// # Safety
/// If non-null, `buf` points to `cap` writable bytes not overlapping `src`;
/// `len` is NULL or writable.
pub(crate) unsafe fn copy_out(
    src: &[u8],
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> Result<(), i32> {
    if buf.is_null() && cap > 0 {
        return Err(QR_ENULL);
    }
    if !len.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(len, src.len()) }?;
    }
    if src.len() > cap {
        return Err(QR_ETOOSMALL);
    }
    // SAFETY: `buf` holds `cap` >= `src.len()` writable bytes (non-null when
    // `src` is non-empty, checked above), distinct from `src`, by contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf, src.len()) };
    mark_defined(buf, src.len());
    Ok(())
}

/// A struct whose first field is `uint32_t struct_size` and for which all-zero
/// bytes are a valid value (integers, floats, raw pointers only).
///
/// # Safety
/// Implementors must be `#[repr(C)]`, start with a `u32` size field, and be
/// valid when zeroed.
pub(crate) unsafe trait Versioned: Copy {
    /// The size of the struct's first published version: an input struct
    /// smaller than this is a caller error (`QR_EINVAL`), never "all defaults".
    const V1_SIZE: usize;
}

/// The largest `struct_size` believed: no version of any struct comes near
/// it, so a larger value is an uninitialised field, not a newer header.
pub(crate) const MAX_STRUCT_SIZE: usize = 64 << 10;

/// Read a versioned struct: the prefix of `struct_size` bytes the caller knows
/// of, the rest zero (defaults). Smaller than the struct's first version
/// ([`Versioned::V1_SIZE`]) or above [`MAX_STRUCT_SIZE`]: `QR_EINVAL`.
/// Larger than this library's struct (a caller built against a newer
/// header): accepted only if every byte this library does not know is zero
/// (the newer fields left at their defaults), else `QR_EINVAL` — a setting
/// the caller made must never be ignored silently. Messages name `what`.
///
/// # Safety
/// `p` is NULL or points to at least `(*p).struct_size` readable bytes.
pub(crate) unsafe fn read_versioned<T: Versioned>(p: *const T, what: &str) -> Result<T, i32> {
    if p.is_null() {
        return Err(QR_ENULL);
    }
    // SAFETY: non-null; the size field is the first 4 bytes of every Versioned struct.
    let size = unsafe { p.cast::<u32>().read_unaligned() } as usize;
    if size < T::V1_SIZE || size > MAX_STRUCT_SIZE {
        return Err(fail(
            QR_EINVAL,
            format!(
                "{what}.struct_size is {size}: set it to sizeof({what}) \
                 (this library knows {} bytes; the first version had {})",
                size_of::<T>(),
                T::V1_SIZE
            ),
        ));
    }
    let n = size.min(size_of::<T>());
    if size > n {
        // SAFETY: the caller provides `size` readable bytes at `p`, and `n < size`.
        let tail = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(n), size - n) };
        if let Some(i) = tail.iter().position(|&b| b != 0) {
            return Err(fail(
                QR_EINVAL,
                format!(
                    "{what}.struct_size is {size} but this library knows only {n} bytes, \
                     and byte {} beyond them is set: the program was built against a newer \
                     header than this library (qr_version() is {}); upgrade the library or \
                     leave the newer fields zero",
                    n + i,
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        }
    }
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: the caller provides `size` >= `n` readable bytes at `p`; `v` has
    // `size_of::<T>()` >= `n` bytes; the regions are distinct.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), v.as_mut_ptr().cast::<u8>(), n) };
    // SAFETY: all-zero is valid for T (Versioned contract) and the copied prefix
    // came from a valid T of the caller's (an older, smaller layout of the same fields).
    Ok(unsafe { v.assume_init() })
}

/// Write a versioned struct: only the prefix of the caller's `struct_size`
/// (clamped to ours), then `struct_size` set to what was written.
///
/// # Safety
/// `out` is NULL or points to at least `(*out).struct_size` writable bytes.
pub(crate) unsafe fn write_versioned<T: Versioned>(out: *mut T, v: &T) -> Result<(), i32> {
    if out.is_null() {
        return Err(QR_ENULL);
    }
    // SAFETY: non-null; the size field is the first 4 bytes.
    let size = unsafe { out.cast::<u32>().read_unaligned() } as usize;
    if size < 4 {
        return Err(QR_EINVAL);
    }
    let n = size.min(size_of::<T>());
    // SAFETY: the caller provides `size` >= `n` writable bytes; `v` is a distinct local.
    unsafe {
        std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out.cast::<u8>(), n);
        out.cast::<u32>().write_unaligned(n as u32);
    }
    mark_defined(out.cast(), n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::qr_fabric_config;

    /// A caller's struct from a newer header: ours plus one field.
    #[repr(C)]
    struct Newer {
        ours: qr_fabric_config,
        later: u64,
    }

    fn newer(later: u64) -> Newer {
        // SAFETY: qr_fabric_config is Versioned: valid when zeroed.
        let mut ours: qr_fabric_config = unsafe { std::mem::zeroed() };
        ours.struct_size = size_of::<Newer>() as u32;
        Newer { ours, later }
    }

    #[test]
    fn an_unknown_tail_must_be_zero() {
        let zero = newer(0);
        // SAFETY: `zero` holds `struct_size` readable bytes.
        let c = unsafe { read_versioned(&zero.ours, "qr_fabric_config") };
        assert!(
            c.is_ok(),
            "a newer header's fields left at zero are accepted"
        );
        let set = newer(7);
        // SAFETY: as above.
        let c = unsafe { read_versioned(&set.ours, "qr_fabric_config") };
        assert_eq!(c.err(), Some(QR_EINVAL), "a newer field set is refused");
    }

    #[test]
    fn implausible_sizes_are_refused_before_reading() {
        let mut v = newer(0);
        for size in [0, 4, MAX_STRUCT_SIZE as u32 + 1, u32::MAX] {
            v.ours.struct_size = size;
            // SAFETY: sizes above MAX_STRUCT_SIZE are refused before any byte
            // past the size field is read; the others are within `v`.
            let c = unsafe { read_versioned(&v.ours, "qr_fabric_config") };
            assert_eq!(c.err(), Some(QR_EINVAL), "struct_size {size}");
        }
    }
}
