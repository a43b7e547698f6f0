//! What an operator deploys with (issue 28), checked offline against the
//! real tools and against `qr` itself:
//!
//! - every systemd unit in `deploy/systemd` passes `systemd-analyze verify`
//!   (with its `ExecStart` pointed at this build of `qr`), and every flag it
//!   passes exists in that subcommand's `--help`;
//! - every Kubernetes manifest in `deploy/kubernetes/base` validates against
//!   the Kubernetes schemas (`kubernetes-validate --strict`, from PyPI;
//!   `.ci/run` installs it and names it in `$KUBERNETES_VALIDATE`), and every
//!   flag its `qr` containers pass exists;
//! - the PrometheusRule's groups pass `promtool check rules` (Debian's
//!   `prometheus`), and every `qr_*` metric they use is one the agents
//!   export (read from their own renderers);
//! - a `Type=notify` unit works: `qr serve` sends `READY=1` to
//!   `$NOTIFY_SOCKET` once its bootstrap service answers.
//!
//! Address: 127.0.95.1 (TCP 19501) for the notify check.

mod common;

use std::collections::BTreeSet;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{qr, Guard, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no *.{ext} in {dir}");
    v
}

/// Every `--flag` `qr SUBCOMMAND… --help` lists (global ones included).
fn flags_of(subcommand: &[String]) -> BTreeSet<String> {
    let out = qr().args(subcommand).arg("--help").output().unwrap();
    assert!(out.status.success(), "qr {subcommand:?} --help failed");
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .collect()
}

/// Check a `qr` argument list: the global flags, the subcommand path (the
/// words before the first flag after it), and that every flag exists there.
fn check_args(what: &str, args: &[String]) {
    let mut i = 0;
    // Global flags before the subcommand (`--log-format json` or `=json`).
    while i < args.len() && args[i].starts_with("--") {
        i += if args[i].contains('=') { 1 } else { 2 };
    }
    let mut sub = Vec::new();
    while i < args.len() && !args[i].starts_with('-') {
        sub.push(args[i].clone());
        i += 1;
    }
    assert!(!sub.is_empty(), "{what}: no subcommand in {args:?}");
    let known = flags_of(&sub);
    for a in &args[i..] {
        if let Some(flag) = a.strip_prefix("--") {
            let name = format!("--{}", flag.split('=').next().unwrap());
            assert!(
                known.contains(&name),
                "{what}: `qr {}` has no {name}",
                sub.join(" ")
            );
        }
    }
}

#[test]
fn systemd_units_verify_and_their_flags_exist() {
    let analyze = which("systemd-analyze").expect("systemd-analyze (apt-get install systemd)");
    let dir = TempDir::new("deploy-units");
    let qr_bin = env!("CARGO_BIN_EXE_qr");
    for unit in files("deploy/systemd", "service") {
        let text = std::fs::read_to_string(&unit).unwrap();
        let name = unit.file_name().unwrap().to_str().unwrap();
        assert!(
            text.contains("Type=notify"),
            "{name}: readiness via sd_notify"
        );
        for key in [
            "User=",
            "ProtectSystem=strict",
            "NoNewPrivileges=true",
            "CapabilityBoundingSet=",
        ] {
            assert!(text.contains(key), "{name}: no {key}");
        }
        let local = dir.path(name);
        std::fs::write(&local, text.replace("/usr/local/bin/qr", qr_bin)).unwrap();
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(&local)
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{name}: systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The sandbox, as systemd scores it (docs/operations.md quotes it).
        let sec = Command::new(&analyze)
            .args(["security", "--offline=yes"])
            .arg(&local)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&sec.stdout);
        let score: f64 = report
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .and_then(|l| l.split(": ").nth(1))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no exposure score in {report}"));
        eprintln!("{name}: exposure {score}");
        assert!(score <= 2.5, "{name}: exposure {score} (was ≤ 2.2)");
        // ExecStart, its continuation lines joined.
        let exec = text
            .replace("\\\n", " ")
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=").map(str::to_string))
            .unwrap();
        let words: Vec<String> = exec
            .split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect();
        check_args(name, &words);
    }
}

/// The `args:` lists of the `qr` containers in a manifest (line-based: a
/// line `args:` then its `- item` lines).
fn container_args(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.trim() != "args:" {
            continue;
        }
        let mut args = Vec::new();
        while let Some(next) = lines.peek() {
            let Some(item) = next.trim_start().strip_prefix("- ") else {
                break;
            };
            args.push(item.trim().to_string());
            lines.next();
        }
        out.push(args);
    }
    out
}

#[test]
fn kubernetes_manifests_validate_and_their_flags_exist() {
    let validate = std::env::var_os("KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .or_else(|| which("kubernetes-validate"))
        .expect(
            "kubernetes-validate (PyPI; .ci/run installs it in a venv and sets \
             KUBERNETES_VALIDATE)",
        );
    let manifests: Vec<PathBuf> = files("deploy/kubernetes/base", "yaml")
        .into_iter()
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    // The oldest Kubernetes still supported upstream when this was written, and the newest
    // the tool knows.
    for version in ["1.30.0", "1.33.0"] {
        let out = Command::new(&validate)
            .args(["--strict", "--kubernetes-version", version])
            .args(&manifests)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "kubernetes-validate {version}:\n{text}"
        );
        assert!(!text.contains("ERROR"), "{text}");
        let passed = text.matches("passed for resource").count();
        assert!(passed >= 10, "every resource checked ({passed}):\n{text}");
    }
    // Every resource the kustomization lists exists.
    let kust =
        std::fs::read_to_string(repo().join("deploy/kubernetes/base/kustomization.yaml")).unwrap();
    for r in kust
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter(|r| r.ends_with(".yaml"))
    {
        assert!(
            repo().join("deploy/kubernetes/base").join(r).is_file(),
            "{r}"
        );
    }
    let mut checked = 0;
    for f in manifests
        .iter()
        .chain(&files("deploy/kubernetes/examples", "yaml"))
    {
        let text = std::fs::read_to_string(f).unwrap();
        for args in container_args(&text)
            .into_iter()
            .filter(|a| a.iter().any(|w| !w.starts_with('-')))
        {
            // Only qr's own containers (the init container runs a shell).
            if args.iter().any(|a| a == "-ec") {
                continue;
            }
            check_args(&f.display().to_string(), &args);
            checked += 1;
        }
    }
    assert!(checked >= 5, "qr containers checked: {checked}");
}

#[test]
fn prometheus_rules_pass_promtool_and_use_exported_metrics() {
    let promtool = which("promtool").expect("promtool (apt-get install prometheus)");
    let text =
        std::fs::read_to_string(repo().join("deploy/kubernetes/examples/monitoring.yaml")).unwrap();
    let rule_doc = text
        .split("\n---\n")
        .find(|d| d.contains("kind: PrometheusRule"))
        .unwrap();
    // The `spec:` of a PrometheusRule is a Prometheus rules file.
    let spec = rule_doc.split_once("\nspec:\n").unwrap().1;
    let rules: String = spec
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = TempDir::new("deploy-rules");
    let file = dir.path("rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every qr_* metric is one the agents export, as their renderers write it.
    use quic_rdma_tools::image::metrics::{NodeMetrics, RegistryMetrics};
    let exported = NodeMetrics::default().render()
        + &RegistryMetrics::default().render()
        + &quic_rdma_tools::gateway::GatewayStats::default().prometheus();
    let used: BTreeSet<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("qr_"))
        .collect();
    assert!(used.len() >= 5, "{used:?}");
    for m in used {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| m.strip_suffix(s))
            .unwrap_or(m);
        assert!(
            exported.contains(&format!("# TYPE {family} ")),
            "{m}: not a metric the agents export"
        );
    }
}

#[test]
fn serve_tells_systemd_it_is_ready() {
    let dir = TempDir::new("deploy-notify");
    let path = dir.path("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let _serve = Guard::spawn(
        qr().args([
            "serve",
            "--ip",
            "127.0.95.1",
            "--service-port",
            "19501",
            "--cert-out",
            dir.path("cert.der").to_str().unwrap(),
        ])
        .env("NOTIFY_SOCKET", &path),
    );
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY=1 within 30 s");
    let msg = String::from_utf8_lossy(&buf[..n]);
    assert!(msg.starts_with("READY=1\nSTATUS="), "{msg}");
    // Ready means ready: the bootstrap service answers now.
    assert!(std::net::TcpStream::connect("127.0.95.1:19501").is_ok());
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|f| f.is_file())
    })
}
