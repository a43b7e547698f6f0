//! `qr ud-pingpong` over `soft` between two processes on loopback addresses: the
//! ibv_ud_pingpong-compatible TCP exchange and UD loop, both roles, and its
//! summary lines. (Against rdma-core's real `ibv_ud_pingpong` over kernel rxe:
//! interop/rxe/run-tests.sh.)

mod common;

use std::time::Duration;

use common::{qr, Guard};

fn summary_ok(what: &str, out: &std::process::Output, bytes: u64, iters: u32) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("local address:  LID 0x0000, QPN 0x"),
        "{what}: {text}"
    );
    assert!(
        text.contains("remote address: LID 0x0000, QPN 0x"),
        "{what}: {text}"
    );
    assert!(
        text.contains(&format!("{bytes} bytes in ")),
        "{what}: {text}"
    );
    assert!(text.contains(" Mbit/sec"), "{what}: {text}");
    assert!(
        text.contains(&format!("{iters} iters in ")),
        "{what}: {text}"
    );
    assert!(text.contains(" usec/iter"), "{what}: {text}");
}

#[test]
fn soft_server_and_client_on_loopback() {
    let port = "18611";
    let server = Guard::spawn(qr().args([
        "ud-pingpong",
        "--provider",
        "soft",
        "--ip",
        "127.0.0.53",
        "-p",
        port,
        "-s",
        "4096",
        "-n",
        "300",
        "--timeout",
        "60",
    ]));
    let client = qr()
        .args([
            "ud-pingpong",
            "--provider",
            "soft",
            "--ip",
            "127.0.0.54",
            "-p",
            port,
            "-s",
            "4096",
            "-n",
            "300",
            "--wait",
            "20",
            "--timeout",
            "60",
            "127.0.0.53",
        ])
        .output()
        .unwrap();
    summary_ok("client", &client, 4096 * 300 * 2, 300);
    let server = server.wait(Duration::from_secs(30));
    summary_ok("server", &server, 4096 * 300 * 2, 300);
    let text = String::from_utf8_lossy(&server.stdout);
    assert!(text.contains("GID ::ffff:127.0.0.54"), "{text}");
}

#[test]
fn size_above_the_mtu_is_refused() {
    let out = qr()
        .args([
            "ud-pingpong",
            "--provider",
            "soft",
            "--ip",
            "127.0.0.55",
            "-s",
            "8192",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("larger than port MTU (4096)"), "{err}");
}
