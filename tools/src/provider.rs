//! Choosing a fabric provider: the one place that turns `--provider` into
//! quinn-ready UD sockets — a connected pair in one process ([`open_pair`],
//! `qr demo`) or one endpoint of a multi-process provider ([`open_endpoint`],
//! `qr serve` / `qr connect`) — plus the `soft` port helpers `qr ud-pingpong`
//! opens its bare QP with. New providers plug in here.

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use quic_rdma::discovery::{BootstrapError, PeerInfo};
use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{FabricError, Mtu, Provider, UdQueuePair, DEFAULT_QKEY};
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, SocketError, UdSocket};

/// What a provider needs to know to build the pair.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FabricOptions {
    /// Injected loss in percent (sim only); 0 = an ideal fabric.
    pub(crate) loss_percent: f64,
    /// Seed of the fabric's fault decisions (sim only).
    pub(crate) seed: u64,
}

impl FabricOptions {
    /// The sim faults for these options: the "hostile fabric" of the library's
    /// tests — `loss_percent` loss plus 1 % duplication and 2 % reordering
    /// (held back 300 µs) — or none at all when `loss_percent` is 0.
    pub(crate) fn sim_faults(&self) -> Faults {
        if self.loss_percent > 0.0 {
            Faults::hostile(self.loss_percent / 100.0)
        } else {
            Faults::default()
        }
    }
}

/// A quinn-ready socket on any provider.
pub(crate) type Socket = Arc<RdmaUdpSocket<Box<dyn UdQueuePair>>>;

/// Server and client sockets that can reach each other.
pub(crate) struct SocketPair {
    /// The provider that made them.
    pub(crate) kind: Provider,
    /// The server's socket.
    pub(crate) server: Socket,
    /// The client's socket.
    pub(crate) client: Socket,
    /// The simulated fabric, when there is one (for its wire counters).
    pub(crate) sim: Option<SimFabric>,
}

/// Why a provider could not open a socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The provider exists in the design but is not compiled into this binary.
    #[error("{}", not_built_in(*.0))]
    NotBuiltIn(Provider),
    /// The provider cannot do what was asked (e.g. `sim` between processes);
    /// the text says what to use instead.
    #[error("{0}")]
    Unsupported(String),
    /// A setting the provider cannot take (an environment variable, a QPN or
    /// UDP port a device chooses itself); the text names it and the fix.
    #[error("{0}")]
    Setting(String),
    /// The peer's bootstrap record rules the path out (e.g. it cannot
    /// reassemble the segmented datagrams this MTU needs).
    #[error(transparent)]
    Peer(#[from] BootstrapError),
    /// The fabric refused a step: `what` names it and its address, `hint`
    /// the likely fix where it can tell.
    #[error("{what}{}", hint.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    Fabric {
        /// The step and its address (`opening a soft RoCEv2 port on …`).
        what: String,
        /// The likely fix, if known.
        hint: Option<String>,
        /// What the provider said.
        #[source]
        source: FabricError,
    },
    /// The UD socket over a queue pair could not be made.
    #[error("UD socket on {on}")]
    Socket {
        /// The queue pair's address.
        on: String,
        /// Why.
        #[source]
        source: SocketError,
    },
}

impl OpenError {
    fn fabric(what: impl Into<String>) -> impl FnOnce(FabricError) -> OpenError {
        let what = what.into();
        move |source| OpenError::Fabric {
            what,
            hint: None,
            source,
        }
    }

    fn socket(on: impl ToString) -> impl FnOnce(SocketError) -> OpenError {
        let on = on.to_string();
        move |source| OpenError::Socket { on, source }
    }
}

fn not_built_in(kind: Provider) -> String {
    match kind {
        Provider::Verbs => "provider `verbs` is not built into this version of qr: rebuild with \
             `cargo build -p quic-rdma-tools --features verbs` (needs libibverbs-dev, \
             librdmacm-dev, libclang-dev), or use `--provider soft` / `--provider sim`"
            .into(),
        kind => format!(
            "provider `{kind}` is not built into this version of qr yet; \
             use `--provider sim` (the in-process fabric, no hardware needed)"
        ),
    }
}

/// Open a server socket and a client socket on provider `kind`.
///
/// This is, with [`open_endpoint`], the only place that knows about individual
/// providers on QUIC's behalf: a provider added here reaches `qr demo`, `qr
/// serve` and `qr connect` (`qr ud-pingpong` opens bare QPs). `soft` endpoints
/// live in separate processes, so `soft` has no in-process pair (`qr demo
/// --provider soft` spawns `qr serve` instead).
pub(crate) fn open_pair(kind: Provider, opts: &FabricOptions) -> Result<SocketPair, OpenError> {
    match kind {
        Provider::Sim => open_sim(opts),
        Provider::Soft => Err(OpenError::Unsupported(
            "provider `soft` runs each endpoint in its own process: \
             use `qr serve` / `qr connect`"
                .into(),
        )),
        #[cfg(feature = "verbs")]
        Provider::Verbs => Err(OpenError::Unsupported(
            "`qr demo` has no verbs pair yet: run `qr serve --provider verbs` and \
             `qr connect --provider verbs` (one endpoint each)"
                .into(),
        )),
        #[cfg(not(feature = "verbs"))]
        Provider::Verbs => Err(OpenError::NotBuiltIn(kind)),
    }
}

/// Where one endpoint of a multi-process provider lives.
#[derive(Clone, Debug)]
pub(crate) struct EndpointOptions {
    /// The local IP: the endpoint's GID (IPv4-mapped for IPv4).
    pub(crate) ip: IpAddr,
    /// UDP port of the RoCEv2 socket (4791, the interoperable default).
    pub(crate) udp_port: u16,
    /// Active MTU.
    pub(crate) mtu: Mtu,
    /// Q_Key of the QP.
    pub(crate) qkey: u32,
    /// The peer, when known (client side): its UDP port and MTU are applied.
    pub(crate) peer: Option<PeerInfo>,
    /// QPN of the endpoint's QP (`soft`: the port's first QPN); provider's choice if `None`.
    pub(crate) qpn: Option<u32>,
}

impl EndpointOptions {
    /// Defaults for `ip`: UDP 4791, the RoCE MTU of `ip`'s netdev as kernel
    /// rxe would take it (1024 on 1500-byte Ethernet; 4096 if no local
    /// interface holds `ip`), the default Q_Key, no peer yet.
    pub(crate) fn new(ip: IpAddr) -> Self {
        EndpointOptions {
            ip,
            udp_port: quic_rdma::fabric::ROCEV2_UDP_PORT,
            mtu: quic_rdma::fabric::soft::netdev::roce_mtu_of(ip).unwrap_or(Mtu::M4096),
            qkey: DEFAULT_QKEY,
            peer: None,
            qpn: None,
        }
    }
}

/// One endpoint's socket, for `qr serve` and `qr connect`.
pub(crate) struct EndpointSocket {
    /// The provider that made it.
    pub(crate) kind: Provider,
    /// The quinn-ready socket.
    pub(crate) socket: Socket,
    /// The `soft` port under it (its counters, its bootstrap record).
    pub(crate) soft: Option<SoftPort>,
    /// What a bootstrap server publishes for this endpoint (`soft`).
    pub(crate) publish: Option<PeerInfo>,
}

/// Open one endpoint on provider `kind` (the multi-process counterpart of [`open_pair`]).
///
/// The endpoint's wake-ups come through its queue pair's readiness descriptor
/// (the `soft` socket, the `verbs` completion channel), which the quinn adapter
/// watches itself.
pub(crate) fn open_endpoint(
    kind: Provider,
    opts: &EndpointOptions,
) -> Result<EndpointSocket, OpenError> {
    match kind {
        Provider::Sim => Err(OpenError::Unsupported(
            "provider `sim` is an in-process fabric: it has no endpoints for other \
             processes (use `qr demo`, or `--provider soft`)"
                .into(),
        )),
        Provider::Soft => open_soft(opts),
        #[cfg(feature = "verbs")]
        Provider::Verbs => open_verbs(opts),
        #[cfg(not(feature = "verbs"))]
        Provider::Verbs => Err(OpenError::NotBuiltIn(kind)),
    }
}

/// A UD QP on libibverbs whose GID is `opts.ip` (IPv4-mapped for IPv4). The
/// device sends RoCEv2 to UDP port 4791 only, so the peer must listen there.
#[cfg(feature = "verbs")]
fn open_verbs(opts: &EndpointOptions) -> Result<EndpointSocket, OpenError> {
    use quic_rdma::fabric::verbs::VerbsQp;
    use quic_rdma::fabric::ROCEV2_UDP_PORT;
    let qp = VerbsQp::open(&verbs_options(opts)?).map_err(OpenError::fabric(format!(
        "opening a verbs UD QP on GID {}",
        opts.ip
    )))?;
    let on = format!("{} GID index {}", qp.device_name(), qp.gid_index());
    let qp: Box<dyn UdQueuePair> = Box::new(qp);
    let sock = UdSocket::new(qp, SocketConfig::default()).map_err(OpenError::socket(on))?;
    let publish = PeerInfo::of_socket(&sock, ROCEV2_UDP_PORT);
    Ok(EndpointSocket {
        kind: Provider::Verbs,
        socket: Arc::new(RdmaUdpSocket::new(sock)),
        soft: None,
        publish: Some(publish),
    })
}

/// The verbs options for `opts`, refusing what a device does not let us choose.
#[cfg(feature = "verbs")]
fn verbs_options(
    opts: &EndpointOptions,
) -> Result<quic_rdma::fabric::verbs::VerbsOptions, OpenError> {
    use quic_rdma::fabric::verbs::VerbsOptions;
    use quic_rdma::fabric::ROCEV2_UDP_PORT;
    if opts.udp_port != ROCEV2_UDP_PORT {
        return Err(OpenError::Setting(format!(
            "provider `verbs`: the device's RoCEv2 UDP port is {ROCEV2_UDP_PORT}, not {}",
            opts.udp_port
        )));
    }
    if let Some(p) = opts.peer {
        if p.udp_port != ROCEV2_UDP_PORT {
            return Err(OpenError::Setting(format!(
                "the peer listens on UDP port {}: a verbs device reaches RoCEv2 peers on port \
                 {ROCEV2_UDP_PORT} only",
                p.udp_port
            )));
        }
    }
    if opts.qpn.is_some() {
        return Err(OpenError::Setting(
            "provider `verbs`: the device chooses the QPN (--qpn is for soft)".into(),
        ));
    }
    Ok(VerbsOptions {
        gid: Some(opts.ip.into()),
        qkey: opts.peer.map_or(opts.qkey, |p| p.addr.qkey),
        ..VerbsOptions::default()
    })
}

/// Makes queue pairs one at a time (the gateway's one per client).
pub(crate) type QpMaker = Arc<dyn Fn() -> Result<Box<dyn UdQueuePair>, FabricError> + Send + Sync>;

/// Queue pairs on provider `kind` at `opts.ip`, made on demand, each with the
/// Q_Key of `opts.peer` and sending to its UDP port: the maker and the active
/// MTU they run at (`soft`: `opts.mtu`; `verbs`: the device's). One is made
/// here, so a provider that cannot open fails now, not per client.
pub(crate) fn qp_maker(
    kind: Provider,
    opts: &EndpointOptions,
) -> Result<(QpMaker, Mtu), OpenError> {
    let qkey = opts.peer.map_or(opts.qkey, |p| p.addr.qkey);
    let maker: QpMaker = match kind {
        Provider::Sim => {
            return Err(OpenError::Unsupported(
                "provider `sim` is an in-process fabric: other processes cannot reach it \
                 (use `--provider soft` or `verbs`)"
                    .into(),
            ))
        }
        Provider::Soft => {
            let mut cfg = soft_config(opts.ip, opts.udp_port)?;
            cfg.mtu = opts.mtu;
            let port = open_soft_port(cfg)?;
            if let Some(p) = opts.peer {
                // Set before any AH exists.
                p.apply(&port);
            }
            Arc::new(move || {
                port.create_qp(qkey)
                    .map(|q| Box::new(q) as Box<dyn UdQueuePair>)
            })
        }
        #[cfg(feature = "verbs")]
        Provider::Verbs => {
            // Each queue pair opens the device for itself (a context, PD and
            // CQs of its own): simple, and what a per-client QP costs anyway.
            let vopts = verbs_options(opts)?;
            Arc::new(move || {
                quic_rdma::fabric::verbs::VerbsQp::open(&vopts)
                    .map(|q| Box::new(q) as Box<dyn UdQueuePair>)
            })
        }
        #[cfg(not(feature = "verbs"))]
        Provider::Verbs => return Err(OpenError::NotBuiltIn(kind)),
    };
    let first = maker().map_err(OpenError::fabric(format!("a {kind} QP on {}", opts.ip)))?;
    let mtu = first.attr().active_mtu;
    Ok((maker, mtu))
}

/// Environment variable: packets per UDP GSO `sendmsg` of a `soft` port
/// ([`SoftConfig::gso_segments`]); 1 sends each packet on its own, which a
/// packet capture on the sending host needs to see every datagram as itself.
pub(crate) const GSO_ENV: &str = "QR_SOFT_GSO_SEGMENTS";

/// A `soft` port's configuration on `ip`:`udp_port`, with [`GSO_ENV`] applied.
pub(crate) fn soft_config(ip: std::net::IpAddr, udp_port: u16) -> Result<SoftConfig, OpenError> {
    let mut cfg = SoftConfig::new(ip).with_port(udp_port);
    if let Ok(v) = std::env::var(GSO_ENV) {
        cfg.gso_segments = v.parse().ok().filter(|&n: &usize| n >= 1).ok_or_else(|| {
            OpenError::Setting(format!("{GSO_ENV}={v:?}: expected a whole number >= 1"))
        })?;
    }
    Ok(cfg)
}

/// Open a `soft` port; a failure names the address and, for the causes we
/// can tell apart, the fix.
pub(crate) fn open_soft_port(cfg: SoftConfig) -> Result<SoftPort, OpenError> {
    let at = cfg.bind;
    SoftPort::open(cfg).map_err(|e| {
        let hint = match &e {
            FabricError::Io(io) => match io.kind() {
                io::ErrorKind::AddrInUse => Some(format!(
                    "{at} is taken: is another endpoint already bound there? each endpoint \
                     needs its own IP, or its own --udp-port"
                )),
                io::ErrorKind::AddrNotAvailable => Some(format!(
                    "{} is not an address of this host: use one of its own IPs (`ip addr`)",
                    at.ip()
                )),
                _ => None,
            },
            _ => None,
        };
        OpenError::Fabric {
            what: format!("opening a soft RoCEv2 port on {at}"),
            hint,
            source: e,
        }
    })
}

/// Fail at once, before any network traffic, when `kind` is not compiled in.
pub(crate) fn ensure_built_in(kind: Provider) -> Result<(), OpenError> {
    if kind == Provider::Verbs && !cfg!(feature = "verbs") {
        return Err(OpenError::NotBuiltIn(kind));
    }
    Ok(())
}

fn open_soft(opts: &EndpointOptions) -> Result<EndpointSocket, OpenError> {
    let mut cfg = soft_config(opts.ip, opts.udp_port)?;
    // Talk at the smaller of the two MTUs, like two ports negotiating; below
    // 2048 that means segmented datagrams, which the peer must reassemble
    // (docs/architecture.md §6) or be told why not, before any packet.
    cfg.mtu = match opts.peer {
        Some(p) if p.mtu.bytes() < opts.mtu.bytes() => p.mtu,
        _ => opts.mtu,
    };
    if let Some(p) = &opts.peer {
        p.check_segmentation(cfg.mtu)?;
    }
    if let Some(qpn) = opts.qpn {
        cfg.first_qpn = qpn;
    }
    let port = open_soft_port(cfg)?;
    if let Some(peer) = &opts.peer {
        // Before any address handle exists: AHs resolve the peer's UDP port.
        peer.apply(&port);
    }
    let qkey = opts.peer.map_or(opts.qkey, |p| p.addr.qkey);
    let qp = port
        .create_qp(qkey)
        .map_err(OpenError::fabric(format!("soft QP with Q_Key {qkey:#x}")))?;
    let publish = PeerInfo::of(&qp);
    let qp: Box<dyn UdQueuePair> = Box::new(qp);
    let sock = UdSocket::new(qp, SocketConfig::default()).map_err(OpenError::socket(port.gid()))?;
    Ok(EndpointSocket {
        kind: Provider::Soft,
        socket: Arc::new(RdmaUdpSocket::new(sock)),
        soft: Some(port),
        publish: Some(publish),
    })
}

fn open_sim(opts: &FabricOptions) -> Result<SocketPair, OpenError> {
    let fabric = SimFabric::new(SimConfig {
        faults: opts.sim_faults(),
        seed: opts.seed,
        ..SimConfig::default()
    });
    let socket = |n: u16| -> Result<Socket, OpenError> {
        let gid = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n);
        let qp = fabric
            .create_qp(gid.into(), SimQpOptions::default())
            .map_err(OpenError::fabric(format!("sim QP on {gid}")))?;
        let qp: Box<dyn UdQueuePair> = Box::new(qp);
        let sock = UdSocket::new(qp, SocketConfig::default()).map_err(OpenError::socket(gid))?;
        Ok(Arc::new(RdmaUdpSocket::new(sock)))
    };
    Ok(SocketPair {
        kind: Provider::Sim,
        server: socket(1)?,
        client: socket(2)?,
        sim: Some(fabric),
    })
}
