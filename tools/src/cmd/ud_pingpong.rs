//! `qr ud-pingpong`: a raw-UD ping-pong (no QUIC) that interoperates with
//! rdma-core's `ibv_ud_pingpong` (libibverbs/examples/ud_pingpong.c).
//!
//! What makes it compatible:
//! - **Address exchange over TCP** (port 18515 by default). Each side's record is
//!   `"%04x:%06x:%06x:%s"` + NUL — LID, QPN, PSN, then the GID as 32 hex digits
//!   in wire (byte) order — 52 bytes in all. The client connects and sends its
//!   record, reads the server's, then sends `"done"` + NUL. The server reads the
//!   client's record, sets up its address handle, answers with its own record and
//!   reads the client's `done`.
//! - **UD traffic**: Q_Key 0x11111111 on both QPs and in every send; messages of
//!   `-s` bytes (at most the active MTU); receives of `-s` + 40 bytes (the GRH
//!   area). The client sends first; each side sends its next message once its
//!   last send has completed and a message has arrived, until `-n` of each.
//!   UD is unreliable and the loop has no retransmission: a lost packet stalls
//!   both sides (as with `ibv_ud_pingpong`); `--timeout` turns that into an error.
//! - **Summary** in `ibv_ud_pingpong`'s words: `B bytes in S seconds = R
//!   Mbit/sec` (both directions: size × iters × 2) and `N iters in S seconds = U
//!   usec/iter`.
//!
//! Providers: `soft` (userspace RoCEv2 over UDP port 4791 on `--ip`; talks to
//! kernel rxe and RoCE NICs) and `verbs` (libibverbs, when built with the `verbs`
//! feature; `-g` picks the GID by index, as `ibv_ud_pingpong -g` does, or by value).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use quic_rdma::fabric::soft::SoftPort;
use quic_rdma::fabric::{
    AhAttr, Completion, Gid, Memory, Provider, RecvWr, Region, SendFlags, SendWr, Sge, UdQueuePair,
    WcStatus, GRH_LEN,
};

use super::args::FabricArgs;
use crate::provider::{self, OpenError};

/// Q_Key of `ibv_ud_pingpong` (both QPs, every send).
pub(crate) const PP_QKEY: u32 = 0x1111_1111;
/// Length of an address record on the wire, NUL included.
pub(crate) const MSG_LEN: usize = 52;

/// Options of `qr ud-pingpong` (the names and defaults of `ibv_ud_pingpong`'s).
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct UdPingpongArgs {
    /// Server to connect to; without it, wait for a client (server mode).
    pub(crate) host: Option<String>,

    /// TCP port of the address exchange (listen on / connect to).
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub(crate) port: u16,

    /// Size of each message in bytes (at most the active MTU).
    #[arg(short = 's', long, default_value_t = 2048)]
    pub(crate) size: usize,

    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub(crate) iters: u32,

    /// Receives kept posted.
    #[arg(short = 'r', long, default_value_t = 500)]
    pub(crate) rx_depth: usize,

    /// verbs: the local GID, by index in the port's GID table (as
    /// `ibv_ud_pingpong -g`) or by value (an IPv6 or IPv4 address); default: the
    /// first RoCE v2 GID, IPv4-mapped preferred. soft: a GID value (same as --ip).
    #[arg(short = 'g', long = "gid-idx")]
    pub(crate) gid: Option<String>,

    /// verbs: device name (default: the first).
    #[arg(short = 'd', long = "ib-dev")]
    pub(crate) device: Option<String>,

    /// verbs: port number of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub(crate) ib_port: u8,

    #[command(flatten)]
    pub(crate) fabric: FabricArgs,

    /// soft: the local IP (the GID). Default: the address the kernel routes
    /// from towards the server (client), required for a server.
    #[arg(long)]
    pub(crate) ip: Option<IpAddr>,

    /// Client: keep trying to reach the server this many seconds.
    #[arg(long, default_value_t = 30)]
    pub(crate) wait: u64,

    /// Give up (exit 1) when the ping-pong has not finished after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout: u64,
}

/// One side's address record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dest {
    pub(crate) lid: u32,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: Gid,
}

impl Dest {
    /// The 52-byte record.
    pub(crate) fn encode(&self) -> [u8; MSG_LEN] {
        let hex: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{hex}",
            self.lid & 0xFFFF,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF
        );
        let mut out = [0u8; MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parse a record (trailing NULs ignored).
    pub(crate) fn decode(msg: &[u8]) -> Result<Dest> {
        let s = std::str::from_utf8(msg)
            .context("address record is not text")?
            .trim_end_matches('\0');
        let parts: Vec<&str> = s.split(':').collect();
        let bad = || anyhow!("bad address record {s:?}");
        if parts.len() != 4 || parts[3].len() != 32 {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&parts[3][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        let num = |p: &str| u32::from_str_radix(p, 16).map_err(|_| bad());
        Ok(Dest {
            lid: num(parts[0])?,
            qpn: num(parts[1])?,
            psn: num(parts[2])?,
            gid: Gid(gid),
        })
    }
}

/// An argument (or combination) `qr ud-pingpong` cannot run with: exit code 2.
#[derive(Debug)]
pub(crate) struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Fail with a [`UsageError`].
fn usage<T>(why: impl Into<String>) -> Result<T> {
    Err(UsageError(why.into()).into())
}

/// Run `qr ud-pingpong`: exit 0 when done, 2 on bad usage (or a provider not
/// built in), 1 on any other failure.
pub(crate) fn main(args: &UdPingpongArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr ud-pingpong: {e:#}");
            let bad_usage = e.chain().any(|c| {
                c.is::<UsageError>()
                    || matches!(
                        c.downcast_ref::<OpenError>(),
                        Some(OpenError::NotBuiltIn(_) | OpenError::Unsupported(_))
                    )
            });
            if bad_usage {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// What can be told wrong from the arguments alone, before anything is
/// opened or any address exchanged.
fn check_usage(args: &UdPingpongArgs) -> Result<()> {
    if args.size == 0 || args.iters == 0 || args.rx_depth == 0 {
        return usage("-s, -n and -r must be at least 1");
    }
    provider::ensure_built_in(args.fabric.provider)?;
    match args.fabric.provider {
        Provider::Sim => usage(
            "provider `sim` is in-process: ud-pingpong needs `--provider soft` or `--provider verbs`",
        ),
        Provider::Soft => match (&args.ip, &args.gid, &args.host) {
            (None, Some(g), _) => parse_gid(g).map(drop),
            (None, None, None) => usage("a soft server needs --ip (its GID)"),
            _ => Ok(()),
        },
        Provider::Verbs => Ok(()),
    }
}

/// A GID given as an address: IPv6, or IPv4 (mapped).
fn parse_gid(s: &str) -> Result<Gid> {
    if let Ok(v6) = s.parse::<Ipv6Addr>() {
        return Ok(v6.into());
    }
    match s.parse::<IpAddr>() {
        Ok(ip) => Ok(Gid::from(ip)),
        Err(_) => usage(format!(
            "`{s}` is neither a GID index nor an IPv4/IPv6 address"
        )),
    }
}

/// The first address of `host:port`, retried until `wait`.
fn connect_tcp(host: &str, port: u16, wait: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + wait;
    loop {
        let attempt = (host, port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))
            .and_then(|addrs| {
                let mut last = None;
                for a in addrs {
                    match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.map_or_else(|| anyhow!("{host} has no address"), anyhow::Error::from))
            });
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(e).with_context(|| format!("couldn't connect to {host}:{port}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The IP the kernel routes from towards `host` (no packet is sent).
fn route_source(host: &str, port: u16) -> Result<IpAddr> {
    let peer = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow!("{host} has no address"))?;
    let any: std::net::SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let s = std::net::UdpSocket::bind(any)?;
    s.connect(peer)?;
    Ok(s.local_addr()?.ip())
}

/// A queue pair on the chosen provider, with what keeps it alive.
struct Opened {
    qp: Box<dyn UdQueuePair>,
    /// `soft`: the port (its socket) outlives the QP.
    _soft: Option<SoftPort>,
}

fn open_qp(args: &UdPingpongArgs) -> Result<Opened> {
    match args.fabric.provider {
        Provider::Soft => {
            let ip = match (&args.ip, &args.gid, &args.host) {
                (Some(ip), _, _) => *ip,
                (None, Some(g), _) => parse_gid(g)?.to_ip(),
                (None, None, Some(host)) => route_source(host, args.port)?,
                (None, None, None) => return usage("a soft server needs --ip (its GID)"),
            };
            let port = provider::open_soft_port(provider::soft_config(ip, args.fabric.udp_port)?)?;
            let qp = port.create_qp(PP_QKEY).context("soft QP")?;
            Ok(Opened {
                qp: Box::new(qp),
                _soft: Some(port),
            })
        }
        Provider::Verbs => open_verbs(args),
        Provider::Sim => usage(
            "provider `sim` is in-process: ud-pingpong needs `--provider soft` or `--provider verbs`",
        ),
    }
}

#[cfg(feature = "verbs")]
fn open_verbs(args: &UdPingpongArgs) -> Result<Opened> {
    use quic_rdma::fabric::verbs::{VerbsOptions, VerbsQp};
    let mut opts = VerbsOptions {
        device: args.device.clone(),
        port: args.ib_port,
        qkey: PP_QKEY,
        max_send_wr: 16,
        max_recv_wr: args.rx_depth as u32 + 16,
        ..VerbsOptions::default()
    };
    match &args.gid {
        Some(g) if g.parse::<u32>().is_ok() => {
            let index: u32 = g.parse()?;
            // The GID table is read through an opened QP; reopen on the chosen GID.
            let probe = VerbsQp::open(&opts).context("opening the verbs device")?;
            let table = probe.gid_table().context("reading the GID table")?;
            drop(probe);
            let e = table
                .iter()
                .find(|e| e.index == index)
                .ok_or_else(|| anyhow!("no GID at index {index}"))?;
            opts.gid = Some(e.gid);
        }
        Some(g) => opts.gid = Some(parse_gid(g)?),
        None => {}
    }
    let qp = VerbsQp::open(&opts).context("opening a verbs UD QP")?;
    Ok(Opened {
        qp: Box::new(qp),
        _soft: None,
    })
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(_: &UdPingpongArgs) -> Result<Opened> {
    Err(OpenError::NotBuiltIn(Provider::Verbs).into())
}

fn run(args: &UdPingpongArgs) -> Result<()> {
    check_usage(args)?;
    let Opened { mut qp, _soft } = open_qp(args)?;
    let mtu = qp.attr().active_mtu.bytes();
    if args.size > mtu {
        return usage(format!("requested size larger than port MTU ({mtu})"));
    }

    // Registered memory: rx_depth receive slots of size + 40, then the send buffer.
    let stride = (args.size + GRH_LEN).div_ceil(64) * 64;
    let mut mem = Memory::new();
    let mut region = Region::new(stride * (args.rx_depth + 1));
    qp.register(&mut region).context("registering memory")?;
    let lkey = region.lkey().ok_or_else(|| anyhow!("region has no lkey"))?;
    mem.push(region);
    let sge = |slot: usize, len: usize| Sge {
        region: 0,
        offset: (slot * stride) as u32,
        len: len as u32,
        lkey,
    };
    // Receives go up before the exchange: a UD message that finds none is lost.
    let recvs: Vec<RecvWr> = (0..args.rx_depth)
        .map(|s| RecvWr {
            wr_id: s as u64,
            sge: sge(s, args.size + GRH_LEN),
        })
        .collect();
    qp.post_recv(&mut mem, &recvs).map_err(|(n, e)| {
        anyhow::Error::new(e).context(format!("posting receives ({n} posted)"))
    })?;

    let attr = qp.attr().clone();
    let mine = Dest {
        lid: 0,
        qpn: attr.qpn,
        psn: rand::random::<u32>() & 0xFF_FFFF,
        gid: attr.gid,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {}",
        mine.lid,
        mine.qpn,
        mine.psn,
        mine.gid.to_ipv6()
    );
    let peer = match &args.host {
        Some(host) => {
            let mut tcp = connect_tcp(host, args.port, Duration::from_secs(args.wait))?;
            tcp.write_all(&mine.encode())
                .context("couldn't send local address")?;
            let mut msg = [0u8; MSG_LEN];
            tcp.read_exact(&mut msg)
                .context("couldn't read remote address")?;
            tcp.write_all(b"done\0").context("couldn't send done")?;
            Dest::decode(&msg)?
        }
        None => {
            let listener = TcpListener::bind(("::", args.port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", args.port)))
                .with_context(|| format!("couldn't listen to port {}", args.port))?;
            let (mut tcp, _) = listener.accept().context("accept() failed")?;
            drop(listener);
            let mut msg = [0u8; MSG_LEN];
            tcp.read_exact(&mut msg)
                .context("couldn't read remote address")?;
            let peer = Dest::decode(&msg)?;
            tcp.write_all(&mine.encode())
                .context("couldn't send local address")?;
            // The client's "done" (its length differs between rdma-core versions).
            tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut done = [0u8; MSG_LEN];
            let _ = tcp.read(&mut done);
            peer
        }
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        peer.lid,
        peer.qpn,
        peer.psn,
        peer.gid.to_ipv6()
    );

    let ah = qp
        .create_ah(&AhAttr::new(peer.gid, 0))
        .with_context(|| format!("couldn't create AH to {}", peer.gid.to_ipv6()))?;
    let send_slot = args.rx_depth;
    mem.region_mut(0)
        .ok_or_else(|| anyhow!("no region"))?
        .slice_mut(send_slot * stride, args.size)
        .ok_or_else(|| anyhow!("the send slot is outside the region"))?
        .fill(0x7b);
    let send = SendWr {
        wr_id: u64::MAX,
        sge: sge(send_slot, args.size),
        ah,
        remote_qpn: peer.qpn,
        remote_qkey: PP_QKEY,
        imm: None,
        flags: SendFlags {
            signaled: true,
            inline: args.size <= qp.attr().max_inline as usize,
        },
    };

    const RECV: u8 = 1;
    const SEND: u8 = 2;
    let client = args.host.is_some();
    let mut pending = RECV;
    let start = Instant::now();
    if client {
        qp.post_send(&mem, &[send])
            .map_err(|(_, e)| e)
            .context("couldn't post send")?;
        pending |= SEND;
    }
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wcs = [Completion::send(0); 16];
    let mut events: Vec<(u8, Completion)> = Vec::with_capacity(32);
    let deadline = start + Duration::from_secs(args.timeout);
    let mut spins = 0u32;
    while rcnt < args.iters || scnt < args.iters {
        events.clear();
        let n = qp.poll_send_cq(&mut wcs);
        events.extend(wcs[..n].iter().map(|w| (SEND, *w)));
        let n = qp.poll_recv_cq(&mut mem, &mut wcs);
        events.extend(wcs[..n].iter().map(|w| (RECV, *w)));
        if events.is_empty() {
            spins += 1;
            if spins % 4096 == 0 && Instant::now() > deadline {
                bail!(
                    "no progress for {} s: received {rcnt}, sent {scnt} of {} \
                     (UD is unreliable: a lost message stalls the ping-pong)",
                    args.timeout,
                    args.iters
                );
            }
            std::hint::spin_loop();
            continue;
        }
        for &(kind, wc) in &events {
            if wc.status != WcStatus::Success {
                bail!(
                    "failed status {:?} for a {} completion",
                    wc.status,
                    if kind == SEND { "send" } else { "receive" }
                );
            }
            if kind == SEND {
                scnt += 1;
            } else {
                let slot = wc.wr_id as usize;
                qp.post_recv(
                    &mut mem,
                    &[RecvWr {
                        wr_id: wc.wr_id,
                        sge: sge(slot, args.size + GRH_LEN),
                    }],
                )
                .map_err(|(_, e)| e)
                .context("couldn't post receive")?;
                rcnt += 1;
            }
            pending &= !kind;
            if scnt < args.iters && pending == 0 {
                qp.post_send(&mem, &[send])
                    .map_err(|(_, e)| e)
                    .context("couldn't post send")?;
                pending = RECV | SEND;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let usec = secs * 1e6;
    let bytes = args.size as u64 * u64::from(args.iters) * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / f64::from(args.iters)
    );
    // The QP goes before the memory its receives point into.
    drop(qp);
    drop(mem);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_format() {
        let d = Dest {
            lid: 0,
            qpn: 0x12,
            psn: 0xabcdef,
            gid: "::ffff:10.77.0.1".parse::<Ipv6Addr>().unwrap().into(),
        };
        let m = d.encode();
        assert_eq!(
            &m[..51],
            b"0000:000012:abcdef:00000000000000000000ffff0a4d0001"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
        assert!(Dest::decode(b"0000:000012:abcdef:00").is_err());
    }

    #[test]
    fn record_not_text_keeps_its_source() {
        let err = Dest::decode(&[0xff; MSG_LEN]).unwrap_err();
        assert!(
            err.root_cause()
                .downcast_ref::<std::str::Utf8Error>()
                .is_some(),
            "{err:?}"
        );
    }
}
