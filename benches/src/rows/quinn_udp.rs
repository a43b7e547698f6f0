//! Row: quinn 0.11 over UDP on loopback, at quinn's default MTU or a set one.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use super::quic::{QuinnDialer, QuinnListener};
use super::stack::{AsyncStack, BoxFut, Dialer, Listener};
use crate::tls::Tls;

/// `SO_RCVBUF`/`SO_SNDBUF` of the tuned rows: what the `soft` provider asks for
/// (`quic_rdma::fabric::soft::SoftConfig::recv_buffer`, 4 MiB; the kernel caps
/// it at `net.core.rmem_max`).
pub const SOCKET_BUFFER: usize = 4 << 20;

/// quinn over a UDP socket on 127.0.0.1.
#[derive(Debug)]
pub struct QuinnUdp {
    mtu: Option<u16>,
    tls: Tls,
}

impl QuinnUdp {
    /// `mtu: None` keeps quinn's defaults (1200 initial, discovery up to 1452);
    /// `Some(m)` tunes it as the fabric rows are tuned, so the comparison is
    /// equal: `max_udp_payload_size`, `initial_mtu` and `min_mtu` `m` (no
    /// discovery), the same `TransportConfig` as the engine and adapter rows
    /// ([`quic_rdma::quinn_adapter::transport_config`]: 16/64 MiB windows), and
    /// the `soft` provider's socket buffers ([`SOCKET_BUFFER`]).
    pub fn new(mtu: Option<u16>) -> Self {
        QuinnUdp {
            mtu,
            tls: Tls::new(),
        }
    }

    fn endpoint_config(&self) -> quinn::EndpointConfig {
        let mut c = quinn::EndpointConfig::default();
        if let Some(m) = self.mtu {
            c.max_udp_payload_size(m).expect("MTU at least 1200");
        }
        c
    }

    fn transport(&self) -> Arc<quinn::TransportConfig> {
        match self.mtu {
            Some(m) => crate::tuning::transport(m.into()),
            None => Arc::new(quinn::TransportConfig::default()),
        }
    }

    fn endpoint(&self, server: Option<quinn::ServerConfig>) -> anyhow::Result<quinn::Endpoint> {
        let sock = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        if self.mtu.is_some() {
            let s = socket2::SockRef::from(&sock);
            s.set_recv_buffer_size(SOCKET_BUFFER)?;
            s.set_send_buffer_size(SOCKET_BUFFER)?;
        }
        Ok(quinn::Endpoint::new(
            self.endpoint_config(),
            server,
            sock,
            Arc::new(quinn::TokioRuntime),
        )?)
    }
}

impl AsyncStack for QuinnUdp {
    fn name(&self) -> String {
        match self.mtu {
            None => "quinn/udp".into(),
            Some(m) => format!("quinn/udp-{m}"),
        }
    }

    fn description(&self) -> String {
        match self.mtu {
            None => "quinn 0.11 over UDP loopback, quinn defaults (MTU 1200 + discovery)".into(),
            Some(m) => {
                format!("quinn 0.11 over UDP loopback, MTU {m} fixed, transport and socket buffers tuned as the fabric rows")
            }
        }
    }

    fn listen(&self) -> BoxFut<'_, (Box<dyn Listener>, SocketAddr)> {
        Box::pin(async move {
            let ep = self.endpoint(Some(self.tls.quinn_server(self.transport())))?;
            let addr = ep.local_addr()?;
            Ok((Box::new(QuinnListener(ep)) as Box<dyn Listener>, addr))
        })
    }

    fn dialer(&self, server: SocketAddr) -> BoxFut<'_, Box<dyn Dialer>> {
        Box::pin(async move {
            Ok(Box::new(QuinnDialer {
                endpoint: self.endpoint(None)?,
                server,
                config: self.tls.quinn_client(self.transport()),
            }) as Box<dyn Dialer>)
        })
    }
}
