//! Must-show (e): `ctr images pull --hosts-dir …` through the node agent. A
//! containerd daemon of the test's own (root, state and socket in a tempdir,
//! no CRI plugin) pulls a umoci image whose registry host has a hosts.toml
//! mirror pointing at `qr node-agent`; containerd verifies every digest as it
//! commits content, `ctr images check` reports the image complete, its content
//! digests equal the registry's, and docker-registry saw no request from
//! containerd itself (everything came over the fabric). Then `qr pull` (.53)
//! pulls the same image over the fabric into an OCI layout.
//!
//! Addresses: 127.0.111.50 docker-registry (TCP 19150), .51 registry agent
//! (bootstrap 19151, metrics 19152), .52 node agent (HTTP 19153), .53 `qr pull`.

mod image_support;

use std::process::Command;

use image_support::*;

const REPO: &str = "qr/ctr";
const TAG: &str = "v1";
const UPSTREAM: &str = "127.0.111.50:19150";

#[test]
fn ctr_pulls_through_the_node_agent() {
    require(&["docker-registry", "skopeo", "umoci", "containerd", "ctr"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let registry = Registry::start(d, UPSTREAM);
    let layout = build_image(d, TAG, &[24 << 20, 1 << 20, 8 << 10]);
    push(&layout, TAG, &registry.addr, REPO);
    let pki = pki(d, "127.0.111.51");
    let _ra = qr(
        "registry-agent",
        &registry_agent_args(
            &pki,
            "127.0.111.51",
            19151,
            UPSTREAM,
            &d.join("rc"),
            "127.0.111.51:19152",
        ),
        &d.join("ra.log"),
    );
    // Blobs under 64 KiB (the config and the 8 KiB layer) go straight to the
    // upstream over HTTP; the rest over the fabric.
    let mut na_args = node_agent_args(
        &pki,
        "127.0.111.52",
        "127.0.111.51:19151",
        "127.0.111.52:19153",
        &d.join("nc"),
    );
    na_args.extend([
        "--direct-upstream".into(),
        format!("http://{UPSTREAM}"),
        "--direct-threshold".into(),
        "64K".into(),
    ]);
    let _na = qr("node-agent", &na_args, &d.join("na.log"));
    let containerd = Containerd::start(d, "127.0.111.52:19153", &[(UPSTREAM, "http")]);
    let image = format!("{UPSTREAM}/{REPO}:{TAG}");
    containerd.pull(&image, &d.join("na.log"));
    // containerd's content store holds exactly the registry's blobs.
    assert_eq!(containerd.content(), layout_digests(&layout));
    // Everything came through the agents: containerd never asked the upstream.
    let log = std::fs::read_to_string(&registry.log).unwrap();
    assert!(
        !log.lines().any(|l| l.contains("useragent=containerd")),
        "containerd reached docker-registry directly"
    );
    // `qr pull` of the same image over the fabric (library path, no HTTP
    // hop): its JSON summary, and the OCI layout it writes, blob by blob.
    let mut pull = Command::new(env!("CARGO_BIN_EXE_qr"));
    pull.args([
        "pull",
        &format!("{REPO}:{TAG}"),
        "--registry",
        "127.0.111.51:19151",
        "--ip",
        "127.0.111.53",
        "--json",
        "--cert",
    ])
    .arg(pki.join("node.pem"))
    .arg("--key")
    .arg(pki.join("node-key.pem"))
    .arg("--ca")
    .arg(pki.join("ca.pem"))
    .arg("--cache-dir")
    .arg(d.join("pull-cache"))
    .arg("--out")
    .arg(d.join("pull-out"));
    let summary: serde_json::Value = serde_json::from_str(&run(&mut pull)).unwrap();
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["blobs"].as_array().unwrap().len(), 4, "{summary}");
    assert!(summary["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["path"] == "fabric"));
    assert_eq!(layout_digests(&d.join("pull-out")), layout_digests(&layout));

    // And for people: on a terminal (a pty from `script`), one progress bar
    // per blob, each ending "verified (PATH)", then the one-line summary.
    let mut cmd = vec![env!("CARGO_BIN_EXE_qr").to_string()];
    cmd.extend(
        [
            "pull",
            &format!("{REPO}:{TAG}"),
            "--registry",
            "127.0.111.51:19151",
            "--ip",
            "127.0.111.53",
        ]
        .map(String::from),
    );
    for (flag, path) in [
        ("--cert", pki.join("node.pem")),
        ("--key", pki.join("node-key.pem")),
        ("--ca", pki.join("ca.pem")),
        ("--cache-dir", d.join("pull-cache-tty")),
    ] {
        cmd.push(flag.into());
        cmd.push(path.display().to_string());
    }
    let shell = cmd
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let tty = run(Command::new("script").args(["-qec", &shell, "/dev/null"]));
    for digest in layout_digests(&layout)
        .iter()
        .filter(|x| summary["blobs"].to_string().contains(x.as_str()))
    {
        let prefix = &digest[7..19];
        assert!(
            tty.lines()
                .any(|l| l.contains(prefix) && l.contains("verified (fabric)")),
            "no finished progress bar for {digest} in:\n{tty}"
        );
    }
    let last = tty
        .lines()
        .rev()
        .find(|l| l.contains("pulled "))
        .unwrap_or_else(|| panic!("no summary line in:\n{tty}"));
    assert!(
        last.contains("4 blobs") && last.contains("Mbit/s") && last.contains("paths: fabric"),
        "{last}"
    );

    let (_, _, m) = http_get("127.0.111.52:19153", "/metrics", &[]);
    let m = String::from_utf8(m).unwrap();
    let sample = quic_rdma_tools::image::metrics::sample;
    assert!(
        sample(&m, "qr_node_bytes_total{path=\"fabric\"}").unwrap() >= (25 << 20) as f64,
        "{m}"
    );
    // The config and the small layer came direct (containerd checked their
    // digests like the rest's), the big layers over the fabric.
    assert_eq!(
        sample(&m, "qr_node_objects_total{path=\"direct\"}"),
        Some(2.0),
        "{m}"
    );
    // Over the fabric: the two big layers, plus every manifest request.
    assert!(
        sample(&m, "qr_node_objects_total{path=\"fabric\"}").unwrap() >= 3.0,
        "{m}"
    );
}
