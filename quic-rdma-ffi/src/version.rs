//! The library's version, for programs that load it dynamically.

use std::ffi::c_char;

/// The library's version as text, "MAJOR.MINOR.PATCH" (static, never NULL).
#[no_mangle]
pub extern "C" fn qr_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The library's version as one number: `MAJOR << 16 | MINOR << 8 | PATCH`,
/// for comparisons (`qr_version_number() >= 0x000100`).
#[no_mangle]
pub extern "C" fn qr_version_number() -> u32 {
    let part = |s: &str| s.parse::<u32>().unwrap_or(0) & 0xff;
    part(env!("CARGO_PKG_VERSION_MAJOR")) << 16
        | part(env!("CARGO_PKG_VERSION_MINOR")) << 8
        | part(env!("CARGO_PKG_VERSION_PATCH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_number_agree() {
        // SAFETY: a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(qr_version()) }
            .to_str()
            .unwrap();
        let n = qr_version_number();
        assert_eq!(
            text,
            format!("{}.{}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
        );
    }
}
