//! Row: quinn through quic-rdma's `AsyncUdpSocket` adapter over the `sim` fabric.

use std::net::{Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::quinn_adapter;
use quic_rdma::socket::{SocketConfig, UdSocket};

use super::quic::{QuinnDialer, QuinnListener};
use super::stack::{AsyncStack, BoxFut, Dialer, Listener};
use crate::tls::Tls;

/// quinn endpoints over UD sockets on one simulated fabric (MTU 4096, no faults).
#[derive(Debug)]
pub struct QuinnSim {
    fabric: SimFabric,
    next_gid: AtomicU16,
    tls: Tls,
}

impl Default for QuinnSim {
    fn default() -> Self {
        Self::new()
    }
}

impl QuinnSim {
    /// A fresh fabric with the default (ideal NIC) configuration.
    pub fn new() -> Self {
        QuinnSim {
            fabric: SimFabric::new(SimConfig::default()),
            next_gid: AtomicU16::new(1),
            tls: Tls::new(),
        }
    }

    fn endpoint(&self, server: bool) -> anyhow::Result<(quinn::Endpoint, usize)> {
        let n = self.next_gid.fetch_add(1, Ordering::Relaxed);
        let gid = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into();
        let qp = self.fabric.create_qp(gid, SimQpOptions::default())?;
        let sock = crate::tuning::adapter_socket(UdSocket::new(qp, SocketConfig::default())?);
        let mtu = sock.mtu();
        let server = server.then(|| self.tls.quinn_server(crate::tuning::transport(mtu)));
        let ep = quinn_adapter::FabricConfig::of(&sock)
            .routing_key(u32::from(n))
            .endpoint(Arc::new(sock), server)?;
        Ok((ep, mtu))
    }
}

impl AsyncStack for QuinnSim {
    fn name(&self) -> String {
        "quinn-adapter/sim".into()
    }

    fn description(&self) -> String {
        "quinn 0.11 over quic-rdma's AsyncUdpSocket adapter, sim fabric, MTU 4096, tuned transport"
            .into()
    }

    fn crosses_processes(&self) -> bool {
        false
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
