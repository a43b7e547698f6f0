//! Building and running C programs against the library the way a C user
//! does: the system `cc`, the committed header and pkg-config file, and the
//! static library cargo put in `target/<profile>/`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `quic-rdma-ffi/`: the header (`include/`), the pkg-config file, the examples.
pub fn ffi_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits inside quic-rdma-ffi/")
        .to_path_buf()
}

/// `quic-rdma-ffi/host/c/`: the C tests and the host-side C code.
pub fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("c")
}

/// `target/<profile>/`, where cargo put `libquic_rdma_ffi.a`: two levels above
/// the running test binary (`target/<profile>/deps/…`).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current executable");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
        .to_path_buf();
    assert!(
        dir.join("libquic_rdma_ffi.a").exists(),
        "static library missing in {}: `cargo test` builds only the rlib; run `cargo build{} -p quic-rdma-ffi` first (.ci/run does)",
        dir.display(),
        if dir.ends_with("release") { " --release" } else { "" }
    );
    dir
}

/// Flags from the committed pkg-config file `package` (`quic_rdma` or
/// `quic_rdma_static`) pointed at the build tree.
fn pkg_config(package: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", ffi_dir())
        .arg(format!(
            "--define-variable=includedir={}",
            ffi_dir().join("include").display()
        ))
        .arg(format!("--define-variable=libdir={}", lib_dir().display()))
        .args(args)
        .arg(package)
        .output()
        .expect("pkg-config runs (apt-get install pkg-config)");
    assert!(
        out.status.success(),
        "pkg-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("pkg-config prints UTF-8")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Compile `sources` into the executable `out_dir/name` with warnings as
/// errors, the examples' helpers on the include path, and `extra` flags (for
/// example a sanitizer): C11 with `cc`, or C++20 with `c++` when the first
/// source is a `.cpp` file. Panics with the command when compiling fails.
pub fn compile(out_dir: &Path, name: &str, sources: &[PathBuf], extra: &[&str]) -> PathBuf {
    let out = out_dir.join(name);
    let cpp = sources
        .first()
        .is_some_and(|s| s.extension().is_some_and(|e| e == "cpp"));
    let (compiler, std) = if cpp {
        ("c++", "-std=c++20")
    } else {
        ("cc", "-std=c11")
    };
    let mut cmd = Command::new(compiler);
    cmd.args([
        std,
        "-D_POSIX_C_SOURCE=200809L",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
        "-O1",
    ])
    .args(pkg_config("quic_rdma_static", &["--cflags"]))
    .arg(format!("-I{}", ffi_dir().join("examples").display()))
    .args(extra)
    .args(sources)
    // The static archive by path and its system libraries, as a user gets
    // them from quic_rdma_static.pc (a plain -l would pick the shared one).
    .args(pkg_config("quic_rdma_static", &["--libs"]))
    .arg("-o")
    .arg(&out);
    let st = cmd
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs (apt-get install gcc g++): {e}"));
    assert!(st.success(), "compiling {name} failed: {cmd:?}");
    out
}

/// Run `cmd` to completion; its stdout. Panics with both outputs unless it exits 0.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the program starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// Run `cmd` (a test program, its environment set) under `valgrind` with
/// memcheck's defaults (definedness tracking on) and the shipped
/// suppressions, as a user runs it; its stdout, which must hold `expected`.
/// Panics on any memcheck error or definite leak. Without the suppressions
/// memcheck reports ~3 million definedness errors from inside the library
/// (ring's assembly; see `valgrind.supp`).
pub fn valgrind_clean(cmd: Command, expected: &str) -> String {
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("valgrind is required (apt-get install valgrind)");
    }
    let mut vg = Command::new("valgrind");
    vg.args([
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--quiet",
    ])
    .arg(format!(
        "--suppressions={}",
        ffi_dir().join("valgrind.supp").display()
    ))
    .arg(cmd.get_program())
    .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => vg.env(k, v),
            None => vg.env_remove(k),
        };
    }
    let out = run(&mut vg);
    assert!(out.contains(expected), "{out}");
    out
}
