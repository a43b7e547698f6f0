//! `qr serve --once` and `qr demo --provider soft` leave no server behind
//! (issue 9 #5): `--timeout` covers the wait for the first client, and the
//! demo's `qr serve` child dies with its parent — even a SIGKILLed one — taking
//! the parent's temporary directory with it. Addresses 127.0.93.1..4, TCP
//! service ports 19301 and 19303.

mod common;

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{qr, Guard, TempDir};

/// Poll `f` until it holds or `limit` passes; whether it held.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// State and parent pid of process `pid`, from /proc/<pid>/stat.
fn stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'.
    let mut rest = s[s.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Still running (a zombie has exited: it only waits for its reaper).
fn alive(pid: u32) -> bool {
    matches!(stat(pid), Some((state, _)) if state != 'Z')
}

/// Running children of `ppid`.
fn children_of(ppid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| matches!(stat(pid), Some((s, p)) if p == ppid && s != 'Z'))
        .collect()
}

/// Kills process `pid` (one this test caused to exist) on drop if it still runs,
/// so a failing test does not leave it behind either.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// Entries of `dir` (names).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Before the fix the timeout only started once a client had connected: with
/// none, `qr serve --once` waited forever (this test's 30 s limit panicked).
#[test]
fn serve_once_times_out_without_a_client() {
    let dir = TempDir::new("serve-timeout");
    let started = Instant::now();
    let out = Guard::spawn(
        qr().args([
            "serve",
            "--once",
            "--timeout",
            "2",
            "--ip",
            "127.0.93.1",
            "--service-port",
            "19301",
        ])
        .arg("--cert-out")
        .arg(dir.path("cert.der")),
    )
    .wait(Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", out.status);
    assert!(
        stderr.contains("no client connected within 2 s (--timeout)"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    // It let go of its RoCEv2 port and its service port.
    UdpSocket::bind("127.0.93.1:4791").expect("UDP 127.0.93.1:4791 still taken");
    TcpListener::bind("127.0.93.1:19301").expect("TCP 127.0.93.1:19301 still taken");
}

/// Before the fix the child `qr serve --once` of a SIGKILLed `qr demo` kept
/// running (until its --timeout, 300 s here) and the demo's temporary
/// directory stayed.
#[test]
fn demo_killed_leaves_no_server_and_no_temp_dir() {
    let tmp = TempDir::new("demo-kill");
    let demo = Guard::spawn(qr().env("TMPDIR", &tmp.0).args([
        "demo",
        "--provider",
        "soft",
        "--server-ip",
        "127.0.93.3",
        "--client-ip",
        "127.0.93.4",
        "--service-port",
        "19303",
        // Far more than it can move before the kill below.
        "--bytes",
        "64G",
        "--pings",
        "0",
        "--timeout",
        "300",
    ]));
    let parent = demo.id();
    // Until the server child is up and its certificate is in the demo's dir.
    let mut child = None;
    let ready = eventually(Duration::from_secs(30), || {
        child = children_of(parent).first().copied();
        let dirs = entries(&tmp.0);
        child.is_some() && dirs.len() == 1 && tmp.0.join(&dirs[0]).join("server-cert.der").exists()
    });
    let child = child.map(KillOnDrop);
    assert!(
        ready,
        "no server child with a certificate: child {:?}, {:?}",
        child.as_ref().map(|c| c.0),
        entries(&tmp.0)
    );
    let child = child.unwrap();
    assert!(
        entries(&tmp.0)[0].starts_with(&format!("qr-demo-{parent}-")),
        "{:?}",
        entries(&tmp.0)
    );

    // SIGKILL: the parent runs no destructor, no handler.
    let out = demo.kill_output();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "the demo ended before it was killed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(
        eventually(Duration::from_secs(10), || !alive(child.0)),
        "qr serve (pid {}) outlived its killed parent",
        child.0
    );
    assert!(
        eventually(Duration::from_secs(5), || entries(&tmp.0).is_empty()),
        "left behind in TMPDIR: {:?}",
        entries(&tmp.0)
    );
    // And the addresses are free again.
    UdpSocket::bind("127.0.93.3:4791").expect("UDP 127.0.93.3:4791 still taken");
    TcpListener::bind("127.0.93.3:19303").expect("TCP 127.0.93.3:19303 still taken");
}
