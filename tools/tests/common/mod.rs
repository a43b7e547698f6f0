//! Helpers for `qr`'s multi-process tests: the binary, child processes that die
//! with the test, private temp dirs, and network namespaces the test creates.
#![allow(dead_code, unreachable_pub)]

pub mod http;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `qr` binary under test.
pub fn qr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qr"))
}

/// A unique short tag for names of this test run (process id + counter).
pub fn unique() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("qr-test-{what}-{}", unique()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed and reaped when dropped (also on panic).
pub struct Guard(pub Option<Child>);

impl Guard {
    pub fn spawn(cmd: &mut Command) -> Guard {
        Guard(Some(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}")),
        ))
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Wait (at most `limit`) for it to exit; its output.
    pub fn wait(mut self, limit: Duration) -> Output {
        let mut child = self.0.take().unwrap();
        let deadline = Instant::now() + limit;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "process did not exit within {limit:?}; stderr:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }
}

impl Guard {
    /// Kill it now and return what it wrote.
    pub fn kill_output(mut self) -> Output {
        let mut child = self.0.take().unwrap();
        let _ = child.kill();
        child.wait_with_output().unwrap()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Require success and parse stdout as one JSON object (pretty or one line).
pub fn json_of(what: &str, out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{stdout}"))
}

/// Check a client report of a transfer of `bytes` over `soft`.
pub fn check_soft_report(r: &Value, bytes: u64) {
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["provider"], "soft");
    assert_eq!(r["transfer"]["sha256_match"], true, "{r:#}");
    assert_eq!(
        r["transfer"]["sha256_sent"],
        r["transfer"]["sha256_received"]
    );
    assert_eq!(r["transfer"]["bytes"], bytes);
    assert_eq!(r["transfer"]["bytes_received"], bytes);
    assert_eq!(r["mtu"], 4096, "{r:#}");
    assert_eq!(r["tls"]["version"], "TLSv1.3");
    assert_eq!(r["tls"]["certificate_verified"], true);
    let soft = &r["soft"]["client"];
    assert!(
        soft["tx_packets"].as_u64().unwrap() >= bytes / 4096,
        "{r:#}"
    );
    assert_eq!(soft["rx_bad_icrc"], 0, "{r:#}");
    assert_eq!(soft["rx_decode_errors"], 0, "{r:#}");
}

/// Is this process root? (From /proc: no libc needed.)
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Fail (not skip) with a clear message unless root with `tools` on PATH.
pub fn require_root_and(tools: &[&str]) {
    assert!(
        is_root(),
        "this test creates network namespaces / captures packets and must run as root \
         (CI runs as root: `.ci/run`); it is not skipped on purpose"
    );
    for t in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            found,
            "`{t}` is not installed (Debian: apt-get install {})",
            match *t {
                "ip" => "iproute2",
                other => other,
            }
        );
    }
}

/// Run a command, panic with its output unless it succeeds.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two network namespaces joined by a veth pair (MTU 9000, so RoCE MTU 4096
/// fits), with IPv4 10.<net>.0.{1,2}/24 and IPv6 fd00:<net>::{1,2}/64 (nodad).
/// Both namespaces are deleted on drop, also when the test panics.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    /// The veth ends: in `a`, in `b`.
    pub devs: [String; 2],
    pub v4: [String; 2],
    pub v6: [String; 2],
}

impl NetnsPair {
    pub fn new(net: u8) -> NetnsPair {
        Self::with_mtu(net, 9000)
    }

    /// Namespaces `a` and `b` joined by a veth pair of `mtu` bytes
    /// (10.`net`.0.1 in `a`, .2 in `b`).
    pub fn with_mtu(net: u8, mtu: u32) -> NetnsPair {
        let tag = unique();
        let (va, vb) = (format!("qrv{tag}a"), format!("qrv{tag}b"));
        let pair = NetnsPair {
            a: format!("qr-{tag}-a"),
            b: format!("qr-{tag}-b"),
            devs: [va.clone(), vb.clone()],
            v4: [format!("10.{net}.0.1"), format!("10.{net}.0.2")],
            v6: [format!("fd00:{net:x}::1"), format!("fd00:{net:x}::2")],
        };
        // From here on Drop cleans up whatever got created.
        assert!(va.len() <= 15, "interface name {va} too long");
        sh(&["ip", "netns", "add", &pair.a]);
        sh(&["ip", "netns", "add", &pair.b]);
        sh(&[
            "ip", "link", "add", &va, "netns", &pair.a, "type", "veth", "peer", "name", &vb,
            "netns", &pair.b,
        ]);
        for (ns, dev, i) in [(&pair.a, &va, 0), (&pair.b, &vb, 1)] {
            let x = |args: &[&str]| {
                let mut v = vec!["ip", "-n", ns.as_str()];
                v.extend_from_slice(args);
                sh(&v);
            };
            x(&["link", "set", "lo", "up"]);
            x(&["link", "set", dev, "mtu", &mtu.to_string()]);
            x(&["addr", "add", &format!("{}/24", pair.v4[i]), "dev", dev]);
            x(&[
                "-6",
                "addr",
                "add",
                &format!("{}/64", pair.v6[i]),
                "dev",
                dev,
                "nodad",
            ]);
            x(&["link", "set", dev, "up"]);
        }
        pair
    }

    /// `ip netns exec <ns> qr <args>`.
    pub fn qr(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_qr")])
            .args(args);
        c
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        // Deleting a namespace removes its end of the veth, and with it the pair.
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Wait until `path` exists (a server's certificate).
pub fn wait_for_file(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `promtool check metrics` on `text` and fail with its complaints.
pub fn promtool_check(what: &str, text: &str) {
    use std::io::Write as _;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what}: promtool check metrics:\n{}{}\n--- text ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
