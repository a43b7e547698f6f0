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

/// The C tests' PKI (`QR_TEST_PKI`): a root CA, an intermediate, a server
/// leaf under the intermediate (its PEM chain: leaf + intermediate), a client
/// leaf under the root (DER), and a client of a foreign CA (PEM).
fn pki_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-api-pki");
        std::fs::create_dir_all(&dir).unwrap();
        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            p
        };
        let root_key = KeyPair::generate().unwrap();
        let root = ca("qr test root").self_signed(&root_key).unwrap();
        let mid_key = KeyPair::generate().unwrap();
        let mid = ca("qr test intermediate")
            .signed_by(&mid_key, &root, &root_key)
            .unwrap();
        let leaf = |san: &str, key: &KeyPair, issuer: &rcgen::Certificate, issuer_key: &KeyPair| {
            CertificateParams::new(vec![san.to_owned()])
                .unwrap()
                .signed_by(key, issuer, issuer_key)
                .unwrap()
        };
        let server_key = KeyPair::generate().unwrap();
        let server = leaf("server.test", &server_key, &mid, &mid_key);
        let client_key = KeyPair::generate().unwrap();
        let client = leaf("client.test", &client_key, &root, &root_key);
        let foreign_ca_key = KeyPair::generate().unwrap();
        let foreign_ca = ca("foreign root").self_signed(&foreign_ca_key).unwrap();
        let foreign_key = KeyPair::generate().unwrap();
        let foreign = leaf("client.test", &foreign_key, &foreign_ca, &foreign_ca_key);
        let files: [(&str, Vec<u8>); 7] = [
            (
                "server-chain.pem",
                format!("{}{}", server.pem(), mid.pem()).into_bytes(),
            ),
            ("server-key.pem", server_key.serialize_pem().into_bytes()),
            ("root.pem", root.pem().into_bytes()),
            ("client.der", client.der().to_vec()),
            ("client-key.der", client_key.serialize_der()),
            ("foreign.pem", foreign.pem().into_bytes()),
            ("foreign-key.pem", foreign_key.serialize_pem().into_bytes()),
        ];
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        dir
    })
    .clone()
}

/// Every C test passes: the count is the number of RUN lines in test_api.c.
const EXPECTED: &str = "21 passed, 0 failed";

#[test]
fn c_api_tests_pass() {
    let exe = compile("test_api", &c_tests(), &[]);
    let out = run(Command::new(&exe).env("QR_TEST_PKI", pki_dir()));
    print!("{out}");
    assert!(out.contains(EXPECTED), "{out}");
}

#[test]
fn c_api_tests_pass_under_address_sanitizer() {
    let exe = compile(
        "test_api_asan",
        &c_tests(),
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
    );
    let out = run(Command::new(&exe)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:abort_on_error=0:exitcode=23",
        )
        .env("QR_TEST_PKI", pki_dir()));
    assert!(out.contains(EXPECTED), "{out}");
}

/// `exe` under valgrind ([`valgrind_clean`](quic_rdma_ffi_host::c_program::valgrind_clean)),
/// with the test PKI.
fn valgrind_clean(exe: &Path, expected: &str) {
    let mut cmd = Command::new(exe);
    cmd.env("QR_TEST_PKI", pki_dir());
    quic_rdma_ffi_host::c_program::valgrind_clean(cmd, expected);
}

#[test]
fn c_api_tests_are_valgrind_clean() {
    valgrind_clean(&compile("test_api_vg", &c_tests(), &[]), EXPECTED);
}

/// The API's contract: bounded configs, per-call
/// `qr_last_error`, `QR_ENOFD`, newer structs' unknown tails, datagrams
/// dropped on receive (counted, signalled, sized).
const CONTRACT_EXPECTED: &str = "5 passed, 0 failed";

#[test]
fn c_contract_tests_pass() {
    let exe = compile(
        "test_contract",
        &[c_dir().join("tests/test_contract.c")],
        &[],
    );
    let out = run(&mut Command::new(&exe));
    print!("{out}");
    assert!(out.contains(CONTRACT_EXPECTED), "{out}");
    // The datagrams the C code inspects are decrypted: clean only because
    // the library marks what it hands out as defined.
    valgrind_clean(&exe, CONTRACT_EXPECTED);
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

/// The C++ wrapper (include/quic_rdma.hpp): its own tests, also under ASan.
#[test]
fn cpp_wrapper_tests_pass() {
    let src = c_dir().join("tests/test_cpp.cpp");
    let exe = compile("test_cpp", std::slice::from_ref(&src), &[]);
    let out = run(&mut Command::new(&exe));
    assert!(out.contains("3 passed, 0 failed"), "{out}");
    let asan = compile(
        "test_cpp_asan",
        &[src],
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
    );
    let out = run(Command::new(&asan).env("ASAN_OPTIONS", "detect_leaks=1:exitcode=23"));
    assert!(out.contains("3 passed, 0 failed"), "{out}");
}
