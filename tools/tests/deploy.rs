//! What an operator deploys with (issue 28), checked offline against the
//! real tools and against `qr` itself:
//!
//! - every systemd unit in `deploy/systemd` passes `systemd-analyze verify`
//!   (with its `ExecStart` pointed at this build of `qr`), and every flag it
//!   passes exists in that subcommand's `--help`; the config file it names
//!   (`--config /etc/qr/X.toml`) is `deploy/config/X.toml`, which `qr config
//!   check` accepts for that subcommand;
//! - every Kubernetes manifest in `deploy/kubernetes/base` validates against
//!   the Kubernetes schemas (`kubernetes-validate --strict`, from PyPI;
//!   `.ci/run` installs it and names it in `$KUBERNETES_VALIDATE`), and every
//!   flag its `qr` containers pass exists;
//! - the PrometheusRule's groups pass `promtool check rules` (Debian's
//!   `prometheus`), and so does every query of the Grafana dashboard
//!   (`deploy/grafana/quic-rdma.json`, checked as recording rules);
//! - every `qr_*` metric and every label the rules and the dashboard use is
//!   one the services export: the renderers of the agents, gateway, KV relay
//!   and TCP listeners, and a live `qr serve` page;
//! - a `Type=notify` unit works: `qr serve` sends `READY=1` to
//!   `$NOTIFY_SOCKET` once its bootstrap service answers.
//!
//! Addresses: 127.0.95.1 (TCP 19501) for the notify check; 127.0.95.2
//! (TCP 19502 metrics, 19503 discovery) for the live page.

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
        // A unit's `--config /etc/qr/X.toml` is deploy/config/X.toml, and
        // that file has a valid table for the unit's command.
        if let Some(i) = words.iter().position(|w| w == "--config") {
            let file = Path::new(&words[i + 1]).file_name().unwrap();
            let example = repo().join("deploy/config").join(file);
            let sub: Vec<&str> = words
                .iter()
                .skip(2) // --log-format json
                .take_while(|w| !w.starts_with('-'))
                .map(String::as_str)
                .collect();
            let out = qr()
                .args(["config", "check", "--command", &sub.join(" ")])
                .arg(&example)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: {}: {}{}",
                example.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
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

/// The PrometheusRule's `spec:`, which is a Prometheus rules file.
fn alert_rules() -> String {
    let text =
        std::fs::read_to_string(repo().join("deploy/kubernetes/examples/monitoring.yaml")).unwrap();
    let rule_doc = text
        .split("\n---\n")
        .find(|d| d.contains("kind: PrometheusRule"))
        .unwrap();
    let spec = rule_doc.split_once("\nspec:\n").unwrap().1;
    spec.lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Every PromQL expression of the Grafana dashboard, with Grafana's own
/// variables replaced by durations so Prometheus can parse them.
fn dashboard_exprs() -> Vec<String> {
    let path = repo().join("deploy/grafana/quic-rdma.json");
    let d: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let exprs: Vec<String> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .replace("$__rate_interval", "5m")
                .replace("$__range", "1h")
        })
        .collect();
    assert!(exprs.len() >= 20, "dashboard targets: {}", exprs.len());
    exprs
}

/// `promtool check rules` on a rules file, with its output on failure.
fn promtool_check_rules(what: &str, rules: &str) {
    let promtool = which("promtool").expect("promtool (apt-get install prometheus)");
    let dir = TempDir::new("deploy-rules");
    let file = dir.path("rules.yml");
    std::fs::write(&file, rules).unwrap();
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules ({what}):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn prometheus_rules_and_dashboard_parse() {
    promtool_check_rules("alert rules", &alert_rules());
    // The dashboard's queries as recording rules: promtool parses each one.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in dashboard_exprs().iter().enumerate() {
        rules += &format!("      - record: dashboard:query_{i}\n        expr: {e:?}\n");
    }
    promtool_check_rules("dashboard queries", &rules);
}

/// Every metric family and label name the services export: the agents',
/// gateway's, KV relay's and TCP listeners' renderers, and a live `qr serve`
/// page (the fabric socket, peer table and quinn totals).
fn exported() -> (BTreeSet<String>, BTreeSet<String>) {
    use quic_rdma_tools::image::cache::Cache;
    use quic_rdma_tools::image::metrics::{NodeMetrics, RegistryMetrics};
    use quic_rdma_tools::listener::ListenerStats;
    let dir = TempDir::new("deploy-exported");
    let metrics = "127.0.95.2:19502";
    let _serve = Guard::spawn(qr().args([
        "serve",
        "--ip",
        "127.0.95.2",
        "--service-port",
        "19503",
        "--metrics",
        metrics,
        "--cert-out",
        dir.path("cert.der").to_str().unwrap(),
    ]));
    let serve = common::http::when_up(metrics, || common::http::get_ok(metrics, "/metrics"));
    let kv = quic_rdma_tools::kv::Metrics::default();
    // A replica session, so the per-session families carry their labels.
    kv.set_replica(7, Default::default());
    let cache = Cache::open(dir.path("cache").as_path(), 1 << 20).unwrap();
    let mut text = serve + &NodeMetrics::default().render() + &RegistryMetrics::default().render();
    cache.prometheus("qr_node", &mut text);
    cache.prometheus("qr_registry", &mut text);
    let text = text
        + &quic_rdma_tools::gateway::GatewayStats::default().prometheus()
        + &kv.prometheus("upstream")
        + &ListenerStats::prometheus([&ListenerStats::new("http")])
        + &quic_rdma_tools::identity::TlsStats::default().render();
    let mut families = BTreeSet::new();
    let mut labels: BTreeSet<String> = ["instance", "job"].map(String::from).into();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            families.insert(t.split(' ').next().unwrap().to_string());
        } else if let Some((_, set)) = line.split_once('{') {
            for pair in set.split(',') {
                labels.insert(pair.split('=').next().unwrap().to_string());
            }
        }
    }
    (families, labels)
}

#[test]
fn rules_and_dashboard_use_only_exported_metrics_and_labels() {
    let (families, labels) = exported();
    let mut used = BTreeSet::new();
    for (what, text) in [
        ("alert rules", alert_rules()),
        ("dashboard", dashboard_exprs().join("\n")),
    ] {
        let words: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        let metrics: Vec<&str> = words
            .iter()
            .copied()
            .filter(|w| w.starts_with("qr_"))
            .collect();
        assert!(metrics.len() >= 5, "{what}: {metrics:?}");
        for m in metrics {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| m.strip_suffix(s))
                .unwrap_or(m);
            assert!(families.contains(family), "{what}: {m} is not exported");
            used.insert(family.to_string());
        }
        // Labels in `by (...)` groupings and `{label="..."}` selectors.
        for part in text.split("by (").skip(1) {
            for l in part.split(')').next().unwrap().split(',') {
                assert!(
                    labels.contains(l.trim()),
                    "{what}: label {l:?} is not exported"
                );
            }
        }
        for part in text.split('{').skip(1) {
            let sel = part.split('}').next().unwrap();
            if let Some((l, _)) = sel.split_once('=') {
                if !l.contains(' ') && !l.is_empty() {
                    assert!(labels.contains(l), "{what}: label {l:?} is not exported");
                }
            }
        }
    }
    // The dashboard covers each service's page, not only one of them.
    for prefix in [
        "qr_socket_",
        "qr_peers_",
        "qr_quinn_",
        "qr_node_",
        "qr_registry_",
        "qr_kv_",
        "qr_gateway_",
        "qr_tcp_",
        "qr_tls_",
    ] {
        assert!(
            used.iter().any(|f| f.starts_with(prefix)),
            "nothing of {prefix}* is shown"
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
