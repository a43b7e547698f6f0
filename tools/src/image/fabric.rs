//! The node agent's dialer over the fabric: [`crate::channel_endpoint`]'s
//! bootstrap query and handshake, one client endpoint kept and reused for
//! redials (a restarted registry agent publishes a new QPN, found again
//! through its bootstrap service) and shared by the dialers of its peers
//! (one RoCEv2 socket per node agent, whoever it talks to).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::client::{DialFuture, Dialer};
use crate::channel_endpoint::{dial, ChannelClient, DialOptions};
use crate::identity::Identity;

/// Dials the registry agent behind a bootstrap service.
pub struct FabricDialer {
    service: String,
    server_name: String,
    opts: DialOptions,
    tls: Arc<Identity>,
    client: Arc<Mutex<Option<ChannelClient>>>,
}

impl FabricDialer {
    /// A dialer of `service` (HOST:PORT of the registry agent's bootstrap
    /// service), verifying its certificate for `server_name`; each dial
    /// presents the identity `tls` holds then (ALPN [`super::wire::ALPN`]),
    /// so a certificate reloaded on SIGHUP is used from the next dial on.
    pub fn new(
        service: &str,
        server_name: &str,
        opts: DialOptions,
        tls: Arc<Identity>,
    ) -> FabricDialer {
        FabricDialer {
            service: service.to_string(),
            server_name: server_name.to_string(),
            opts,
            tls,
            client: Arc::new(Mutex::new(None)),
        }
    }

    /// A dialer of another server (a peer node agent's bootstrap service)
    /// through this one's client endpoint, asking its bootstrap service for
    /// at most `wait`.
    pub fn sharing(&self, service: &str, server_name: &str, wait: Duration) -> FabricDialer {
        let mut opts = self.opts.clone();
        opts.wait = wait;
        FabricDialer {
            service: service.to_string(),
            server_name: server_name.to_string(),
            opts,
            tls: self.tls.clone(),
            client: self.client.clone(),
        }
    }
}

impl Dialer for FabricDialer {
    fn dial(&self) -> DialFuture<'_> {
        Box::pin(async move {
            let config = self.tls.current().client_config(super::wire::ALPN)?;
            let mut g = self.client.lock().await;
            if let Some(c) = g.as_ref() {
                let conn = c
                    .connect_within(&self.service, config, &self.server_name, self.opts.wait)
                    .await?;
                return Ok((c.endpoint().clone(), conn));
            }
            let (c, conn) = dial(&self.service, &self.opts, config, &self.server_name).await?;
            let ep = c.endpoint().clone();
            *g = Some(c);
            Ok((ep, conn))
        })
    }
}
