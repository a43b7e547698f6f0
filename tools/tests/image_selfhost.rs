//! The project distributes itself (issue 28 item 3): the multi-arch
//! container image of `qr` (linux/amd64 and linux/arm64 under one OCI image
//! index) is built without a daemon (`deploy/image/build.sh`, umoci) twice,
//! with equal index digests; pushed to docker-registry with `skopeo copy
//! --all`; pulled by containerd (which picks linux/amd64) through `qr
//! node-agent` ← fabric (`soft`) ← `qr registry-agent`; and `ctr run` starts
//! `qr --version` from it, which names this build. The arm64 image is real:
//! its rootfs, unpacked, runs its `qr --version` under qemu-aarch64 with the
//! same version line.
//!
//! The aarch64 `qr` is cross-built before the tests (`.ci/run`):
//! `cargo build --release -p quic-rdma-tools --bin qr --target
//! aarch64-unknown-linux-gnu`.
//!
//! Addresses: 127.0.111.100 docker-registry (TCP 19210), .101 registry agent
//! (bootstrap 19211, metrics 19212), .102 node agent (HTTP 19213).

mod image_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use image_support::*;

const UPSTREAM: &str = "127.0.111.100:19210";
const NODE: &str = "127.0.111.102:19213";
const REPO: &str = "quic-rdma/qr";

const AARCH64: &str = "aarch64-unknown-linux-gnu";

/// The cross-built aarch64 `qr` beside this build's: from
/// `TARGET_DIR/release/qr` to `TARGET_DIR/aarch64-unknown-linux-gnu/release/qr`.
fn aarch64_qr() -> PathBuf {
    let host = Path::new(env!("CARGO_BIN_EXE_qr"));
    let target_dir = host.parent().and_then(Path::parent).unwrap();
    let qr = target_dir.join(AARCH64).join("release/qr");
    assert!(
        qr.is_file(),
        "{} is missing; build it first (.ci/run does): \
         rustup target add {AARCH64} && \
         cargo build --release -p quic-rdma-tools --bin qr --target {AARCH64}",
        qr.display()
    );
    qr
}

/// Build the image index `test` (linux/amd64 and linux/arm64) into `layout`;
/// its digest.
fn build(layout: &Path, arm64: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/build.sh");
    run(Command::new(script)
        .arg(layout)
        .arg("test")
        .arg(format!("linux/amd64={}", env!("CARGO_BIN_EXE_qr")))
        .arg(format!("linux/arm64={}", arm64.display())));
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let tagged = |name: &str| {
        index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {index}"))
            .clone()
    };
    let top = tagged("test");
    assert_eq!(top["mediaType"], "application/vnd.oci.image.index.v1+json");
    let digest = top["digest"].as_str().unwrap().to_string();
    let blob = std::fs::read(
        layout
            .join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap()),
    )
    .unwrap();
    assert_eq!(top["size"], blob.len(), "the index descriptor's size");
    let image_index: serde_json::Value = serde_json::from_slice(&blob).unwrap();
    let platforms: Vec<String> = image_index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap(),
                m["platform"]["architecture"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    for (i, arch) in ["amd64", "arm64"].iter().enumerate() {
        assert_eq!(
            image_index["manifests"][i]["digest"],
            tagged(&format!("test-{arch}"))["digest"],
            "the index's {arch} manifest is the one tagged test-{arch}"
        );
    }
    digest
}

fn version_line(out: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.trim().to_string()
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
        "qemu-aarch64",
    ]);
    let arm64 = aarch64_qr();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let first = build(&d.join("image-a"), &arm64);
    let second = build(&d.join("image-b"), &arm64);
    assert_eq!(
        first, second,
        "two builds of the same binaries, one index digest"
    );
    let ours = version_line(
        &Command::new(env!("CARGO_BIN_EXE_qr"))
            .arg("--version")
            .output()
            .unwrap(),
        "qr --version",
    );

    // The arm64 image runs: its own loader and libraries, under qemu.
    run(Command::new("umoci").args([
        "unpack",
        "--rootless",
        "--image",
        &format!("{}:test-arm64", d.join("image-a").display()),
        &d.join("arm64").display().to_string(),
    ]));
    let rootfs = d.join("arm64/rootfs");
    let arm_out = Command::new("qemu-aarch64")
        .arg("-L")
        .arg(&rootfs)
        .arg(rootfs.join("usr/local/bin/qr"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        version_line(&arm_out, "qemu-aarch64 (arm64 image) qr --version"),
        ours,
        "the arm64 image's qr is this build (a stale {}? rebuild it at this revision)",
        arm64.display()
    );

    let registry = Registry::start(d, UPSTREAM);
    // Every platform of the index.
    run(Command::new("skopeo").args([
        "copy",
        "--all",
        "--dest-tls-verify=false",
        &format!("oci:{}:test", d.join("image-a").display()),
        &format!("docker://{UPSTREAM}/{REPO}:test"),
    ]));
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
    assert_eq!(version_line(&out, "ctr run"), ours);
}
