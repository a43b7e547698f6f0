//! The C test of completion time stamps (`c/tests/test_timestamps.c`):
//! compiled against the static library and the generated header, run, and
//! run again under AddressSanitizer and valgrind (the stamps handed out must
//! be defined bytes).

use std::path::Path;
use std::process::Command;

use quic_rdma_ffi_host::c_program::{c_dir, compile, run, valgrind_clean};

/// Every C test passes: the count is the number of RUN lines.
const EXPECTED: &str = "4 passed, 0 failed";

#[test]
fn c_timestamp_tests_pass() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = [c_dir().join("tests/test_timestamps.c")];
    let exe = compile(tmp, "test_timestamps", &src, &[]);
    let out = run(&mut Command::new(&exe));
    print!("{out}");
    assert!(out.contains(EXPECTED), "{out}");
    let asan = compile(
        tmp,
        "test_timestamps_asan",
        &src,
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
    );
    let out = run(Command::new(&asan).env("ASAN_OPTIONS", "detect_leaks=1:exitcode=23"));
    assert!(out.contains(EXPECTED), "{out}");
    // The sim tests only under valgrind (test_timestamps.c says why), so
    // three of four pass.
    let mut sim_only = Command::new(&exe);
    sim_only.arg("--sim-only");
    valgrind_clean(sim_only, "3 passed, 0 failed");
}
