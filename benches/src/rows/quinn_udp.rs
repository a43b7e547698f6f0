//! Row: quinn 0.11 over UDP on loopback, at quinn's default MTU or a set one.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use super::quic::{QuinnDialer, QuinnListener};
use super::stack::{AsyncStack, BoxFut, Dialer, Listener};
use crate::tls::Tls;

/// quinn over a UDP socket on 127.0.0.1.
#[derive(Debug)]
pub struct QuinnUdp {
    mtu: Option<u16>,
    tls: Tls,
}

impl QuinnUdp {
    /// `mtu: None` keeps quinn's defaults (1200 initial, discovery up to 1452);
    /// `Some(m)` sets `max_udp_payload_size` and `initial_mtu` to `m` on both sides.
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
        let mut t = quinn::TransportConfig::default();
        if let Some(m) = self.mtu {
            t.initial_mtu(m);
        }
        Arc::new(t)
    }

    fn endpoint(&self, server: Option<quinn::ServerConfig>) -> anyhow::Result<quinn::Endpoint> {
        let sock = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
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
                format!("quinn 0.11 over UDP loopback, max_udp_payload_size = initial_mtu = {m}")
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
