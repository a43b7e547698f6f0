//! Gives the shared library a SONAME (`libquic_rdma_ffi.so.MAJOR`), so a
//! program linked against it records that name and the loader finds the
//! installed `libquic_rdma_ffi.so.MAJOR` symlink (`install.sh`), not the
//! build tree's unversioned file.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets it");
    // Only the cdylib: the staticlib and rlib have no SONAME.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libquic_rdma_ffi.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
