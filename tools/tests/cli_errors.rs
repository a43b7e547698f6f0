//! What `qr` says, and with which exit code, when it cannot do what it was
//! asked (issue 9 #10). Addresses 127.0.93.5..9 and TEST-NET-1's 192.0.2.1
//! (never a local address); TCP ports 19305..19309, never listened on.

mod common;

use std::net::UdpSocket;
use std::process::Output;
use std::time::Duration;

use common::{qr, Guard, TempDir};

/// Run `qr args` (at most 60 s) and return its output and stderr.
fn run(args: &[&str]) -> (Output, String) {
    let out = Guard::spawn(qr().args(args)).wait(Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

/// A bind that fails for another reason than "address in use" (here: not an
/// address of this host) must not ask whether another endpoint is bound there.
#[test]
fn bind_errors_name_their_cause() {
    let dir = TempDir::new("bind-errors");
    let cert = dir.path("cert.der");
    let cert = cert.to_str().unwrap();
    let (out, err) = run(&[
        "serve",
        "--ip",
        "192.0.2.1",
        "--service-port",
        "19305",
        "--cert-out",
        cert,
    ]);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("already bound"), "{err}");
    assert!(
        err.contains("192.0.2.1 is not an address of this host"),
        "{err}"
    );

    // EADDRINUSE still gets the hint.
    let _taken = UdpSocket::bind("127.0.93.5:4791").unwrap();
    let (out, err) = run(&[
        "serve",
        "--ip",
        "127.0.93.5",
        "--service-port",
        "19305",
        "--cert-out",
        cert,
    ]);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("127.0.93.5:4791 is taken: is another endpoint already bound there?"),
        "{err}"
    );
}

/// `qr connect` to a port nobody listens on: the OS error once, not twice
/// ("Connection refused (os error 111): Connection refused (os error 111)").
#[test]
fn connect_refused_is_said_once() {
    let (out, err) = run(&[
        "connect",
        "127.0.93.6:19306",
        "--cert",
        "/nonexistent/cert.der",
        "--wait",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("bootstrap query to 127.0.93.6:19306"), "{err}");
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
}

/// Log lines written to a pipe or a file carry no colour codes.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    let out = Guard::spawn(qr().env("RUST_LOG", "debug").args([
        "connect",
        "127.0.93.7:19307",
        "--cert",
        "/nonexistent/cert.der",
        "--wait",
        "1",
    ]))
    .wait(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DEBUG"), "a debug line was logged: {err}");
    assert!(!err.contains('\x1b'), "colour codes in a pipe: {err:?}");
}

/// Without the `verbs` feature, `--provider verbs` fails at once naming the
/// fix, instead of first waiting --wait seconds for a bootstrap answer.
#[cfg(not(feature = "verbs"))]
#[test]
fn connect_verbs_not_built_in_fails_at_once() {
    let started = std::time::Instant::now();
    let (out, err) = run(&[
        "connect",
        "127.0.93.7:19307",
        "--cert",
        "/nonexistent/cert.der",
        "--provider",
        "verbs",
        "--wait",
        "30",
    ]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--features verbs"), "{err}");
    assert!(!err.contains("bootstrap"), "{err}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

/// `qr ud-pingpong` exits 2 on bad usage, as its help says.
#[test]
fn ud_pingpong_bad_usage_exits_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["-s", "0", "--ip", "127.0.93.8"],
            "-s, -n and -r must be at least 1",
        ),
        (
            &["-n", "0", "--ip", "127.0.93.8"],
            "-s, -n and -r must be at least 1",
        ),
        (
            &["--provider", "sim", "--ip", "127.0.93.8"],
            "provider `sim` is in-process",
        ),
        (&[], "a soft server needs --ip"),
        (
            &["-g", "nonsense"],
            "neither a GID index nor an IPv4/IPv6 address",
        ),
        (
            &["-s", "8192", "--ip", "127.0.93.8", "-p", "19308"],
            "requested size larger than port MTU (4096)",
        ),
    ];
    for (args, said) in cases {
        let mut all = vec!["ud-pingpong"];
        all.extend_from_slice(args);
        let (out, err) = run(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(said), "{all:?}: {err}");
    }
    #[cfg(not(feature = "verbs"))]
    {
        let (out, err) = run(&["ud-pingpong", "--provider", "verbs", "127.0.93.9"]);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("--features verbs"), "{err}");
    }
}

/// Byte sizes are never rounded: `--bytes 1.5` is refused (it ran, moving 2
/// bytes), a fraction of a unit that is whole is taken exactly.
#[test]
fn byte_sizes_are_not_rounded() {
    for cmd in [
        &["demo", "--bytes", "1.5", "--pings", "1"][..],
        &["demo", "--bytes", "1.1K", "--pings", "1"][..],
        &[
            "connect",
            "127.0.93.9:19309",
            "--cert",
            "/nonexistent/cert.der",
            "--bytes",
            "1.5",
        ][..],
    ] {
        let (out, err) = run(cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(
            err.contains("is not a whole number of bytes"),
            "{cmd:?}: {err}"
        );
    }
    let (out, err) = run(&["demo", "--bytes", "1.5K", "--pings", "1", "--json"]);
    let r = common::json_of("demo --bytes 1.5K", &out);
    assert_eq!(r["transfer"]["bytes"], 1536, "{err}");
    assert_eq!(r["transfer"]["bytes_received"], 1536, "{err}");
}

/// `qr gateway`'s bad usage exits 2 with the fix named; what can only be
/// found at start (a --udp-bind not of this host, a --target name that does
/// not resolve) exits 1 naming the flag, before it forwards anything.
#[test]
fn gateway_bad_usage_is_refused_at_start() {
    let common = ["--fabric-ip", "127.0.93.7", "--target", "127.0.93.6:19306"];
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--max-clients", "0"], 2, "0 would refuse every client"),
        (&["--idle-timeout", "0s"], 2, "0 would drop every client"),
        (&["--fabric-mtu", "1500"], 2, "is not a RoCE MTU"),
        (
            &["--udp-bind", "192.0.2.1"],
            1,
            "--udp-bind 192.0.2.1: cannot send from it",
        ),
    ];
    for (args, code, said) in cases {
        let mut all = vec!["gateway", "to-udp"];
        all.extend_from_slice(&common);
        all.extend_from_slice(args);
        let (out, err) = run(&all);
        assert_eq!(out.status.code(), Some(*code), "{all:?}: {err}");
        assert!(err.contains(said), "{all:?}: {err}");
    }
    let (out, err) = run(&[
        "gateway",
        "to-udp",
        "--fabric-ip",
        "127.0.93.7",
        "--target",
        "no-such-host.invalid:4433",
    ]);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--target no-such-host.invalid:4433"), "{err}");
    // The "port taken" hint names a flag the gateway has.
    let (_, help) = run(&["gateway", "to-fabric", "--help"]);
    assert!(help.is_empty());
    let out =
        Guard::spawn(qr().args(["gateway", "to-fabric", "--help"])).wait(Duration::from_secs(60));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--udp-port"));
}

/// `qr --version` names the git revision; completions and manual pages come
/// from the same clap definitions (every subcommand in both), and a reader
/// that closes the pipe early does not make `qr` panic.
#[test]
fn version_completions_and_manual_pages() {
    let out = Guard::spawn(qr().arg("--version")).wait(Duration::from_secs(60));
    let version = String::from_utf8_lossy(&out.stdout).to_string();
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert!(version.starts_with("qr 0."), "{version}");
    if let Some(head) = head {
        assert!(
            version.contains(&format!("({head})")),
            "{version} vs HEAD {head}"
        );
    }
    let subcommands = [
        "registry-agent",
        "node-agent",
        "kv-relay",
        "gateway",
        "serve",
        "pull",
    ];
    for shell in ["bash", "zsh", "fish"] {
        // Read while it writes (a script is larger than a pipe's buffer).
        let out = qr().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in subcommands {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    let dir = TempDir::new("man-pages");
    let out = Guard::spawn(qr().args(["man", "--dir"]).arg(dir.path("man")))
        .wait(Duration::from_secs(60));
    assert!(out.status.success());
    for page in [
        "qr.1",
        "qr-node-agent.1",
        "qr-kv-relay-upstream.1",
        "qr-gateway-to-fabric.1",
    ] {
        let text = std::fs::read_to_string(dir.path("man").join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH "), "{page} is not a roff page");
    }
    let node = std::fs::read_to_string(dir.path("man").join("qr-node-agent.1")).unwrap();
    assert!(node.contains("cache\\-dir"), "the page lists the flags");
    // A closed pipe: exit quietly, no panic.
    let mut child = qr()
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}
