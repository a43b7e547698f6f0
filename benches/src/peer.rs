//! The standalone peers (`peer-quinn-udp`, `peer-tcp-rustls`): what they share
//! that is not transport code — their command line, process pinning, process
//! CPU time and the one JSON line each process prints — and the driver that
//! runs a pair as two processes ([`run_standalone`], used by `compare`).
//!
//! Each peer binary is a minimal client/server written the way the peer's own
//! documentation shows, so that the harness's in-process rows can be checked
//! against "the peer as its users run it" (a target of [`crate::report::Report::judge`]:
//! each peer row within 10 % of its standalone pair). The transfer is
//! the harness's: the client sends `bytes` of [`crate::data::pattern`] in
//! [`crate::rows::WRITE_CHUNK`] writes; the server keeps every byte in a
//! pre-touched buffer, acknowledges the last byte with one byte, then hashes
//! (outside the clock and the CPU span) and returns the sha256.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::cpu::CpuUsed;

/// Which end of the transfer a peer process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Receives the upload.
    Server,
    /// Sends it.
    Client,
}

/// The command line every peer binary takes:
/// `server|client --addr IP:PORT --bytes N [--cpu K] [--cert PATH]`.
#[derive(Clone, Debug)]
pub struct PeerArgs {
    /// Server or client.
    pub role: Role,
    /// Where the server listens / the client connects.
    pub addr: SocketAddr,
    /// Upload size.
    pub bytes: u64,
    /// CPU to pin the whole process to.
    pub cpu: Option<usize>,
    /// The server's certificate (DER): written by the server, read by the client.
    pub cert: PathBuf,
}

impl PeerArgs {
    /// Parse `std::env::args()`; the error names the expected form.
    pub fn parse() -> anyhow::Result<Self> {
        const USAGE: &str = "usage: server|client --addr IP:PORT --bytes N [--cpu K] [--cert PATH]";
        let mut it = std::env::args().skip(1);
        let role = match it.next().as_deref() {
            Some("server") => Role::Server,
            Some("client") => Role::Client,
            _ => anyhow::bail!("{USAGE}"),
        };
        let (mut addr, mut bytes, mut cpu, mut cert) = (None, None, None, None);
        while let Some(a) = it.next() {
            let v = it
                .next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value; {USAGE}"))?;
            match a.as_str() {
                "--addr" => addr = Some(v.parse()?),
                "--bytes" => bytes = Some(v.parse()?),
                "--cpu" => cpu = Some(v.parse()?),
                "--cert" => cert = Some(PathBuf::from(v)),
                _ => anyhow::bail!("unknown argument {a}; {USAGE}"),
            }
        }
        let addr: SocketAddr = addr.ok_or_else(|| anyhow::anyhow!("--addr missing; {USAGE}"))?;
        Ok(PeerArgs {
            role,
            addr,
            bytes: bytes.ok_or_else(|| anyhow::anyhow!("--bytes missing; {USAGE}"))?,
            cpu,
            cert: cert.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("peer-cert-{}.der", addr.port()))
            }),
        })
    }

    /// Pin this process (it has one thread so far) to `--cpu`, if given, and
    /// make [`crate::cpu::CpuSpan`] measure the whole process.
    pub fn pin(&self) {
        if let Some(c) = self.cpu {
            crate::affinity::pin_current_thread(c);
        }
        crate::cpu::measure_whole_process();
    }
}

/// What a peer process prints as its last stdout line (JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerOutcome {
    /// `"server"` or `"client"`.
    pub role: String,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Client: first write → the server's one-byte acknowledgement. Server: 0.
    pub secs: f64,
    /// This process's CPU over its part of the transfer.
    pub cpu: CpuUsed,
    /// Client: the digest the server returned equals the expected one.
    /// Server: it received exactly `bytes`.
    pub ok: bool,
    /// TLS cipher suite negotiated.
    pub suite: String,
}

impl PeerOutcome {
    /// Print as one JSON line on stdout.
    pub fn print(&self) -> anyhow::Result<()> {
        println!("{}", serde_json::to_string(self)?);
        Ok(())
    }
}

/// The outcome of a standalone pair run by [`run_standalone`].
#[derive(Clone, Debug)]
pub struct PairOutcome {
    /// The client's report.
    pub client: PeerOutcome,
    /// The server's report.
    pub server: PeerOutcome,
}

/// Run the peer binary `bin` (built next to the running executable) as a
/// server process pinned to `cpus.1` and a client process pinned to `cpus.0`,
/// moving `bytes` through `addr`; wait for both and return their reports.
pub fn run_standalone(
    bin: &str,
    addr: SocketAddr,
    bytes: u64,
    cpus: (usize, usize),
) -> anyhow::Result<PairOutcome> {
    let exe = crate::procs::sibling_exe(bin)?;
    let cert =
        std::env::temp_dir().join(format!("{bin}-{}-{}.der", std::process::id(), addr.port()));
    let cmd = |role: &str, cpu: usize, addr: SocketAddr| {
        let mut c = Command::new(&exe);
        c.arg(role)
            .args(["--addr", &addr.to_string()])
            .args(["--bytes", &bytes.to_string()])
            .args(["--cpu", &cpu.to_string()])
            .arg("--cert")
            .arg(&cert);
        c
    };
    let r = crate::procs::run_processes(bin, cmd("server", cpus.1, addr), |a| {
        cmd("client", cpus.0, a)
    });
    let _ = std::fs::remove_file(&cert);
    let (c, s) = r?;
    Ok(PairOutcome {
        client: serde_json::from_str(&c)?,
        server: serde_json::from_str(&s)?,
    })
}
