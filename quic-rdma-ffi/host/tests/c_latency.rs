//! The C latency client (`examples/qr_latency.h`, what `examples/latency.c`
//! runs) against servers it does not share code with:
//! - in one process, a server written in Rust straight on `quic_rdma::engine`,
//!   over `sim` (the C client's engine and the Rust server share the fabric)
//!   and over `soft` (real RoCEv2 packets over UDP on loopback);
//! - as separate processes over `soft`, the `latency` example program against
//!   `rust-echo-server` (the same Rust server) and against its own `--serve`.
//!
//! The C client checks every response equals its request (each carries its
//! sequence number); the Rust server's SHA-256 of what it received must equal
//! that of the requests the C client builds.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{Mtu, UdQueuePair, DEFAULT_QKEY};
use quic_rdma_ffi::qr_fabric;
use quic_rdma_ffi_host::c_program::{compile, ffi_dir, run as run_program};
use quic_rdma_ffi_host::{c_latency_client, sent_request_digest, EchoServer, SelfSigned, MSG};

const ITERS: i64 = 10_000;

/// Both sides busy-poll: one run at a time on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// What a run of `iters` sends (warm-up included; the warm-up count is the C
/// client's, `qr_latency_warmup`).
fn sent_bytes(iters: i64) -> u64 {
    ((iters / 10 + 100 + iters) as usize * MSG) as u64
}

/// Run the C client from `client_gid` on `fabric` against the Rust server on `qp`.
fn run(provider: &str, fabric: &qr_fabric, qp: impl UdQueuePair + 'static, client_gid: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tls = SelfSigned::localhost();
    let server = EchoServer::spawn(qp, &tls).expect("Rust engine server starts");
    let r = c_latency_client(fabric, client_gid, server.addr(), tls.cert_der(), ITERS)
        .unwrap_or_else(|rc| panic!("C latency client over {provider} failed: {rc}"));
    let report = server.stop();
    println!(
        "provider={provider} peer=rust-engine iterations={} rtt p50={:.2} us p99={:.2} us p999={:.2} us max={:.2} us",
        r.iterations, r.p50_us, r.p99_us, r.p999_us, r.max_us
    );
    assert_eq!(r.iterations as i64, ITERS);
    assert!(
        0.0 < r.p50_us && r.p50_us <= r.p99_us && r.p99_us <= r.p999_us && r.p999_us <= r.max_us,
        "{r:?}"
    );
    assert_eq!(report.connections, 1, "{report:?}");
    let warmup = ITERS / 10 + 100;
    assert_eq!(
        report.bytes,
        ((warmup + ITERS) as usize * MSG) as u64,
        "{report:?}"
    );
    assert_eq!(
        report.sha256,
        sent_request_digest(ITERS),
        "server received other bytes than the C client sent"
    );
}

#[test]
fn c_latency_client_against_rust_engine_over_sim() {
    let fabric = qr_fabric::from_sim(SimFabric::new(SimConfig::default()));
    let sim = fabric.as_sim().expect("a sim fabric");
    let qp = sim
        .create_qp(
            "fd00::51".parse::<std::net::Ipv6Addr>().unwrap().into(),
            SimQpOptions::default(),
        )
        .unwrap();
    run("sim", &fabric, qp, "fd00::52");
}

#[test]
fn c_latency_client_against_rust_engine_over_soft() {
    let port = SoftPort::open(SoftConfig::new("127.0.0.61".parse().unwrap()))
        .expect("soft port on 127.0.0.61");
    let qp = port.create_qp(DEFAULT_QKEY).unwrap();
    run("soft", &qr_fabric::soft(Mtu::M4096), qp, "127.0.0.62");
}

/// The `latency` example, compiled once.
fn latency_program() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        compile(
            Path::new(env!("CARGO_TARGET_TMPDIR")),
            "latency",
            &[ffi_dir().join("examples/latency.c")],
            &[],
        )
    })
    .clone()
}

/// A server process that printed `ready qpn=N qkey=K`; killed if still running when dropped.
struct ServerProcess {
    child: Child,
    stdout: BufReader<ChildStdout>,
    qpn: String,
    qkey: String,
}

impl ServerProcess {
    fn start(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("server starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("server prints its address");
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in the server's first line {line:?}"))
                .to_owned()
        };
        let (qpn, qkey) = (field("qpn="), field("qkey="));
        ServerProcess {
            child,
            stdout,
            qpn,
            qkey,
        }
    }

    /// Close its standard input and collect the rest of its output once it exits (bounded).
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = String::new();
        self.stdout
            .read_to_string(&mut rest)
            .expect("server output");
        assert!(status.success(), "server failed ({status}): {rest}");
        rest
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `latency --connect` from `client_gid` to the server at `server_gid`; its output.
fn latency_client_process(
    server: &ServerProcess,
    client_gid: &str,
    server_gid: &str,
    ca: &Path,
) -> String {
    let out = run_program(Command::new(latency_program()).args([
        "--connect",
        client_gid,
        server_gid,
        &server.qpn,
        &server.qkey,
        ca.to_str().unwrap(),
        &ITERS.to_string(),
    ]));
    print!("{out}");
    assert!(
        out.contains(&format!(
            "provider=soft peer={server_gid} iterations={ITERS}"
        )),
        "{out}"
    );
    assert!(
        out.contains("p50=") && out.contains("p99=") && out.contains("p999="),
        "{out}"
    );
    out
}

#[test]
fn latency_program_against_rust_engine_process_over_soft() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ca = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rust-echo-server.der");
    let server = ServerProcess::start(
        Command::new(env!("CARGO_BIN_EXE_rust-echo-server"))
            .args(["127.0.0.63", ca.to_str().unwrap()]),
    );
    latency_client_process(&server, "127.0.0.64", "127.0.0.63", &ca);
    let report = server.finish();
    let hex: String = sent_request_digest(ITERS)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        report.contains(&format!(
            "served connections=1 bytes={} sha256={hex}",
            sent_bytes(ITERS)
        )),
        "the Rust server received other bytes than the C client sent: {report}"
    );
}

#[test]
fn latency_program_against_itself_as_two_processes_over_soft() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ca = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("latency-serve.der");
    let server = ServerProcess::start(Command::new(latency_program()).args([
        "--serve",
        "127.0.0.65",
        ca.to_str().unwrap(),
    ]));
    latency_client_process(&server, "127.0.0.66", "127.0.0.65", &ca);
    let report = server.finish();
    assert!(
        report.contains(&format!("served bytes={}", sent_bytes(ITERS))),
        "{report}"
    );
}

/// Two processes that find each other through the address-exchange service
/// (`qr_bootstrap_serve` / `qr_bootstrap_query`) instead of passing the QPN.
#[test]
fn latency_program_finds_its_server_through_the_address_service() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ca = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("latency-service.der");
    let server = ServerProcess::start(Command::new(latency_program()).args([
        "--serve",
        "127.0.0.67",
        ca.to_str().unwrap(),
        "--service",
        "127.0.0.67:19361",
    ]));
    let out = run_program(Command::new(latency_program()).args([
        "--connect-service",
        "127.0.0.68",
        "127.0.0.67:19361",
        ca.to_str().unwrap(),
        &ITERS.to_string(),
    ]));
    print!("{out}");
    assert!(
        out.contains(&format!(
            "provider=soft peer=127.0.0.67:19361 iterations={ITERS}"
        )),
        "{out}"
    );
    let report = server.finish();
    assert!(
        report.contains(&format!("served bytes={}", sent_bytes(ITERS))),
        "{report}"
    );
}
