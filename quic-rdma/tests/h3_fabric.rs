//! HTTP/3 with the unmodified `h3` + `h3-quinn` crates over the fabric: a 64 MiB
//! body fetched and its sha256 checked against the one computed locally, over
//! `sim` (in process) and over `soft` between two processes (the `h3_server` and
//! `h3_client` examples; addresses 127.0.115.x).

mod common;

#[path = "../examples/h3_common/mod.rs"]
mod h3_common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{endpoint, gid, socket_on};
use quic_rdma::fabric::sim::{SimConfig, SimFabric};
use quic_rdma::quinn_adapter;
use quic_rdma::socket::SocketConfig;

const BODY: u64 = 64 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_64mib_over_sim() {
    let fabric = SimFabric::new(SimConfig::default());
    let (ssock, _) = socket_on(&fabric, gid(1, false), SocketConfig::default());
    let (csock, _) = socket_on(&fabric, gid(2, false), SocketConfig::default());
    let mtu = ssock.mtu();
    let (cert, server_cfg) =
        h3_common::server_config(quinn_adapter::FabricConfig::new(mtu).transport()).unwrap();
    let server = endpoint(&ssock, Some(server_cfg), 0x4e3);
    let client = endpoint(&csock, None, 0xc43);
    tokio::spawn(h3_common::serve(server.clone()));
    let cfg =
        h3_common::client_config(cert, quinn_adapter::FabricConfig::new(mtu).transport()).unwrap();
    let addr = csock.peer_addr(ssock.ud_addr());
    let t = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(120),
        h3_common::fetch(&client, cfg.clone(), addr, &format!("/bytes/{BODY}")),
    )
    .await
    .expect("fetch finished in time")
    .unwrap();
    eprintln!("h3 over sim: {BODY} bytes in {:?}", t.elapsed());
    assert_eq!(got.status, 200);
    assert_eq!(got.bytes, BODY);
    assert_eq!(got.sha256, h3_common::expected_sha256(BODY));
    // A path the server does not serve is a 404, not a hang or a reset.
    let missing = h3_common::fetch(&client, cfg, addr, "/nothing")
        .await
        .unwrap();
    assert_eq!((missing.status, missing.bytes), (404, 0));
    assert!(csock.stats().recv_packets >= BODY / mtu as u64);
}

/// target/<profile>/deps/h3_fabric-<hash> → target/<profile>/examples/<name>
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable in target/<profile>/deps");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.is_file(),
        "{} not found: build the examples first (`cargo build -p quic-rdma --examples`, \
         with --release for a release test run)",
        bin.display()
    );
    bin
}

/// A child process killed (by its own pid) when the test ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `key=value` pairs of one output line.
fn parse(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The first stdout line of `child` starting with `prefix`, within `timeout`.
fn line_of(child: &mut Child, prefix: &str, timeout: Duration) -> String {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    let p = prefix.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with(&p) {
                let _ = tx.send(line);
                return;
            }
            eprintln!("child: {line}");
        }
    });
    rx.recv_timeout(timeout)
        .unwrap_or_else(|e| panic!("no {prefix:?} line: {e:?}"))
}

#[test]
fn h3_64mib_over_soft_between_processes() {
    let dir = tempfile_dir();
    let cert = dir.join("h3_server.der");
    let mut server = Proc(
        Command::new(example("h3_server"))
            .args(["127.0.115.1", cert.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn h3_server"),
    );
    let ready = parse(&line_of(&mut server.0, "READY ", Duration::from_secs(20)));
    let mut client = Proc(
        Command::new(example("h3_client"))
            .args([
                "127.0.115.2",
                &ready["ip"],
                &ready["qpn"],
                &ready["qkey"],
                cert.to_str().unwrap(),
                &format!("/bytes/{BODY}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn h3_client"),
    );
    let line = line_of(&mut client.0, "FETCHED ", Duration::from_secs(120));
    eprintln!("{line}");
    let got = parse(&line);
    assert_eq!(got["status"], "200");
    assert_eq!(got["bytes"], BODY.to_string());
    assert_eq!(
        got["sha256"],
        h3_common::hex(&h3_common::expected_sha256(BODY)),
        "sha256 of the body fetched over soft equals the one computed here"
    );
    let status = client.0.wait().unwrap();
    assert!(status.success(), "h3_client exited with {status}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system temp dir for this test's files.
fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("h3_fabric-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
