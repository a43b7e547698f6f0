//! The `image` workload: one blob, in every repeat and one after
//! another,
//! 1. **direct**: an HTTPS GET from docker-registry (TLS on the registry,
//!    as in production) over TCP loopback (curl, the registry's CA trusted);
//! 2. **raw**: the same byte count over one QUIC stream over `soft`, client
//!    and server in two processes (the `quinn-adapter/soft` row, the stack
//!    the agents use, run as [`crate::procs::bulk_in_processes`]);
//! 3. **agents, cold**: an HTTP GET from a fresh `qr node-agent` that fetches
//!    the blob over `soft` from a fresh `qr registry-agent`, which pulls it
//!    through from docker-registry (over HTTPS) at the same time;
//! 4. **agents, warm**: the same with the registry agent's cache already
//!    holding the blob (a fresh node agent with an empty cache).
//!
//! Every GET's body is sha256-hashed as it arrives (curl → pipe → this
//! process, nothing written to disk) and compared with the blob's digest.
//! The agents are separate processes; their user+sys CPU over each GET is read
//! from `/proc/PID/stat`. The node agent streams the blob as it arrives
//! (cut-through, `tools/src/image/inflight.rs`), so curl's time to first
//! byte is the first chunk's trip (not the whole transfer, as before), and
//! its total is the transfer whose last byte waited for the whole blob's
//! verification and cache commit.
//!
//! Addresses: 127.0.140.x, ports 19900–19949 (this workload's block).

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::cpu::CpuUsed;
use crate::rows::{BulkOutcome, BulkParams, Row};

/// docker-registry's HTTPS address.
const REGISTRY: &str = "127.0.140.1:19900";
/// Its IP, the name its certificate is issued for.
const REGISTRY_IP: &str = "127.0.140.1";
/// The registry agent's fabric IP and bootstrap service port.
const AGENT_IP: &str = "127.0.140.2";
const AGENT_SERVICE_PORT: &str = "19901";
/// The registry agent's metrics address (polled to know it is up).
const AGENT_METRICS: &str = "127.0.140.2:19903";
/// The node agent's fabric IP and HTTP listen address.
const NODE_IP: &str = "127.0.140.3";
const NODE_LISTEN: &str = "127.0.140.3:19902";
/// The repository the blob is pushed to.
const REPO: &str = "bench/blob";
/// How long a process may take to start listening.
const START_WAIT: Duration = Duration::from_secs(30);

/// One HTTP GET of the blob, as curl timed it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct HttpGet {
    /// Seconds to the first body byte.
    pub first_byte_s: f64,
    /// Seconds to the last body byte.
    pub total_s: f64,
    /// The body's sha256 equals the blob's digest (and its length the blob's).
    pub sha256_ok: bool,
    /// curl's CPU over the GET (TLS, for the direct GET; plain HTTP from the
    /// node agent).
    #[serde(default)]
    pub curl_cpu: CpuUsed,
    /// docker-registry's CPU over the GET: serving it (direct), serving the
    /// registry agent's pull-through (cold), nothing (warm).
    #[serde(default)]
    pub registry_cpu: CpuUsed,
    /// This harness's CPU reading and hashing curl's output (the sha256 check
    /// every client of a registry does; the same on every path).
    #[serde(default)]
    pub verify_cpu: CpuUsed,
}

/// One GET through the agents.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct AgentsGet {
    /// The GET from the node agent.
    pub get: HttpGet,
    /// The registry agent process's CPU over the GET.
    pub registry_agent_cpu: CpuUsed,
    /// The node agent process's CPU over the GET.
    pub node_agent_cpu: CpuUsed,
    /// ... of which before the first body byte arrived here (fetching over
    /// the fabric, verifying and caching; the rest is serving over HTTP).
    pub node_agent_cpu_first_byte: CpuUsed,
}

/// Every cell of one repeat.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageRepeat {
    /// From docker-registry directly.
    pub direct: HttpGet,
    /// One QUIC stream over `soft`, two processes.
    pub raw: BulkOutcome,
    /// Through the agents, the registry agent pulling through.
    pub cold: AgentsGet,
    /// Through the agents, the registry agent's cache warm.
    pub warm: AgentsGet,
    /// 1/5/15-minute load averages when the repeat ended.
    pub load: [f64; 3],
}

/// What the workload measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageReport {
    /// Blob size in bytes.
    pub bytes: u64,
    /// The row the raw cell ran.
    pub raw_row: String,
    /// Every repeat that completed.
    pub runs: Vec<ImageRepeat>,
    /// Repeats that failed, with why.
    pub errors: Vec<String>,
    /// CPUs the processes could use (the CPU-bound ceilings' core count).
    #[serde(default)]
    pub cpus: usize,
}

/// A child process killed when dropped.
struct Proc {
    child: Child,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: &Path) -> anyhow::Result<Proc> {
        let err = std::fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(err.try_clone()?)
            .stderr(err)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {:?}: {e}", cmd.get_program()))?;
        Ok(Proc { child })
    }

    /// User and system CPU the process has used so far.
    fn cpu(&self) -> anyhow::Result<CpuUsed> {
        crate::cpu::process_cpu(self.child.id())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU used between two readings.
fn delta(a: CpuUsed, b: CpuUsed) -> CpuUsed {
    CpuUsed {
        user_s: b.user_s - a.user_s,
        sys_s: b.sys_s - a.sys_s,
    }
}

/// docker-registry holding the blob, the `qr` binary and the agents' PKI.
pub struct ImageBench {
    dir: PathBuf,
    qr: PathBuf,
    bytes: u64,
    /// Extra arguments of every `qr node-agent` (`--parallel 4`, ...).
    node_args: Vec<String>,
    digest: String,
    registry: Proc,
}

impl Drop for ImageBench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// curl's options to trust docker-registry's CA (the bench's temp dir holds
/// it) for an https URL; none for http.
fn curl_tls(url: &str) -> Vec<String> {
    if !url.starts_with("https://") {
        return Vec::new();
    }
    vec!["--cacert".into(), registry_ca().display().to_string()]
}

/// docker-registry's CA certificate (its own, not the agents').
fn registry_ca() -> PathBuf {
    bench_dir().join("registry-pki/ca.pem")
}

/// This run's working directory (the registry's storage and CA, the PKI,
/// the agents' caches).
fn bench_dir() -> PathBuf {
    std::env::temp_dir().join(format!("compare-image-{}", std::process::id()))
}

/// Run `cmd` to completion, failing with its stderr.
fn run(cmd: &mut Command) -> anyhow::Result<Vec<u8>> {
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("{:?}: {e}", cmd.get_program()))?;
    anyhow::ensure!(
        out.status.success(),
        "{:?} failed ({}): {}",
        cmd.get_program(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Wait until `url` answers 2xx (an https URL: the registry's, with its CA).
fn wait_http(url: &str, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_WAIT;
    loop {
        let ok = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", url])
            .args(curl_tls(url))
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not answer {url}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl ImageBench {
    /// Start docker-registry, push a `bytes`-byte blob (the harness's payload
    /// pattern) and issue the agents' certificates; `node_args` are passed
    /// to every node agent.
    pub fn start(bytes: u64, node_args: Vec<String>) -> anyhow::Result<ImageBench> {
        let qr = match std::env::var_os("QR") {
            Some(p) => PathBuf::from(p),
            None => crate::procs::sibling_exe("qr").map_err(|e| {
                e.context("the image workload runs `qr`: cargo build --release -p quic-rdma-tools")
            })?,
        };
        let dir = bench_dir();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        // The agents' PKI, and the registry's own certificate from another CA.
        let pki = dir.join("pki");
        let upki = dir.join("registry-pki");
        run(Command::new(&qr).arg("cert").arg("--dir").arg(&pki).args([
            "--leaf",
            &format!("registry={AGENT_IP}"),
            "--leaf",
            "node=node",
        ]))?;
        run(Command::new(&qr)
            .arg("cert")
            .arg("--dir")
            .arg(&upki)
            .args(["--leaf", &format!("upstream={REGISTRY_IP}")]))?;
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {}}}, \
                 redirect: {{disable: true}}}}\nhttp: {{addr: {REGISTRY}, tls: {{certificate: {}, \
                 key: {}}}}}\n",
                dir.join("storage").display(),
                upki.join("upstream.pem").display(),
                upki.join("upstream-key.pem").display(),
            ),
        )?;
        let registry = Proc::spawn(
            Command::new("docker-registry").arg("serve").arg(&config),
            &dir.join("registry.log"),
        )
        .map_err(|e| e.context("apt-get install docker-registry"))?;
        let mut bench = ImageBench {
            dir,
            qr,
            bytes,
            node_args,
            digest: String::new(),
            registry,
        };
        wait_http(&bench.registry_url("/v2/"), "docker-registry")?;
        bench.digest = bench.push()?;
        Ok(bench)
    }

    /// `https://REGISTRY{path}`.
    fn registry_url(&self, path: &str) -> String {
        format!("https://{REGISTRY}{path}")
    }

    /// The blob's size.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Write the blob, upload it (monolithic: POST, then PUT with the digest).
    fn push(&self) -> anyhow::Result<String> {
        let file = self.dir.join("blob");
        let pattern = crate::data::pattern();
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file)?);
        let mut off = 0u64;
        while off < self.bytes {
            let s = crate::data::slice_at(&pattern, off, (self.bytes - off) as usize);
            f.write_all(s)?;
            off += s.len() as u64;
        }
        f.flush()?;
        drop(f);
        let digest = format!(
            "sha256:{}",
            hex(&crate::data::expected_digest(&pattern, self.bytes))
        );
        let headers = run(Command::new("curl").args([
            "-sf",
            "-X",
            "POST",
            "-D",
            "-",
            "-o",
            "/dev/null",
            &self.registry_url(&format!("/v2/{REPO}/blobs/uploads/")),
            "--cacert",
            &registry_ca().display().to_string(),
        ]))?;
        let headers = String::from_utf8_lossy(&headers);
        let loc = headers
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("location")
                    .then(|| v.trim().to_string())
            })
            .ok_or_else(|| anyhow::anyhow!("docker-registry gave no upload Location"))?;
        let loc = if loc.starts_with("http") {
            loc
        } else {
            self.registry_url(&loc)
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        run(Command::new("curl")
            .args(["-sf", "-o", "/dev/null", "--cacert"])
            .arg(registry_ca())
            .arg("-T")
            .arg(&file)
            .args(["-H", "Content-Type: application/octet-stream"])
            .arg(format!("{loc}{sep}digest={digest}")))?;
        std::fs::remove_file(&file)?;
        Ok(digest)
    }

    /// GET the blob from `base` (`http://HOST` or `https://HOST`) with curl,
    /// hashing the body as it arrives; `first_byte` is called when the first
    /// body bytes are here.
    fn get(&self, base: &str, first_byte: &mut dyn FnMut()) -> anyhow::Result<HttpGet> {
        let url = format!("{base}/v2/{REPO}/blobs/{}", self.digest);
        let (children0, registry0) = (crate::cpu::children_cpu(), self.registry.cpu()?);
        let mut child = Command::new("curl")
            .args(curl_tls(&url))
            .args(["-sSf", "-o", "-", "-w"])
            .arg("%{stderr}\n%{time_starttransfer} %{time_total}\n")
            .arg(&url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut out = child.stdout.take().expect("piped stdout");
        let verify = crate::cpu::CpuSpan::start();
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let k = out.read(&mut buf)?;
            if k == 0 {
                break;
            }
            if n == 0 {
                first_byte();
            }
            h.update(&buf[..k]);
            n += k as u64;
        }
        let verify_cpu = verify.stop();
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("piped stderr")
            .read_to_string(&mut err)?;
        let status = child.wait()?;
        // curl is the only child reaped between the two readings.
        let curl_cpu = delta(children0, crate::cpu::children_cpu());
        let registry_cpu = delta(registry0, self.registry.cpu()?);
        anyhow::ensure!(status.success(), "curl {url}: {status}: {err}");
        let times: Vec<f64> = err
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|t| t.parse().ok())
            .collect();
        let [first_byte_s, total_s] = times[..] else {
            anyhow::bail!("curl printed no timings: {err:?}");
        };
        let got = format!("sha256:{}", hex(&h.finalize()));
        Ok(HttpGet {
            first_byte_s,
            total_s,
            sha256_ok: n == self.bytes && got == self.digest,
            curl_cpu,
            registry_cpu,
            verify_cpu,
        })
    }

    fn tls_args(&self, name: &str) -> Vec<std::ffi::OsString> {
        let pki = self.dir.join("pki");
        vec![
            "--cert".into(),
            pki.join(format!("{name}.pem")).into(),
            "--key".into(),
            pki.join(format!("{name}-key.pem")).into(),
            "--ca".into(),
            pki.join("ca.pem").into(),
        ]
    }

    /// A registry agent with an empty cache, pulling through from docker-registry.
    fn registry_agent(&self) -> anyhow::Result<Proc> {
        let cache = self.dir.join("registry-agent-cache");
        let _ = std::fs::remove_dir_all(&cache);
        let p = Proc::spawn(
            Command::new(&self.qr)
                .arg("registry-agent")
                .args(["--upstream", &self.registry_url("")])
                .arg("--upstream-ca")
                .arg(registry_ca())
                .args(["--ip", AGENT_IP, "--service-port", AGENT_SERVICE_PORT])
                .args(["--metrics", AGENT_METRICS])
                .arg("--cache-dir")
                .arg(&cache)
                .args(self.tls_args("registry")),
            &self.dir.join("registry-agent.log"),
        )?;
        wait_http(
            &format!("http://{AGENT_METRICS}/metrics"),
            "the registry agent",
        )?;
        Ok(p)
    }

    /// A node agent with an empty cache, answering once it serves `/v2/`.
    fn node_agent(&self) -> anyhow::Result<Proc> {
        let cache = self.dir.join("node-agent-cache");
        let _ = std::fs::remove_dir_all(&cache);
        let p = Proc::spawn(
            Command::new(&self.qr)
                .arg("node-agent")
                .args(["--registry", &format!("{AGENT_IP}:{AGENT_SERVICE_PORT}")])
                .args(["--ip", NODE_IP, "--listen", NODE_LISTEN])
                .arg("--cache-dir")
                .arg(&cache)
                .args(&self.node_args)
                .args(self.tls_args("node")),
            &self.dir.join("node-agent.log"),
        )?;
        wait_http(&format!("http://{NODE_LISTEN}/v2/"), "the node agent")?;
        Ok(p)
    }

    /// One GET through a fresh node agent, with both agents' CPU over it.
    fn through_agents(&self, registry_agent: &Proc) -> anyhow::Result<AgentsGet> {
        let node = self.node_agent()?;
        let (r0, n0) = (registry_agent.cpu()?, node.cpu()?);
        let mut at_first = None;
        let get = self.get(&format!("http://{NODE_LISTEN}"), &mut || {
            at_first = Some(node.cpu())
        })?;
        let (r1, n1) = (registry_agent.cpu()?, node.cpu()?);
        let nf = at_first.ok_or_else(|| anyhow::anyhow!("the node agent sent no body"))??;
        Ok(AgentsGet {
            get,
            registry_agent_cpu: delta(r0, r1),
            node_agent_cpu: delta(n0, n1),
            node_agent_cpu_first_byte: delta(n0, nf),
        })
    }

    /// One repeat: direct, raw (`raw_row` in two processes), agents cold, agents warm.
    pub fn repeat(&self, raw_row: &dyn Row, tls: &Path) -> anyhow::Result<ImageRepeat> {
        let direct = self.get(&self.registry_url(""), &mut || {})?;
        let raw = crate::procs::bulk_in_processes(
            raw_row,
            BulkParams {
                bytes: self.bytes,
                verify: true,
            },
            crate::affinity::Placement::SeparateCores.cpus(),
            tls,
        )?;
        let registry_agent = self.registry_agent()?;
        let cold = self.through_agents(&registry_agent)?;
        let warm = self.through_agents(&registry_agent)?;
        drop(registry_agent);
        let _ = std::fs::remove_dir_all(self.dir.join("registry-agent-cache"));
        let _ = std::fs::remove_dir_all(self.dir.join("node-agent-cache"));
        Ok(ImageRepeat {
            direct,
            raw,
            cold,
            warm,
            load: crate::cpu::load_avg(),
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl HttpGet {
    /// CPU seconds of the processes every path shares: docker-registry, curl
    /// and the sha256 check.
    fn shared_cpu_s(&self) -> f64 {
        self.registry_cpu.total_s() + self.curl_cpu.total_s() + self.verify_cpu.total_s()
    }
}

impl AgentsGet {
    /// CPU seconds of every process on this path: docker-registry, both
    /// agents, curl and the sha256 check.
    fn path_cpu_s(&self) -> f64 {
        self.get.shared_cpu_s() + self.registry_agent_cpu.total_s() + self.node_agent_cpu.total_s()
    }
}

impl ImageRepeat {
    /// CPU seconds per GiB of every process on each path: direct, cold, warm.
    pub fn path_cpu_per_gib(&self, bytes: u64) -> [f64; 3] {
        let gib = bytes as f64 / crate::stats::GIB;
        [
            self.direct.shared_cpu_s() / gib,
            self.cold.path_cpu_s() / gib,
            self.warm.path_cpu_s() / gib,
        ]
    }

    /// The most the cold and warm pulls could measure against this repeat's
    /// direct GET on this machine: with every one of `cpus` cores busy, a
    /// path moves `cpus / (its CPU seconds per byte)` bytes a second; that
    /// rate ÷ the direct GET's measured rate. Where the direct path's own
    /// processes already fill the cores, no path with more work per byte
    /// can reach 1.0 (the cold path holds the direct path's registry-side
    /// work and adds the agents').
    pub fn cpu_ceiling(&self, bytes: u64, cpus: usize) -> [f64; 2] {
        let [_, cold, warm] = self.path_cpu_per_gib(bytes);
        let direct_gib_s = bytes as f64 / crate::stats::GIB / self.direct.total_s;
        [
            cpus as f64 / cold / direct_gib_s,
            cpus as f64 / warm / direct_gib_s,
        ]
    }

    /// Every cell's sha256 matched.
    pub fn sha256_ok(&self) -> bool {
        self.direct.sha256_ok
            && self.raw.sha256_ok
            && self.cold.get.sha256_ok
            && self.warm.get.sha256_ok
    }
}

/// Mbit/s of `bytes` in `secs`.
pub fn mbit(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs / 1e6
}

impl ImageReport {
    /// Per repeat: (agents warm to first byte, agents warm to last byte,
    /// agents cold to first byte), each ÷ the raw transfer's rate.
    pub fn ratios(&self) -> Vec<[f64; 3]> {
        self.runs
            .iter()
            .map(|r| {
                let raw = mbit(r.raw.bytes, r.raw.secs);
                [
                    mbit(self.bytes, r.warm.get.first_byte_s) / raw,
                    mbit(self.bytes, r.warm.get.total_s) / raw,
                    mbit(self.bytes, r.cold.get.first_byte_s) / raw,
                ]
            })
            .collect()
    }

    /// The median over repeats of `f(repeat, blob bytes)` (the targets of
    /// [`crate::report::Report::judge`]).
    pub fn median(&self, f: impl Fn(&ImageRepeat, u64) -> f64) -> Option<f64> {
        let v: Vec<f64> = self.runs.iter().map(|r| f(r, self.bytes)).collect();
        crate::stats::Spread::of(&v).map(|s| s.median)
    }

    /// The Markdown section: one line per repeat and a median line.
    pub fn markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let gib = self.bytes as f64 / crate::stats::GIB;
        let _ = writeln!(
            s,
            "## Image layers: {} MiB blob\n\n\
             direct: curl GET from docker-registry over HTTPS (TLS on the registry, TCP \
             loopback). raw: {} as two processes \
             (pinned, one core each). agents: curl GET from `qr node-agent` ← soft ← \
             `qr registry-agent` (separate processes, not pinned), cold = the registry agent \
             pulls through (HTTPS) at the same time, warm = its cache holds the blob; a fresh node \
             agent each time. \"first\" = curl's time to the first body byte, \"last\" = to the \
             last byte. Mbit/s; CPU = user+sys \
             s/GiB of each agent process over the GET; \"all processes\" adds docker-registry, \
             curl and the harness's sha256 check; the CPU-bound ceiling is what the path could \
             reach ÷ the direct GET were all {} cores busy with its CPU per GiB. Every cell \
             sha256-checked.\n",
            self.bytes >> 20,
            self.raw_row,
            self.cpus
        );
        let _ = writeln!(s, "| repeat | load after | direct | raw | cold first / last | warm first / last | warm first ÷ raw | warm last ÷ raw | cold first ÷ raw | cold / warm last ÷ direct | cold first byte ms | registry agent CPU cold / warm | node agent CPU cold / warm (of which to first byte) | raw CPU client / server | CPU of all processes direct / cold / warm | CPU-bound ceiling cold / warm ÷ direct | sha256 |");
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let ratios = self.ratios();
        let pct = |x: f64| format!("{:.0} %", x * 100.0);
        for (i, (r, q)) in self.runs.iter().zip(&ratios).enumerate() {
            let b = self.bytes;
            let cpu = r.path_cpu_per_gib(b);
            let ceiling = r.cpu_ceiling(b, self.cpus);
            let _ = writeln!(
                s,
                "| {i} | {:.1} | {:.0} | {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {} | {:.2} / {:.2} | {:.0} | {:.2} / {:.2} | {:.2} ({:.2}) / {:.2} ({:.2}) | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {} |",
                r.load[0],
                mbit(b, r.direct.total_s),
                mbit(r.raw.bytes, r.raw.secs),
                mbit(b, r.cold.get.first_byte_s),
                mbit(b, r.cold.get.total_s),
                mbit(b, r.warm.get.first_byte_s),
                mbit(b, r.warm.get.total_s),
                pct(q[0]),
                pct(q[1]),
                pct(q[2]),
                r.direct.total_s / r.cold.get.total_s,
                r.direct.total_s / r.warm.get.total_s,
                r.cold.get.first_byte_s * 1e3,
                r.cold.registry_agent_cpu.total_s() / gib,
                r.warm.registry_agent_cpu.total_s() / gib,
                r.cold.node_agent_cpu.total_s() / gib,
                r.cold.node_agent_cpu_first_byte.total_s() / gib,
                r.warm.node_agent_cpu.total_s() / gib,
                r.warm.node_agent_cpu_first_byte.total_s() / gib,
                r.raw.client_cpu.total_s() / (r.raw.bytes as f64 / crate::stats::GIB),
                r.raw.server_cpu.total_s() / (r.raw.bytes as f64 / crate::stats::GIB),
                cpu[0],
                cpu[1],
                cpu[2],
                ceiling[0],
                ceiling[1],
                if r.sha256_ok() { "ok" } else { "**MISMATCH**" }
            );
        }
        let med = |f: &dyn Fn(&ImageRepeat) -> f64| {
            crate::stats::Spread::of(&self.runs.iter().map(f).collect::<Vec<_>>())
                .map(|x| x.median)
                .unwrap_or(f64::NAN)
        };
        let medq = |k: usize| {
            crate::stats::Spread::of(&ratios.iter().map(|q| q[k]).collect::<Vec<_>>())
                .map(|x| x.median)
                .unwrap_or(f64::NAN)
        };
        let b = self.bytes;
        let _ = writeln!(
            s,
            "| median | | {:.0} | {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {} | {:.2} / {:.2} | {:.0} | {:.2} / {:.2} | {:.2} ({:.2}) / {:.2} ({:.2}) | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | |",
            med(&|r| mbit(b, r.direct.total_s)),
            med(&|r| mbit(r.raw.bytes, r.raw.secs)),
            med(&|r| mbit(b, r.cold.get.first_byte_s)),
            med(&|r| mbit(b, r.cold.get.total_s)),
            med(&|r| mbit(b, r.warm.get.first_byte_s)),
            med(&|r| mbit(b, r.warm.get.total_s)),
            pct(medq(0)),
            pct(medq(1)),
            pct(medq(2)),
            med(&|r| r.direct.total_s / r.cold.get.total_s),
            med(&|r| r.direct.total_s / r.warm.get.total_s),
            med(&|r| r.cold.get.first_byte_s * 1e3),
            med(&|r| r.cold.registry_agent_cpu.total_s() / gib),
            med(&|r| r.warm.registry_agent_cpu.total_s() / gib),
            med(&|r| r.cold.node_agent_cpu.total_s() / gib),
            med(&|r| r.cold.node_agent_cpu_first_byte.total_s() / gib),
            med(&|r| r.warm.node_agent_cpu.total_s() / gib),
            med(&|r| r.warm.node_agent_cpu_first_byte.total_s() / gib),
            med(&|r| r.raw.client_cpu.total_s() / (r.raw.bytes as f64 / crate::stats::GIB)),
            med(&|r| r.raw.server_cpu.total_s() / (r.raw.bytes as f64 / crate::stats::GIB)),
            med(&|r| r.path_cpu_per_gib(b)[0]),
            med(&|r| r.path_cpu_per_gib(b)[1]),
            med(&|r| r.path_cpu_per_gib(b)[2]),
            med(&|r| r.cpu_ceiling(b, self.cpus)[0]),
            med(&|r| r.cpu_ceiling(b, self.cpus)[1]),
        );
        for e in &self.errors {
            let _ = writeln!(s, "\nError: {e}");
        }
        s
    }
}
