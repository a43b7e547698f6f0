//! `qr_engine_options` from C: TLS key logging, server
//! key pinning, the transport knobs and the richer connection statistics, compiled against the static library and the committed
//! header as a user builds it, run plain and under valgrind.

use std::path::{Path, PathBuf};
use std::process::Command;

use quic_rdma_ffi_host::c_program::{c_dir, run, valgrind_clean};

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
    valgrind_clean(Command::new(exe("test_options_vg")), EXPECTED);
}
