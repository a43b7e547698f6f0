//! The project distributes itself (issue 28 item 3): the container image of
//! `qr` is built without a daemon (`deploy/image/build.sh`, umoci) twice,
//! with equal digests; pushed to docker-registry with skopeo; pulled by
//! containerd through `qr node-agent` ← fabric (`soft`) ← `qr
//! registry-agent`; and `ctr run` starts `qr --version` from it, which names
//! this build.
//!
//! Addresses: 127.0.111.100 docker-registry (TCP 19210), .101 registry agent
//! (bootstrap 19211, metrics 19212), .102 node agent (HTTP 19213).

mod image_support;

use std::path::Path;
use std::process::Command;

use image_support::*;

const UPSTREAM: &str = "127.0.111.100:19210";
const NODE: &str = "127.0.111.102:19213";
const REPO: &str = "quic-rdma/qr";

fn build(layout: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/build.sh");
    run(Command::new(script)
        .arg(env!("CARGO_BIN_EXE_qr"))
        .arg(layout)
        .arg("test"));
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_qr_image_is_reproducible_and_runs_after_a_pull_through_the_agents() {
    require(&[
        "docker-registry",
        "skopeo",
        "umoci",
        "containerd",
        "ctr",
        "runc",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let first = build(&d.join("image-a"));
    let second = build(&d.join("image-b"));
    assert_eq!(first, second, "two builds of one binary, one digest");

    let registry = Registry::start(d, UPSTREAM);
    push(&d.join("image-a"), "test", UPSTREAM, REPO);
    let pki = pki(d, "127.0.111.101");
    let _ra = qr(
        "registry-agent",
        &registry_agent_args(
            &pki,
            "127.0.111.101",
            19211,
            UPSTREAM,
            &d.join("rc"),
            "127.0.111.101:19212",
        ),
        &d.join("ra.log"),
    );
    let _na = qr(
        "node-agent",
        &node_agent_args(
            &pki,
            "127.0.111.102",
            "127.0.111.101:19211",
            NODE,
            &d.join("nc"),
        ),
        &d.join("na.log"),
    );
    let containerd = Containerd::start(d, NODE, &[(UPSTREAM, "http")]);
    let image = format!("{UPSTREAM}/{REPO}:test");
    containerd.pull(&image, &d.join("na.log"));
    let listed = run(&mut containerd.ctr(&["images", "ls"]));
    assert!(
        listed.contains(&first),
        "containerd holds the image by its digest:\n{listed}"
    );
    let log = std::fs::read_to_string(&registry.log).unwrap();
    assert!(
        !log.contains("useragent=containerd"),
        "containerd reached docker-registry directly"
    );
    let out = containerd
        .ctr(&[
            "run",
            "--rm",
            "--snapshotter",
            "native",
            &image,
            "qr-version",
            "/usr/local/bin/qr",
            "--version",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ctr run: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = Command::new(env!("CARGO_BIN_EXE_qr"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(stdout.trim(), String::from_utf8_lossy(&ours.stdout).trim());
}
