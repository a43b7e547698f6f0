//! Rows over the `soft` provider: real RoCEv2 packets on UDP loopback, each
//! endpoint its own 127.77.x.y address (its GID) on port 4791 — the engine
//! busy-polled (`engine/soft`) and quinn through the adapter (`quinn-adapter/soft`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{Mtu, DEFAULT_QKEY};
use quic_rdma::quinn_adapter;
use quic_rdma::socket::{SocketConfig, UdSocket};

use super::engine::QpPairs;
use super::quic::{QuinnDialer, QuinnListener};
use super::stack::{AsyncStack, BoxFut, Dialer, Listener};
use crate::tls::Tls;

/// Fresh loopback addresses, 127.77.<pid-derived>.<counter>, so concurrent
/// processes (tests) rarely collide on port 4791.
#[derive(Debug)]
struct Addrs;

impl Addrs {
    fn new() -> Self {
        Addrs
    }

    fn next(&self) -> IpAddr {
        // One counter for the process: every `soft` row (busy, adaptive, the
        // adapter's) gets addresses no other row of this process is releasing.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let third = (std::process::id() % 250) as u8;
        Ipv4Addr::new(127, 77, third, 1 + (n % 250) as u8).into()
    }

    /// A queue pair on a fresh address, its port at active MTU `mtu`.
    fn qp(&self, mtu: Mtu) -> anyhow::Result<SoftQp> {
        let mut cfg = SoftConfig::new(self.next());
        cfg.mtu = mtu;
        let port = SoftPort::open(cfg)?;
        Ok(port.create_qp(DEFAULT_QKEY)?)
    }
}

/// The row-name suffix of a `soft` row at `mtu`: none at 4096, the MTU else
/// (`soft-1024`: RoCE on a 1500-byte Ethernet link, datagrams segmented).
fn suffix(mtu: Mtu) -> String {
    match mtu {
        Mtu::M4096 => String::new(),
        m => format!("-{}", m.bytes()),
    }
}

fn mtu_words(mtu: Mtu) -> String {
    match mtu {
        Mtu::M4096 => "MTU 4096".into(),
        m => format!(
            "RoCE MTU {} (a 1500-byte Ethernet link), QUIC datagrams of up to {} bytes \
             segmented",
            m.bytes(),
            quic_rdma::socket::segment::datagram_mtu(m.bytes())
        ),
    }
}

/// `soft` queue pairs on two loopback addresses (MTU 4096 unless
/// [`with_mtu`](Self::with_mtu), ICRC verified).
#[derive(Debug)]
pub struct SoftPairs(Addrs, Mtu);

impl SoftPairs {
    /// Pairs on fresh loopback addresses.
    pub fn new() -> Self {
        SoftPairs(Addrs::new(), Mtu::M4096)
    }

    /// Pairs whose ports run at active MTU `mtu`.
    pub fn with_mtu(mtu: Mtu) -> Self {
        SoftPairs(Addrs::new(), mtu)
    }
}

impl Default for SoftPairs {
    fn default() -> Self {
        Self::new()
    }
}

impl QpPairs for SoftPairs {
    type Qp = SoftQp;

    fn name(&self) -> String {
        format!("soft{}", suffix(self.1))
    }

    fn description(&self) -> String {
        format!(
            "soft provider: userspace RoCEv2 over UDP loopback (127.77.x.y:4791), {}, ICRC checked",
            mtu_words(self.1)
        )
    }

    fn make(&self) -> anyhow::Result<(SoftQp, SoftQp)> {
        Ok((self.0.qp(self.1)?, self.0.qp(self.1)?))
    }

    fn crosses_processes(&self) -> bool {
        true
    }

    fn make_one(&self) -> anyhow::Result<SoftQp> {
        self.0.qp(self.1)
    }
}

/// quinn through the adapter over `soft` queue pairs.
#[derive(Debug)]
pub struct QuinnSoft {
    addrs: Addrs,
    tls: Tls,
    mtu: Mtu,
}

impl QuinnSoft {
    /// Endpoints on fresh loopback addresses.
    pub fn new() -> Self {
        Self::with_mtu(Mtu::M4096)
    }

    /// Endpoints whose ports run at active MTU `mtu`.
    pub fn with_mtu(mtu: Mtu) -> Self {
        QuinnSoft {
            addrs: Addrs::new(),
            tls: Tls::new(),
            mtu,
        }
    }

    fn endpoint(&self, server: bool) -> anyhow::Result<(quinn::Endpoint, usize)> {
        let sock = crate::tuning::adapter_socket(UdSocket::new(
            self.addrs.qp(self.mtu)?,
            SocketConfig::default(),
        )?);
        let mtu = sock.mtu();
        let server = server.then(|| self.tls.quinn_server(crate::tuning::transport(mtu)));
        let key = if server.is_some() { 0x50f } else { 0xc11 };
        let ep = quinn_adapter::FabricConfig::of(&sock)
            .routing_key(key)
            .endpoint(Arc::new(sock), server)?;
        Ok((ep, mtu))
    }
}

impl Default for QuinnSoft {
    fn default() -> Self {
        Self::new()
    }
}

impl AsyncStack for QuinnSoft {
    fn name(&self) -> String {
        format!("quinn-adapter/soft{}", suffix(self.mtu))
    }

    fn description(&self) -> String {
        format!(
            "quinn 0.11 over quic-rdma's adapter over the soft provider (RoCEv2 on UDP loopback), {}, tuned transport",
            mtu_words(self.mtu)
        )
    }

    fn listen(&self) -> BoxFut<'_, (Box<dyn Listener>, SocketAddr)> {
        Box::pin(async move {
            let (ep, _) = self.endpoint(true)?;
            let addr = ep.local_addr()?;
            Ok((Box::new(QuinnListener(ep)) as Box<dyn Listener>, addr))
        })
    }

    fn dialer(&self, server: SocketAddr) -> BoxFut<'_, Box<dyn Dialer>> {
        Box::pin(async move {
            let (endpoint, mtu) = self.endpoint(false)?;
            Ok(Box::new(QuinnDialer {
                endpoint,
                server,
                config: self.tls.quinn_client(crate::tuning::transport(mtu)),
            }) as Box<dyn Dialer>)
        })
    }
}
