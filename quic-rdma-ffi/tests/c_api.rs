//! The C side: compile the C tests and examples with the system C compiler
//! against the static library and the generated header (flags from the
//! committed pkg-config file), run them, and run them again under
//! AddressSanitizer and valgrind.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>/`, where cargo put `libquic_rdma_ffi.a` next to this test's `deps/`.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    assert!(
        dir.join("libquic_rdma_ffi.a").exists(),
        "static library missing in {}: `cargo test` builds only the rlib; run `cargo build{} -p quic-rdma-ffi` first (.ci/run does)",
        dir.display(),
        if dir.ends_with("release") { " --release" } else { "" }
    );
    dir
}

/// Flags from `quic_rdma.pc`: cflags, and the private libraries for static linking.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", crate_dir())
        .arg(format!(
            "--define-variable=includedir={}",
            crate_dir().join("include").display()
        ))
        .arg(format!("--define-variable=libdir={}", lib_dir().display()))
        .args(args)
        .arg("quic_rdma")
        .output()
        .expect("pkg-config runs");
    assert!(
        out.status.success(),
        "pkg-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Compile `sources` into an executable named `name` (in the test's temp dir).
fn compile(name: &str, sources: &[PathBuf], extra: &[&str]) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let mut cmd = Command::new("cc");
    cmd.args([
        "-std=c11",
        "-D_POSIX_C_SOURCE=200809L",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
        "-O1",
    ])
    .args(pkg_config(&["--cflags"]))
    .arg(format!("-I{}", crate_dir().join("examples").display()))
    .args(extra)
    .args(sources)
    // The static library explicitly (a plain -l would pick the shared one).
    .arg(lib_dir().join("libquic_rdma_ffi.a"))
    .args(
        pkg_config(&["--static", "--libs-only-l"])
            .into_iter()
            .filter(|l| l != "-lquic_rdma_ffi"),
    )
    .arg("-o")
    .arg(&out);
    let st = cmd.status().expect("cc runs");
    assert!(st.success(), "compiling {name} failed: {cmd:?}");
    out
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn c_tests() -> Vec<PathBuf> {
    vec![crate_dir().join("tests/c/test_api.c")]
}

#[test]
fn c_api_tests_pass() {
    let exe = compile("test_api", &c_tests(), &[]);
    let out = run(&mut Command::new(&exe));
    print!("{out}");
    assert!(out.contains("5 passed, 0 failed"), "{out}");
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
    assert!(out.contains("5 passed, 0 failed"), "{out}");
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
    assert!(out.contains("5 passed, 0 failed"), "{out}");
}

#[test]
fn c_examples_run() {
    let dir = crate_dir().join("examples");
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
