//! Config files (issue 28, item 1): `qr config check` accepts every example
//! in `deploy/config` and names the table, the key and the fix of each error
//! in broken files; a real `qr serve --config FILE` takes the file's options
//! with the command line overriding one of them.
//!
//! Addresses: 127.0.121.1 (TCP 19941 bootstrap, 19942 the file's metrics,
//! 19943 the command line's metrics).

mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{qr, wait_for_file, Guard, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn check(file: &Path, extra: &[&str]) -> Output {
    qr().args(["config", "check"])
        .arg(file)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn every_example_config_checks() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/config"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_stem().unwrap().to_string_lossy().to_string())
        .collect();
    for service in [
        "registry-agent",
        "node-agent",
        "kv-relay-upstream",
        "kv-relay-downstream",
        "gateway",
        "serve",
    ] {
        assert!(names.iter().any(|n| n == service), "no {service}.toml");
    }
    for f in &files {
        let out = check(f, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            f.display(),
            text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(": ok (tables: "),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn broken_files_name_table_key_and_fix() {
    let dir = TempDir::new("config-broken");
    // (file, what each error line must contain)
    let cases: [(&str, &[&str]); 7] = [
        (
            "[node-agent]\nregistry = '10.0.0.1:18515'\ncache-dir = '/c'\ncert = 'c'\nkey = 'k'\n\
             ca = 'a'\ncache-sise = '1G'\n",
            &["[node-agent] key \"cache-sise\"", "did you mean \"cache-size\""],
        ),
        (
            "[serve]\nip = '10.0.0.1'\ncert-out = '/c.pem'\nonce = 'yes'\nservice-port = [1, 2]\n",
            &[
                "[serve] key \"once\": wrong type",
                "[serve] key \"service-port\": wrong type",
            ],
        ),
        (
            "[node-agent]\nregistry = '10.0.0.1:18515'\ncache-dir = '/c'\ncert = 'c'\nkey = 'k'\n\
             ca = 'a'\ncache-size = '12x'\n",
            &["[node-agent] key \"cache-size\": invalid value '12x'", "fix: "],
        ),
        (
            "[gateway.to-fabrik]\nlisten = '0.0.0.0:4433'\n",
            &["[gateway.to-fabrik] unknown table", "[gateway.to-fabric]"],
        ),
        (
            "[kv-relay.upstream]\nip = '10.0.0.1'\nmaster = ['127.0.0.1:6379']\nservice-port = 19000\n\
             dir = '/d'\ncert = 'c'\nkey = 'k'\nca = 'a'\nmaster-password = 'hunter2'\n",
            &[
                "[kv-relay.upstream] key \"master-password\"",
                "master-password-file",
                "QR_KV_MASTER_PASSWORD",
            ],
        ),
        (
            "[kv-relay.downstream]\nip = '10.0.0.2'\nlisten = '127.0.0.1:6380'\ncert = 'c'\nkey = 'k'\n",
            &[
                "[kv-relay.downstream] key \"upstream\": missing",
                "[kv-relay.downstream] key \"ca\": missing",
            ],
        ),
        (
            "[registry-agent]\nip = '10.0.0.1'\ncache-dir = '/c'\ncert = 'c'\nkey = 'k'\nca = 'a'\n\
             upstream = ['http://r:5000']\nlayout = '/l'\n",
            &["[registry-agent] key \"", "keep only one of"],
        ),
    ];
    for (i, (toml, wants)) in cases.iter().enumerate() {
        let f = dir.path(&format!("broken{i}.toml"));
        std::fs::write(&f, toml).unwrap();
        let out = check(&f, &[]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "case {i}: {t}");
        for w in *wants {
            assert!(t.contains(w), "case {i}: no {w:?} in:\n{t}");
        }
        assert!(!t.contains("hunter2"), "a secret echoed: {t}");
        // Each error line starts with the file's name.
        let shown = f.display().to_string();
        for line in t.lines() {
            assert!(line.starts_with(&format!("{shown}: ")), "case {i}: {line}");
        }
    }
    // Every error of one file, not just the first.
    let f = dir.path("all.toml");
    let all = "[serve]\nip = '10.0.0.1'\ncert-out = '/c'\nonce = 'yes'\nqpn = 1\nmetrcs = 'x'\n\
               [nope]\n";
    std::fs::write(&f, all).unwrap();
    let out = check(&f, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    for w in [
        "[serve] key \"once\"",
        "[serve] key \"qpn\": invalid value",
        "[serve] key \"metrcs\"",
        "did you mean \"metrics\"",
        "[nope] unknown table",
        "4 error(s)",
    ] {
        assert!(t.contains(w), "no {w:?} in:\n{t}");
    }
    // --command checks one table; usage errors exit 2.
    let ok = check(&f, &["--command", "node-agent"]);
    assert_eq!(ok.status.code(), Some(1), "{}", text(&ok)); // no such table
    assert!(text(&ok).contains("[node-agent]"), "{}", text(&ok));
    let usage = check(&f, &["--command", "demo"]);
    assert_eq!(usage.status.code(), Some(2), "{}", text(&usage));
    let missing = check(&dir.path("none.toml"), &[]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    let syntax = dir.path("syntax.toml");
    std::fs::write(&syntax, "[serve\n").unwrap();
    assert_eq!(check(&syntax, &[]).status.code(), Some(1));
}

#[test]
fn config_is_in_help_completions_and_a_missing_table_is_refused() {
    for cmd in [
        &["serve"][..],
        &["registry-agent"],
        &["node-agent"],
        &["kv-relay", "upstream"],
        &["kv-relay", "downstream"],
        &["gateway", "to-fabric"],
        &["gateway", "to-udp"],
    ] {
        let help = qr().args(cmd).arg("--help").output().unwrap();
        assert!(
            String::from_utf8_lossy(&help.stdout).contains("--config <FILE>"),
            "{cmd:?}"
        );
    }
    let bash = qr().args(["completions", "bash"]).output().unwrap();
    assert!(String::from_utf8_lossy(&bash.stdout).contains("--config"));
    let dir = TempDir::new("config-table");
    let f = dir.path("qr.toml");
    std::fs::write(&f, "[node-agent]\nregistry = '10.0.0.1:18515'\n").unwrap();
    let out = qr()
        .args(["--log-format", "json", "serve", "--config"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("no [serve] table") && t.contains("[node-agent]"),
        "{t}"
    );
}

#[test]
fn serve_takes_the_file_and_the_command_line_overrides_it() {
    let dir = TempDir::new("config-serve");
    let cert = dir.path("serve.der");
    let f = dir.path("qr.toml");
    std::fs::write(
        &f,
        format!(
            "# One site's file: the serve table and another.\n\
             [serve]\nip = '127.0.121.1'\nservice-port = 19941\nmetrics = '127.0.121.1:19942'\n\
             cert-out = '{}'\nname = ['config.test']\n\
             [node-agent]\nregistry = '127.0.121.1:19941'\n",
            cert.display()
        ),
    )
    .unwrap();
    let serve = Guard::spawn(
        qr().args(["--log-format", "json", "serve", "--config"])
            .arg(&f)
            .args(["--metrics", "127.0.121.1:19943"]),
    );
    // The file's cert-out, ip and service-port took effect...
    wait_for_file(&cert, Duration::from_secs(20));
    let page = common::http::when_up("127.0.121.1:19943", || {
        common::http::get_ok("127.0.121.1:19943", "/metrics")
    });
    assert!(page.contains("qr_socket_"), "{page}");
    TcpStream::connect("127.0.121.1:19941").expect("bootstrap service on the file's port");
    // ...and the command line's --metrics replaced the file's.
    assert!(
        TcpStream::connect("127.0.121.1:19942").is_err(),
        "the file's metrics address is served although the command line overrode it"
    );
    let ok = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let out = serve.wait(Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metrics on http://127.0.121.1:19943/metrics"),
        "{stderr}"
    );
}
