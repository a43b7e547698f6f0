//! The C side: compile the C tests and examples with the system C compiler
//! against the static library and the generated header (flags from the
//! committed pkg-config file), run them, and run them again under
//! AddressSanitizer and valgrind.

use std::path::{Path, PathBuf};
use std::process::Command;

use quic_rdma_ffi_host::c_program::{c_dir, ffi_dir, run};

fn compile(name: &str, sources: &[PathBuf], extra: &[&str]) -> PathBuf {
    quic_rdma_ffi_host::c_program::compile(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        name,
        sources,
        extra,
    )
}

fn c_tests() -> Vec<PathBuf> {
    vec![c_dir().join("tests/test_api.c")]
}

#[test]
fn c_api_tests_pass() {
    let exe = compile("test_api", &c_tests(), &[]);
    let out = run(&mut Command::new(&exe));
    print!("{out}");
    assert!(out.contains("12 passed, 0 failed"), "{out}");
}

#[test]
fn c_api_tests_pass_under_address_sanitizer() {
    let exe = compile(
        "test_api_asan",
        &c_tests(),
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
    );
    let out = run(Command::new(&exe).env(
        "ASAN_OPTIONS",
        "detect_leaks=1:abort_on_error=0:exitcode=23",
    ));
    assert!(out.contains("12 passed, 0 failed"), "{out}");
}

#[test]
fn c_api_tests_are_valgrind_clean() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("valgrind is required (apt-get install valgrind)");
    }
    let exe = compile("test_api_vg", &c_tests(), &[]);
    // Addressability (invalid reads/writes, use after free, double free) and
    // definite leaks. Definedness tracking is off: memcheck cannot follow it
    // through ring's AES-GCM assembly and reports every decrypted byte (and
    // what rustls/quinn-proto compute from it) as uninitialised.
    let out = run(Command::new("valgrind")
        .args([
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--undef-value-errors=no",
            "--quiet",
        ])
        .arg(&exe));
    assert!(out.contains("12 passed, 0 failed"), "{out}");
}

#[test]
fn c_examples_run() {
    let dir = ffi_dir().join("examples");
    let echo = compile("echo", &[dir.join("echo.c")], &[]);
    let out = run(Command::new(&echo).args(["hello", "rdma"]));
    assert!(
        out.contains("echo: hello") && out.contains("echo: rdma"),
        "{out}"
    );
    assert!(out.contains("server saw the close: yes"), "{out}");
    let lat = compile("latency", &[dir.join("latency.c")], &[]);
    // In-process sim, and soft: real RoCEv2 packets over UDP on loopback.
    for provider in ["sim", "soft"] {
        let out = run(Command::new(&lat).args(["20000", provider]));
        print!("{out}");
        assert!(out.contains(&format!("provider={provider}")), "{out}");
        assert!(
            out.contains("p50=") && out.contains("p99=") && out.contains("p999="),
            "{out}"
        );
    }
}
