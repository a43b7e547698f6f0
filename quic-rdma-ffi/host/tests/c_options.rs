//! `qr_engine_options` from C (issue 29, gap 6): TLS key logging, server
//! key pinning, the transport knobs and the richer connection statistics, compiled against the static library and the committed
//! header as a user builds it, run plain and under valgrind.

use std::path::{Path, PathBuf};
use std::process::Command;

use quic_rdma_ffi_host::c_program::{c_dir, ffi_dir, run};

/// Every RUN line of test_options.c passes.
const EXPECTED: &str = "4 passed, 0 failed";

/// Compiled as `name` (each test its own file: they run in parallel).
fn exe(name: &str) -> PathBuf {
    quic_rdma_ffi_host::c_program::compile(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        name,
        &[c_dir().join("tests/test_options.c")],
        &[],
    )
}

#[test]
fn c_options_tests_pass() {
    let out = run(&mut Command::new(exe("test_options")));
    print!("{out}");
    assert!(out.contains(EXPECTED), "{out}");
}

#[test]
fn c_options_tests_are_valgrind_clean() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("valgrind is required (apt-get install valgrind)");
    }
    let out = run(Command::new("valgrind")
        .args([
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--quiet",
        ])
        .arg(format!(
            "--suppressions={}",
            ffi_dir().join("valgrind.supp").display()
        ))
        .arg(exe("test_options_vg")));
    assert!(out.contains(EXPECTED), "{out}");
}
