//! The two-process placement: client and server of a workload each in a
//! process of its own, pinned to CPU 0 and 1, the way users deploy a transport
//! (no shared allocator, runtime or address space between the sides).
//!
//! The parent starts the server, reads the first line it prints —
//! `listening <address>` ([`LISTENING`]) — starts the client with that address,
//! and takes the last line each prints as its result (JSON). The harness's
//! own rows run every workload this way through `compare`'s hidden `--side`
//! mode ([`bulk_in_processes`], [`rtt_in_processes`],
//! [`handshakes_in_processes`]); the standalone peers ([`crate::peer`]) run
//! their bulk transfer likewise.

use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::rows::{
    BulkOutcome, BulkParams, HandshakeOutcome, ProcessSide, Row, RttOutcome, SideOutcome, Workload,
};
use crate::side::HANG_GUARD;

/// The first word of the line a server process prints once it listens.
pub const LISTENING: &str = "listening";

/// Server side: say where to dial (the parent then starts the client).
pub fn announce(addr: SocketAddr) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{LISTENING} {}", addr_to_string(addr))?;
    out.flush()?;
    Ok(())
}

/// `addr` as text that keeps every field: an IPv6 address's flow info and
/// scope id follow it (a UD address keeps its Q_Key and QPN there, see
/// `quic_rdma::fabric::UdAddr::to_socket_addr`; `SocketAddr`'s `Display`
/// drops the flow info).
pub fn addr_to_string(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!(
            "[{}]:{}/{}/{}",
            a.ip(),
            a.port(),
            a.flowinfo(),
            a.scope_id()
        ),
    }
}

/// The inverse of [`addr_to_string`].
pub fn addr_from_str(s: &str) -> anyhow::Result<SocketAddr> {
    let mut it = s.split('/');
    let mut a: SocketAddr = it.next().unwrap_or_default().parse()?;
    if let SocketAddr::V6(v6) = &mut a {
        if let (Some(f), Some(sc)) = (it.next(), it.next()) {
            v6.set_flowinfo(f.parse()?);
            v6.set_scope_id(sc.parse()?);
        }
    }
    Ok(a)
}

/// Start `server`, wait for its [`LISTENING`] line, start `client(address)`,
/// and return the last stdout line of (client, server). Both are killed if
/// either fails to report within the hang guard.
pub fn run_processes(
    label: &str,
    mut server: Command,
    client: impl FnOnce(SocketAddr) -> Command,
) -> anyhow::Result<(String, String)> {
    let mut s = server
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut sout = BufReader::new(s.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    sout.read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix(LISTENING)
        .map(str::trim)
        .and_then(|a| addr_from_str(a).ok());
    let Some(addr) = addr else {
        let _ = s.kill();
        let _ = s.wait();
        anyhow::bail!("{label} server did not start (it said {line:?})");
    };
    let c = client(addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let c = match c {
        Ok(c) => c,
        Err(e) => {
            let _ = s.kill();
            let _ = s.wait();
            return Err(e.into());
        }
    };
    let cr = last_line(c, None, label);
    let sr = last_line(s, Some(sout), label);
    Ok((
        cr.map_err(|e| e.context("client"))?,
        sr.map_err(|e| e.context("server"))?,
    ))
}

/// The last stdout line of `child` once it exits successfully (bounded wait).
fn last_line(
    mut child: Child,
    out: Option<BufReader<ChildStdout>>,
    label: &str,
) -> anyhow::Result<String> {
    let mut out = out.unwrap_or_else(|| BufReader::new(child.stdout.take().expect("piped stdout")));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut last, mut l) = (String::new(), String::new());
        while out.read_line(&mut l).map(|n| n > 0).unwrap_or(false) {
            last = std::mem::take(&mut l);
        }
        let _ = tx.send(last);
    });
    let last = match rx.recv_timeout(HANG_GUARD + Duration::from_secs(10)) {
        Ok(l) => l,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{label} did not finish within {HANG_GUARD:?}");
        }
    };
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "{label} exited with {status}");
    Ok(last.trim().to_string())
}

/// The path of binary `name` built next to the running executable (the
/// `cargo build -p quic-rdma-benches --bins` output directory; test binaries
/// live one level deeper, in `deps/`).
pub fn sibling_exe(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let dir = me.parent().ok_or_else(|| anyhow::anyhow!("no exe dir"))?;
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!(
        "{name} not found next to {}: build it with `cargo build --release -p quic-rdma-benches --bins`",
        me.display()
    )
}

/// Run `work` of `row` with client and server in two processes of `compare`
/// (its `--side` mode), pinned to `cpus` (client, server); the last line each
/// printed, (client, server). `tls` is the certificate file the sides load
/// (see [`crate::tls::TLS_ENV`]).
fn in_processes(
    row: &dyn Row,
    work: Workload,
    cpus: (usize, usize),
    tls: &std::path::Path,
) -> anyhow::Result<(String, String)> {
    let exe = sibling_exe("compare")?;
    let cmd = |role: &str, cpu: usize| {
        let mut c = Command::new(&exe);
        c.args(["--side", role, "--row", &row.name()])
            .args(["--cpu", &cpu.to_string()])
            .env(crate::tls::TLS_ENV, tls);
        match work {
            Workload::Bulk(p) => c.args(["--work", "bulk", "--bulk-bytes", &p.bytes.to_string()]),
            Workload::Rtt(n) => c.args(["--work", "rtt", "--rtt-iters", &n.to_string()]),
            Workload::Handshakes(n) => {
                c.args(["--work", "handshakes", "--handshakes", &n.to_string()])
            }
        };
        c
    };
    run_processes(&row.name(), cmd("server", cpus.1), |a| {
        let mut c = cmd("client", cpus.0);
        c.args(["--addr", &addr_to_string(a)]);
        c
    })
}

/// One bulk transfer of `row` in two processes (see [`in_processes`]).
pub fn bulk_in_processes(
    row: &dyn Row,
    p: BulkParams,
    cpus: (usize, usize),
    tls: &std::path::Path,
) -> anyhow::Result<BulkOutcome> {
    let (c, s) = in_processes(row, Workload::Bulk(p), cpus, tls)?;
    let c: SideOutcome = serde_json::from_str(&c)?;
    let s: SideOutcome = serde_json::from_str(&s)?;
    Ok(BulkOutcome {
        bytes: p.bytes,
        secs: c.secs,
        sha256_ok: c.ok && s.ok,
        client_cpu: c.cpu,
        server_cpu: s.cpu,
    })
}

/// `iters` sampled round trips of `row` in two processes (see [`in_processes`]).
pub fn rtt_in_processes(
    row: &dyn Row,
    iters: usize,
    cpus: (usize, usize),
    tls: &std::path::Path,
) -> anyhow::Result<RttOutcome> {
    let (c, _) = in_processes(row, Workload::Rtt(iters), cpus, tls)?;
    let samples_ns: Vec<u64> = serde_json::from_str(&c)?;
    anyhow::ensure!(
        samples_ns.len() == iters,
        "{} RTT samples, {iters} asked",
        samples_ns.len()
    );
    Ok(RttOutcome {
        samples_ns,
        sent: None,
    })
}

/// `count` handshakes of `row` in two processes (see [`in_processes`]).
pub fn handshakes_in_processes(
    row: &dyn Row,
    count: usize,
    cpus: (usize, usize),
    tls: &std::path::Path,
) -> anyhow::Result<HandshakeOutcome> {
    let (c, _) = in_processes(row, Workload::Handshakes(count), cpus, tls)?;
    Ok(HandshakeOutcome {
        count: count as u64,
        secs: serde_json::from_str(&c)?,
    })
}

/// `compare --side server|client`: run one side of `row`'s `work` in this
/// process, pinned to `cpu`, and print its outcome as JSON on the last line
/// (bulk: a [`SideOutcome`]; RTT: the client's samples; handshakes: the
/// client's seconds).
pub fn side_main(
    row: &dyn Row,
    role: &str,
    work: Workload,
    cpu: usize,
    addr: Option<SocketAddr>,
) -> anyhow::Result<()> {
    crate::affinity::pin_current_thread(cpu);
    crate::cpu::measure_whole_process();
    let mut announce_it = |a| announce(a);
    let side = match (role, addr) {
        ("server", _) => ProcessSide::Server(&mut announce_it),
        ("client", Some(a)) => ProcessSide::Client(a),
        _ => anyhow::bail!("--side takes server, or client with --addr IP:PORT"),
    };
    let out = match work {
        Workload::Bulk(p) => serde_json::to_string(&row.bulk_side(p, side)?)?,
        Workload::Rtt(n) => serde_json::to_string(&row.rtt_side(n, side)?)?,
        Workload::Handshakes(n) => serde_json::to_string(&row.handshakes_side(n, side)?)?,
    };
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    #[test]
    fn addresses_keep_flow_info_and_scope_through_text() {
        // A UD address: GID, port 4791, Q_Key in the flow info, QPN in the scope id.
        let v6 = SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7),
            4791,
            0x1111_0001,
            0x00ab_cdef,
        ));
        assert_eq!(addr_from_str(&addr_to_string(v6)).unwrap(), v6);
        let v4 = SocketAddr::from((Ipv4Addr::new(127, 0, 130, 1), 19700));
        assert_eq!(addr_from_str(&addr_to_string(v4)).unwrap(), v4);
        assert!(addr_from_str("[fd00::7]:4791/x/1").is_err());
    }
}
