//! Shared by the image_* tests: the real parts from Debian (docker-registry,
//! umoci, skopeo) and `qr` agents as child processes, each killed on drop.
//! Every test file passes its own 127.0.111.x addresses and TCP ports.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// A child process killed (and reaped) on drop.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) name: String,
}

impl Proc {
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a program is on PATH (CI installs them; a developer may not have).
pub(crate) fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Every program of `progs` must be on PATH: `.ci/run` installs them (a
/// skipped test is not a passed one).
pub(crate) fn require(progs: &[&str]) {
    for p in progs {
        let package = match *p {
            "ctr" => "containerd",
            "qemu-aarch64" => "qemu-user",
            other => other,
        };
        assert!(
            have(p),
            "{p} is not installed (.ci/run installs it: apt-get install {package})"
        );
    }
}

/// Run a command to completion, panicking with its output if it fails.
pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_tcp(addr: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{addr} did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// docker-registry on `addr` with storage and access log under `dir`.
pub(crate) struct Registry {
    pub(crate) proc: Proc,
    pub(crate) addr: String,
    pub(crate) storage: PathBuf,
    pub(crate) log: PathBuf,
}

impl Registry {
    pub(crate) fn start(dir: &Path, addr: &str) -> Registry {
        Registry::start_with(dir, addr, "", "")
    }

    /// As [`Registry::start`], with YAML added under `http:` (e.g. `tls:`,
    /// indented two spaces) and at the top level (e.g. `auth:`).
    pub(crate) fn start_with(dir: &Path, addr: &str, http: &str, top: &str) -> Registry {
        std::fs::create_dir_all(dir).unwrap();
        let storage = dir.join("registry-storage");
        std::fs::create_dir_all(&storage).unwrap();
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  redirect:\n    disable: true\n\
                 {top}http:\n  addr: {addr}\n{http}",
                storage.display()
            ),
        )
        .unwrap();
        let log = dir.join("registry.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::fs::File::create(dir.join("registry.out")).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("docker-registry (apt-get install docker-registry)");
        let proc = Proc {
            child,
            name: "docker-registry".into(),
        };
        wait_tcp(addr, Duration::from_secs(20));
        Registry {
            proc,
            addr: addr.into(),
            storage,
            log,
        }
    }

    /// GET requests for blob `digest` the registry answered (its request log).
    pub(crate) fn blob_gets(&self, digest: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                // One logrus line per request answered.
                l.contains("msg=\"response completed")
                    && l.contains("http.request.method=GET ")
                    && l.contains(&format!("/blobs/{digest}\""))
            })
            .count()
    }

    /// The registry's data file of a blob.
    pub(crate) fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

/// Build an OCI image with umoci in `dir/layout:TAG`, one layer per entry of
/// `layers` (size in bytes of random, incompressible data).
pub(crate) fn build_image(dir: &Path, tag: &str, layers: &[usize]) -> PathBuf {
    let layout = dir.join("layout");
    let img = format!("{}:{tag}", layout.display());
    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &img]));
    for (i, size) in layers.iter().enumerate() {
        let f = dir.join(format!("layer{i}.bin"));
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("head -c {size} /dev/urandom > {}", f.display())));
        run(Command::new("umoci")
            .args(["insert", "--rootless", "--image", &img])
            .arg(&f)
            .arg(format!("/layer{i}.bin")));
        std::fs::remove_file(&f).unwrap();
    }
    layout
}

/// `skopeo copy oci:LAYOUT:TAG docker://REGISTRY/REPO:TAG` (plain HTTP).
pub(crate) fn push(layout: &Path, tag: &str, registry: &str, repo: &str) {
    run(Command::new("skopeo").args([
        "copy",
        "--dest-tls-verify=false",
        &format!("oci:{}:{tag}", layout.display()),
        &format!("docker://{registry}/{repo}:{tag}"),
    ]));
}

/// `skopeo copy docker://FROM/REPO:TAG oci:DEST:TAG` (plain HTTP).
pub(crate) fn pull(from: &str, repo: &str, tag: &str, dest: &Path) -> std::process::Output {
    Command::new("skopeo")
        .args([
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{from}/{repo}:{tag}"),
            &format!("oci:{}:{tag}", dest.display()),
        ])
        .output()
        .unwrap()
}

/// sha256 of a file, `sha256:hex`.
pub(crate) fn sha256_file(p: &Path) -> String {
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Every blob digest of an OCI layout (index → manifests → config, layers),
/// each file checked to hash to its name.
pub(crate) fn layout_digests(layout: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    let mut todo: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["digest"].as_str().unwrap().to_string())
        .collect();
    while let Some(d) = todo.pop() {
        let p = layout
            .join("blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap());
        assert_eq!(
            sha256_file(&p),
            d,
            "{} does not hash to its name",
            p.display()
        );
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap_or_default();
        if let Some(ms) = v["manifests"].as_array() {
            todo.extend(ms.iter().map(|m| m["digest"].as_str().unwrap().to_string()));
        }
        if let Some(c) = v["config"]["digest"].as_str() {
            out.push(c.to_string());
        }
        if let Some(ls) = v["layers"].as_array() {
            out.extend(ls.iter().map(|l| l["digest"].as_str().unwrap().to_string()));
        }
        out.push(d);
    }
    out.sort();
    out
}

/// The layer digests and sizes of the manifest tagged `tag` in an OCI layout.
pub(crate) fn layers(layout: &Path, tag: &str) -> Vec<(String, u64)> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let m = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap();
    let d = m["digest"].as_str().unwrap();
    let p = layout
        .join("blobs/sha256")
        .join(d.strip_prefix("sha256:").unwrap());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().unwrap().to_string(),
                l["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Development certificates: `registry` valid for `registry_ip`, `node`.
pub(crate) fn pki(dir: &Path, registry_ip: &str) -> PathBuf {
    let p = dir.join("pki");
    let out = run(Command::new(env!("CARGO_BIN_EXE_qr"))
        .args(["cert", "--dir"])
        .arg(&p)
        .args([
            "--leaf",
            &format!("registry={registry_ip}"),
            "--leaf",
            "node=node",
        ]));
    assert!(out.contains("ca.pem"), "{out}");
    p
}

/// Start `qr ARGS`, wait for its "ready" line on stdout (within 30 s).
pub(crate) fn qr(name: &str, args: &[String], log: &Path) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qr"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Owned here: a panic while waiting kills it on unwinding.
    let mut proc = Proc {
        child,
        name: name.into(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let log_text = || std::fs::read_to_string(log).unwrap_or_default();
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) if l.contains("ready") => return proc,
            Ok(_) => {}
            Err(_) => {
                if let Ok(Some(st)) = proc.child.try_wait() {
                    panic!("{name} exited with {st}: {}", log_text());
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} not ready after 30 s: {}",
                    log_text()
                );
            }
        }
    }
}

/// Arguments of a registry agent.
pub(crate) fn registry_agent_args(
    pki: &Path,
    ip: &str,
    service_port: u16,
    upstream: &str,
    cache: &Path,
    metrics: &str,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "registry-agent".into(),
        "--upstream".into(),
        format!("http://{upstream}"),
        "--ip".into(),
        ip.into(),
        "--service-port".into(),
        service_port.to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--metrics".into(),
        metrics.into(),
    ];
    a.extend(tls_args(pki, "registry"));
    a
}

/// Arguments of a registry agent that serves OCI image layout `layout` as
/// repository `repo` instead of an upstream registry (no docker-registry).
pub(crate) fn layout_registry_agent_args(
    pki: &Path,
    ip: &str,
    service_port: u16,
    layout: &Path,
    repo: &str,
    cache: &Path,
    metrics: &str,
) -> Vec<String> {
    let mut a = registry_agent_args(pki, ip, service_port, "unused", cache, metrics);
    let up = a.iter().position(|x| x == "--upstream").unwrap();
    a.splice(
        up..up + 2,
        [
            "--layout".into(),
            layout.display().to_string(),
            "--layout-repository".into(),
            repo.into(),
        ],
    );
    a
}

/// Arguments of a node agent.
pub(crate) fn node_agent_args(
    pki: &Path,
    ip: &str,
    registry: &str,
    listen: &str,
    cache: &Path,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "node-agent".into(),
        "--registry".into(),
        registry.into(),
        "--ip".into(),
        ip.into(),
        "--listen".into(),
        listen.into(),
        "--cache-dir".into(),
        cache.display().to_string(),
    ];
    a.extend(tls_args(pki, "node"));
    a
}

fn tls_args(pki: &Path, name: &str) -> Vec<String> {
    vec![
        "--cert".into(),
        pki.join(format!("{name}.pem")).display().to_string(),
        "--key".into(),
        pki.join(format!("{name}-key.pem")).display().to_string(),
        "--ca".into(),
        pki.join("ca.pem").display().to_string(),
    ]
}

/// Status, headers and body of an HTTP answer.
pub(crate) type Got = (u16, Vec<(String, String)>, Vec<u8>);

/// GET http://ADDR/PATH as a client that retries a response cut short
/// (as every OCI client does): status, headers, body, and how many
/// responses were cut short first.
pub(crate) fn http_get_retrying(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>, usize) {
    for cut in 0..3 {
        match http_get_result(addr, path, headers) {
            Ok((st, hs, body)) => return (st, hs, body, cut),
            Err(e) => eprintln!("GET {path}: {e}; retrying"),
        }
    }
    panic!("GET {addr}{path}: cut short three times");
}

/// GET http://ADDR/PATH with extra headers; status, headers, body.
pub(crate) fn http_get(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    http_get_result(addr, path, headers).unwrap()
}

/// [`http_get`], a body cut short an error.
pub(crate) fn http_get_result(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Got, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = reqwest::Client::new();
        let mut r = c.get(format!("http://{addr}{path}"));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let r = tokio::time::timeout(Duration::from_secs(120), r.send())
            .await
            .unwrap()
            .unwrap();
        let status = r.status().as_u16();
        let hs = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let body = r.bytes().await.map_err(|e| format!("{e:?}"))?;
        Ok((status, hs, body.to_vec()))
    })
}

/// One header's value.
pub(crate) fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A containerd daemon of the test's own (root, state and socket under `d`,
/// no CRI plugin), ready; and its socket.
pub(crate) fn containerd(d: &Path) -> (Proc, String) {
    std::fs::create_dir_all(d).unwrap();
    let sock = d.join("containerd.sock").display().to_string();
    let config = d.join("containerd.toml");
    std::fs::write(
        &config,
        format!(
            "version = 2\nroot = \"{}\"\nstate = \"{}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
            d.join("root").display(),
            d.join("state").display()
        ),
    )
    .unwrap();
    let child = Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("containerd.log")).unwrap())
        .spawn()
        .expect("containerd (apt-get install containerd)");
    let proc = Proc {
        child,
        name: "containerd".into(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = Command::new("ctr")
            .args(["--address", &sock, "version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containerd did not start: {}",
            std::fs::read_to_string(d.join("containerd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (proc, sock)
}

/// A containerd of the test's own whose registries are mirrored by a node
/// agent (one `hosts.toml` each, as an operator writes them), so its
/// requests carry `?ns=HOST`.
pub(crate) struct Containerd {
    _proc: Proc,
    sock: String,
    hosts: PathBuf,
}

impl Containerd {
    /// Start it under `d`, mirroring each `(registry host, its scheme)` of
    /// `registries` with the node agent at `node` (HOST:PORT, plain HTTP).
    pub(crate) fn start(d: &Path, node: &str, registries: &[(&str, &str)]) -> Containerd {
        let hosts = d.join("hosts");
        for (host, scheme) in registries {
            std::fs::create_dir_all(hosts.join(host)).unwrap();
            std::fs::write(
                hosts.join(host).join("hosts.toml"),
                format!(
                    "server = \"{scheme}://{host}\"\n\n[host.\"http://{node}\"]\n  \
                     capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )
            .unwrap();
        }
        let (proc, sock) = containerd(&d.join("containerd"));
        Containerd {
            _proc: proc,
            sock,
            hosts,
        }
    }

    /// `ctr ARGS` against it (namespace `qrtest`).
    pub(crate) fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.args(["--address", &self.sock, "--namespace", "qrtest"])
            .args(args);
        c
    }

    /// `ctr images pull` of `image` through the mirrors (`log`, the agent log
    /// to show if it fails), then `ctr images check` must call it complete.
    pub(crate) fn pull(&self, image: &str, log: &Path) {
        let hosts = self.hosts.display().to_string();
        let args = [
            "images",
            "pull",
            "--hosts-dir",
            &hosts,
            "--snapshotter",
            "native",
            image,
        ];
        let out = self.ctr(&args).output().unwrap();
        assert!(
            out.status.success(),
            "ctr pull {image}: {}{}\n{}: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            log.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        let check = run(&mut self.ctr(&["images", "check"]));
        let line = check
            .lines()
            .find(|l| l.contains(image))
            .unwrap_or_else(|| panic!("{check}"));
        assert!(line.contains("complete"), "{check}");
    }

    /// The digests in its content store, sorted.
    pub(crate) fn content(&self) -> Vec<String> {
        let content = run(&mut self.ctr(&["content", "ls", "--quiet"]));
        let mut got: Vec<String> = content
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        got.sort();
        got
    }
}

/// An OCI image layout written by [`write_layout`].
pub(crate) struct Layout {
    /// The layout's directory.
    pub(crate) dir: PathBuf,
    /// Each layer's digest and bytes.
    pub(crate) layers: Vec<(quic_rdma_tools::image::digest::Digest, Vec<u8>)>,
    /// Every blob's digest and size, the config first.
    pub(crate) blobs: Vec<(String, u64)>,
    /// The manifest's size in bytes.
    pub(crate) manifest_len: u64,
}

/// An OCI image layout (image-spec "Image Layout") in `dir`, tagged `tag`,
/// with one random layer per size.
pub(crate) fn write_layout(dir: &Path, tag: &str, sizes: &[usize]) -> Layout {
    use quic_rdma_tools::image::digest::Digest as BlobDigest;
    use rand::RngCore;
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| {
        let d = BlobDigest::of(data);
        std::fs::write(blobs.join(d.hex()), data).unwrap();
        serde_json::json!({"digest": d.to_string(), "size": data.len()})
    };
    let mut descriptors = Vec::new();
    let mut layers = Vec::new();
    for &n in sizes {
        let mut data = vec![0u8; n];
        rand::thread_rng().fill_bytes(&mut data);
        let mut l = put(&data);
        l["mediaType"] = "application/vnd.oci.image.layer.v1.tar".into();
        descriptors.push(l);
        layers.push((BlobDigest::of(&data), data));
    }
    let mut config =
        put(br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#);
    config["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": descriptors,
    })
    .to_string();
    let mut m = put(manifest.as_bytes());
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
    m["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
    std::fs::write(
        dir.join("index.json"),
        serde_json::json!({"schemaVersion": 2, "manifests": [m]}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let blobs = std::iter::once(&config)
        .chain(descriptors.iter())
        .map(|b| {
            (
                b["digest"].as_str().unwrap().to_string(),
                b["size"].as_u64().unwrap(),
            )
        })
        .collect();
    Layout {
        dir: dir.to_path_buf(),
        layers,
        blobs,
        manifest_len: manifest.len() as u64,
    }
}
