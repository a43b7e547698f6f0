//! The committed header `include/quic_rdma.h` is exactly what cbindgen generates
//! from the crate now. Regenerate with `QR_UPDATE_HEADER=1`.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen")
        .write(&mut out);
    let generated = String::from_utf8(out).unwrap();
    let path = dir.join("include/quic_rdma.h");
    if std::env::var_os("QR_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/quic_rdma.h is stale: run QR_UPDATE_HEADER=1 cargo test -p quic-rdma-ffi --test header"
    );
    for f in [
        "qr_engine_poll",
        "qr_strerror",
        "qr_fabric_new",
        "qr_stream_read",
    ] {
        assert!(generated.contains(f), "{f} exported");
    }
}

#[test]
fn pkg_config_file_matches_the_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pc = std::fs::read_to_string(dir.join("quic_rdma.pc")).unwrap();
    assert!(pc.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))));
    assert!(pc.contains("-lquic_rdma_ffi"));
    // The static one names the archive by path: -l would find the .so beside it.
    let pc = std::fs::read_to_string(dir.join("quic_rdma_static.pc")).unwrap();
    assert!(pc.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))));
    let libs = pc.lines().find(|l| l.starts_with("Libs:")).unwrap();
    assert!(libs.starts_with("Libs: ${libdir}/libquic_rdma_ffi.a "));
    assert!(!libs.contains("-lquic_rdma_ffi"));
}
