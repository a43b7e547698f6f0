//! `qr gateway to-fabric` on a real Ethernet path: an independent QUIC client
//! (aioquic, Python, over plain UDP) in one network namespace reaches `qr
//! serve` in another across a veth pair of MTU 1500, through the gateway.
//!
//! In the server's namespace, `qr serve` and the gateway's fabric side (both
//! `soft`) sit on a second veth pair whose MTU sets the RoCE MTU the way kernel
//! rxe does: 1500 → 1024 (QUIC datagrams segmented), 3000 → 2048, 9000 → 4096.
//! aioquic does not send `max_udp_payload_size`, so a server that assumed the
//! fabric's MTU for it would send datagrams the UDP path cannot carry; `qr
//! serve --udp-gateway` starts such clients at 1200 bytes and discovers the
//! path MTU (RFC 8899), and the gateway never fragments (RFC 9000 §14): a
//! packet capture on the 1500-byte link holds no IP fragment, and every
//! datagram the gateway sends has DF set.
//!
//! Needs root, iproute2, tshark and python3 (CI installs them); aioquic is
//! installed into a venv by `.ci/run` (`QR_AIOQUIC_PYTHON`) or, without it,
//! by this test. All traffic stays inside the namespaces it creates.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{require_root_and, wait_for_file, Guard, NetnsPair, TempDir};
use quic_rdma_tools::metric::sample;
use serde_json::Value;

/// The aioquic release the client is written against.
const AIOQUIC: &str = "aioquic==1.7.2";

/// A python with aioquic: `QR_AIOQUIC_PYTHON`, else a venv this test makes.
fn aioquic_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("QR_AIOQUIC_PYTHON") {
            return PathBuf::from(p);
        }
        let venv = std::env::temp_dir().join("qr-aioquic-venv");
        let py = venv.join("bin/python");
        let has = |py: &Path| {
            Command::new(py)
                .args(["-c", "import aioquic"])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !has(&py) {
            common::sh(&["python3", "-m", "venv", venv.to_str().unwrap()]);
            let pip = venv.join("bin/pip");
            common::sh(&[pip.to_str().unwrap(), "install", "--quiet", AIOQUIC]);
        }
        assert!(has(&py), "aioquic did not install into {}", venv.display());
        py
    })
}

/// `qr serve` and `qr gateway to-fabric` in namespace `a`, the client's
/// side in `b`.
struct Site {
    // Dropped in this order: the processes before their namespaces.
    serve: Option<Guard>,
    gateway: Option<Guard>,
    dir: TempDir,
    cert: PathBuf,
    net: u8,
    ns: NetnsPair,
}

const SERVE_IP: &str = "10.{}.1.1";
const GATEWAY_FABRIC_IP: &str = "10.{}.1.2";
const UDP_PORT: u16 = 4433;
const METRICS_PORT: u16 = 9464;

fn addr(template: &str, net: u8) -> String {
    template.replace("{}", &net.to_string())
}

impl Site {
    /// `fabric_link_mtu`: the MTU of the veth pair the fabric runs on (its
    /// RoCE MTU follows); `gateway_mtu`: `--fabric-mtu`; `udp_gateway`:
    /// whether `qr serve` is told the gateway's fabric IP.
    fn new(net: u8, fabric_link_mtu: u32, gateway_mtu: u32, udp_gateway: bool) -> Site {
        require_root_and(&["ip", "tshark", "python3"]);
        let ns = NetnsPair::with_mtu(net, 1500);
        let (serve_ip, gw_ip) = (addr(SERVE_IP, net), addr(GATEWAY_FABRIC_IP, net));
        let ip = |args: &[&str]| {
            let mut v = vec!["ip", "-n", ns.a.as_str()];
            v.extend_from_slice(args);
            common::sh(&v);
        };
        // Deleted with namespace `a`.
        ip(&[
            "link", "add", "qrf1", "type", "veth", "peer", "name", "qrf2",
        ]);
        for (dev, a) in [("qrf1", &serve_ip), ("qrf2", &gw_ip)] {
            ip(&["link", "set", dev, "mtu", &fabric_link_mtu.to_string()]);
            ip(&["addr", "add", &format!("{a}/24"), "dev", dev]);
            ip(&["link", "set", dev, "up"]);
        }
        let dir = TempDir::new("gw-udp-path");
        let cert = dir.path("serve.der");
        let mut serve = vec![
            "serve",
            "--ip",
            &serve_ip,
            "--name",
            "localhost",
            "--cert-out",
            cert.to_str().unwrap(),
        ];
        if udp_gateway {
            serve.extend(["--udp-gateway", &gw_ip]);
        }
        let serve = Guard::spawn(&mut ns.qr(&ns.a, &serve));
        wait_for_file(&cert, Duration::from_secs(20));
        let listen = format!("{}:{UDP_PORT}", ns.v4[0]);
        let metrics = format!("{gw_ip}:{METRICS_PORT}");
        let gateway = Guard::spawn(&mut ns.qr(
            &ns.a,
            &[
                "gateway",
                "to-fabric",
                "--listen",
                &listen,
                "--fabric-ip",
                &gw_ip,
                "--fabric-mtu",
                &gateway_mtu.to_string(),
                "--target",
                &format!("{serve_ip}:18515"),
                "--metrics",
                &metrics,
            ],
        ));
        let site = Site {
            serve: Some(serve),
            gateway: Some(gateway),
            dir,
            cert,
            net,
            ns,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while site.try_scrape().is_none() {
            assert!(
                Instant::now() < deadline,
                "the gateway's metrics never came up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        site
    }

    /// The gateway's /metrics, read from inside its namespace.
    fn try_scrape(&self) -> Option<String> {
        let url = format!(
            "http://{}:{METRICS_PORT}/metrics",
            addr(GATEWAY_FABRIC_IP, self.net)
        );
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns.a, "python3", "-c"])
            .arg(format!(
                "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('{url}', timeout=5).read().decode())"
            ))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn gateway_metric(&self, name: &str) -> f64 {
        let text = self.try_scrape().expect("the gateway's metrics");
        sample(&text, &format!("qr_gateway_{name}"))
            .unwrap_or_else(|| panic!("qr_gateway_{name} missing:\n{text}"))
    }

    /// Run `clients` aioquic clients at once, each sending `bytes`, within
    /// `limit`: their JSON lines and the exit status.
    fn aioquic(&self, bytes: u64, clients: u32, limit: Duration) -> (Vec<Value>, Output) {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway_support/aioquic_client.py");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns.b, "timeout"])
            .arg(limit.as_secs().to_string())
            .arg(aioquic_python())
            .arg(script)
            .args([&self.ns.v4[0], &UDP_PORT.to_string()])
            .arg(&self.cert)
            .args([bytes.to_string(), clients.to_string()])
            .output()
            .unwrap();
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (lines, out)
    }

    /// Start a capture of the UDP traffic on the 1500-byte link (headers only).
    fn capture(&self) -> Capture {
        let pcap = self.dir.path("udp.pcapng");
        let guard = Guard::spawn(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.ns.a,
                    "tshark",
                    "-i",
                    &self.ns.devs[0],
                ])
                .args(["-s", "96", "-f", "udp", "-w"])
                .arg(&pcap),
        );
        // tshark writes the file's header once it captures.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(&pcap).map_or(true, |m| m.len() == 0) {
            assert!(Instant::now() < deadline, "tshark did not start capturing");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        Capture { guard, pcap }
    }

    /// Stop both processes; what each wrote.
    fn stop(mut self) -> (Output, Output) {
        let serve = self.serve.take().unwrap().kill_output();
        let gateway = self.gateway.take().unwrap().kill_output();
        (serve, gateway)
    }
}

struct Capture {
    guard: Guard,
    pcap: PathBuf,
}

impl Capture {
    /// Stop it (SIGINT, so it flushes) and count the packets matching each
    /// display filter.
    fn count(self, filters: &[&str]) -> Vec<usize> {
        let pid = self.guard.id().to_string();
        common::sh(&["kill", "-INT", &pid]);
        self.guard.wait(Duration::from_secs(20));
        filters
            .iter()
            .map(|f| {
                let out = Command::new("tshark")
                    .args(["-r"])
                    .arg(&self.pcap)
                    .args(["-Y", f])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "tshark -Y {f}: {out:?}");
                String::from_utf8_lossy(&out.stdout).lines().count()
            })
            .collect()
    }
}

fn all_ok(what: &str, lines: &[Value], out: &Output, clients: usize) {
    assert!(
        out.status.success() && lines.len() == clients,
        "{what}: {} of {clients} clients reported, exit {:?}\nstdout:\n{}\nstderr:\n{}",
        lines.len(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for l in lines {
        assert_eq!(l["ok"], true, "{what}: {l}");
        assert_eq!(l["sha256_sent"], l["sha256_server"], "{what}: {l}");
    }
}

/// 32 MiB from aioquic at each fabric MTU: sha256 equal at both ends, no IP
/// fragment on the 1500-byte link, DF on every datagram the gateway sends.
#[test]
fn aioquic_through_the_gateway_at_fabric_mtu_1024_2048_4096() {
    const BYTES: u64 = 32 << 20;
    for (net, link_mtu, mtu) in [(204u8, 1500, 1024), (205, 3000, 2048), (206, 9000, 4096)] {
        let t = Instant::now();
        let site = Site::new(net, link_mtu, mtu, true);
        let capture = site.capture();
        let (lines, out) = site.aioquic(BYTES, 1, Duration::from_secs(120));
        let gw = &site.ns.v4[0];
        let [udp, fragments, gateway_sent, no_df] = capture.count(&[
            "udp",
            "ip.flags.mf == 1 || ip.frag_offset > 0",
            &format!("udp && ip.src == {gw}"),
            &format!("ip.src == {gw} && ip.flags.df == 0"),
        ])[..] else {
            unreachable!()
        };
        all_ok(&format!("fabric MTU {mtu}"), &lines, &out, 1);
        let too_big = site.gateway_metric("drop_udp_too_big_total");
        let admitted = site.gateway_metric("clients_admitted_total");
        let sent = lines[0]["sha256_sent"].as_str().unwrap().to_string();
        let (serve, gateway) = site.stop();
        let serve_out = String::from_utf8_lossy(&serve.stdout);
        eprintln!(
            "fabric MTU {mtu}: {}; {udp} UDP packets captured, {gateway_sent} from the \
             gateway, {fragments} fragments; {too_big} datagrams too big for the UDP path \
             (path MTU probes); {:.1} s",
            lines[0],
            t.elapsed().as_secs_f64()
        );
        // What the server hashed is what the client sent (the client compared
        // the verdict too; this is the server's own line).
        assert!(
            serve_out.contains(&format!("received {BYTES} bytes, sha256 {sent}")),
            "qr serve's summary:\n{serve_out}\n{}",
            String::from_utf8_lossy(&serve.stderr)
        );
        assert!(udp > 20_000, "the capture saw {udp} UDP packets");
        assert!(
            gateway_sent > 1_000,
            "{gateway_sent} packets from the gateway"
        );
        assert_eq!(fragments, 0, "IP fragments on the 1500-byte link");
        assert_eq!(no_df, 0, "gateway datagrams without DF");
        assert_eq!(admitted, 1.0);
        let log = String::from_utf8_lossy(&gateway.stderr);
        assert!(!log.contains("handshake datagram is larger"), "{log}");
    }
}

/// 50 aioquic clients at once through one gateway at MTU 1024, every timer
/// at its default: all finish with sha256 equal.
#[test]
fn fifty_aioquic_clients_at_once_with_default_timeouts() {
    let site = Site::new(207, 1500, 1024, true);
    let (lines, out) = site.aioquic(1 << 20, 50, Duration::from_secs(180));
    all_ok("50 clients", &lines, &out, 50);
    let validated = site.gateway_metric("clients_validated_total");
    let kernel = site.gateway_metric("udp_kernel_drops_total");
    let (serve, _) = site.stop();
    let served = String::from_utf8_lossy(&serve.stdout)
        .matches("received 1048576 bytes")
        .count();
    eprintln!("50 clients: {validated} validated, {kernel} kernel drops, {served} served");
    assert_eq!(validated, 50.0);
    assert_eq!(served, 50);
}

/// A server not told of the gateway sends aioquic fabric-sized handshake
/// datagrams: the gateway drops them rather than fragmenting, counts them and
/// says which flag fixes it.
#[test]
fn a_server_not_told_of_the_gateway_is_named_with_the_fix() {
    let site = Site::new(208, 1500, 1024, false);
    let capture = site.capture();
    let (lines, out) = site.aioquic(1 << 20, 1, Duration::from_secs(8));
    let [fragments] = capture.count(&["ip.flags.mf == 1 || ip.frag_offset > 0"])[..] else {
        unreachable!()
    };
    assert!(
        !out.status.success(),
        "the handshake cannot finish: {lines:?}"
    );
    let too_big = site.gateway_metric("drop_udp_too_big_total");
    let (_, gateway) = site.stop();
    let log = String::from_utf8_lossy(&gateway.stderr);
    assert!(too_big >= 1.0, "drop_udp_too_big_total {too_big}");
    assert_eq!(fragments, 0);
    assert!(
        log.contains("handshake datagram is larger than the UDP path")
            && log.contains("--udp-gateway"),
        "{log}"
    );
}
