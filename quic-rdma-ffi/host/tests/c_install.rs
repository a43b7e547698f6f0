//! Packaging: `install.sh` into a fresh prefix, then
//! a C program built the way a user builds one — flags from the installed
//! pkg-config files only — linked statically (`quic_rdma_static`: no run-time
//! dependency on the .so) and dynamically (`quic_rdma`: the SONAME
//! `libquic_rdma_ffi.so.0` recorded and found through the installed
//! symlink). Also reports the archive's size, stripped and not.

use std::path::{Path, PathBuf};
use std::process::Command;

use quic_rdma_ffi_host::c_program::{ffi_dir, lib_dir, run};

fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = run(Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .args(args));
    out.split_whitespace().map(str::to_owned).collect()
}

/// `readelf -d` of `file`: its dynamic section (SONAME, NEEDED).
fn dynamic_section(file: &Path) -> String {
    run(Command::new("readelf").arg("-d").arg(file))
}

fn build(prefix: &Path, package: &str, out: &Path) {
    let src = ffi_dir().join("examples/echo.c");
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O1"])
        .arg(format!("-I{}", ffi_dir().join("examples").display()))
        .args(pkg_config(prefix, &["--cflags", package]))
        .arg(&src)
        .args(pkg_config(prefix, &["--libs", "--static", package]))
        .arg("-o")
        .arg(out);
    run(&mut cc);
}

fn install(prefix: &Path) -> String {
    let _ = std::fs::remove_dir_all(prefix);
    let target = lib_dir().parent().expect("target/<profile>").to_path_buf();
    run(Command::new(ffi_dir().join("install.sh"))
        .env("CARGO_TARGET_DIR", target)
        .arg(prefix))
}

#[test]
fn installed_library_links_statically_and_dynamically() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let prefix = tmp.join("qr-prefix");
    let report = install(&prefix);
    print!("{report}");
    let lib = prefix.join("lib");

    // The shared library names itself by its major version; the symlinks
    // lead there from the link-time and run-time names.
    let so = std::fs::read_link(lib.join("libquic_rdma_ffi.so.0")).expect("symlink .so.0");
    assert!(
        so.to_string_lossy().starts_with("libquic_rdma_ffi.so.0."),
        "{so:?}"
    );
    assert_eq!(
        std::fs::read_link(lib.join("libquic_rdma_ffi.so")).unwrap(),
        Path::new("libquic_rdma_ffi.so.0")
    );
    let d = dynamic_section(&lib.join("libquic_rdma_ffi.so"));
    assert!(d.contains("Library soname: [libquic_rdma_ffi.so.0]"), "{d}");

    // Static, with `--static` as a user links it: nothing of ours is needed at
    // run time, and it runs without any library path.
    let stat = tmp.join("echo_static");
    build(&prefix, "quic_rdma_static", &stat);
    let d = dynamic_section(&stat);
    assert!(
        !d.contains("libquic_rdma_ffi"),
        "static link needs the .so: {d}"
    );
    let out = run(Command::new(&stat)
        .arg("static")
        .env_remove("LD_LIBRARY_PATH"));
    assert!(out.contains("echo: static"), "{out}");

    // Shared: the SONAME is recorded, and the installed symlink resolves it.
    let dynamic = tmp.join("echo_shared");
    build(&prefix, "quic_rdma", &dynamic);
    let d = dynamic_section(&dynamic);
    assert!(d.contains("Shared library: [libquic_rdma_ffi.so.0]"), "{d}");
    let out = run(Command::new(&dynamic)
        .arg("shared")
        .env("LD_LIBRARY_PATH", &lib));
    assert!(out.contains("echo: shared"), "{out}");

    // Size: the build tree's archive keeps the standard library's DWARF; the
    // installed one is stripped of it and must still link (it just did).
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let built = size(&lib_dir().join("libquic_rdma_ffi.a"));
    let installed = size(&lib.join("libquic_rdma_ffi.a"));
    println!("libquic_rdma_ffi.a: {built} bytes built, {installed} bytes installed (stripped)");
    assert!(installed < built, "install.sh strips debug info");
}
