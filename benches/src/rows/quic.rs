//! The quinn halves shared by every quinn row (over UDP or over a UD socket).

use std::net::SocketAddr;
use std::time::Duration;

use super::stack::{BoxFut, Dialer, Listener, Reader, Session, Writer};
use crate::tls::SERVER_NAME;

/// A quinn endpoint accepting connections.
pub(crate) struct QuinnListener(pub(crate) quinn::Endpoint);

/// A quinn endpoint connecting to one server.
pub(crate) struct QuinnDialer {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) server: SocketAddr,
    pub(crate) config: quinn::ClientConfig,
}

struct QuinnSession {
    conn: quinn::Connection,
    client: bool,
}

impl Listener for QuinnListener {
    fn accept(&mut self) -> BoxFut<'_, Box<dyn Session>> {
        Box::pin(async move {
            let inc = self
                .0
                .accept()
                .await
                .ok_or_else(|| anyhow::anyhow!("endpoint closed"))?;
            let conn = inc.await?;
            Ok(Box::new(QuinnSession {
                conn,
                client: false,
            }) as Box<dyn Session>)
        })
    }
}

impl Dialer for QuinnDialer {
    fn connect(&mut self) -> BoxFut<'_, Box<dyn Session>> {
        Box::pin(async move {
            let conn = self
                .endpoint
                .connect_with(self.config.clone(), self.server, SERVER_NAME)?
                .await?;
            Ok(Box::new(QuinnSession { conn, client: true }) as Box<dyn Session>)
        })
    }

    fn shutdown(self: Box<Self>) -> BoxFut<'static, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
            Ok(())
        })
    }
}

impl Session for QuinnSession {
    fn open(&mut self) -> BoxFut<'_, (Reader, Writer)> {
        Box::pin(async move {
            let (tx, rx) = self.conn.open_bi().await?;
            Ok((Box::new(rx) as Reader, Box::new(tx) as Writer))
        })
    }

    fn accept(&mut self) -> BoxFut<'_, (Reader, Writer)> {
        Box::pin(async move {
            let (tx, rx) = self.conn.accept_bi().await?;
            Ok((Box::new(rx) as Reader, Box::new(tx) as Writer))
        })
    }

    fn close(self: Box<Self>) -> BoxFut<'static, ()> {
        Box::pin(async move {
            if self.client {
                if std::env::var_os("BENCH_QUINN_STATS").is_some() {
                    let st = self.conn.stats();
                    // ACKs received and ACK_FREQUENCY frames sent: shows whether a
                    // BENCH_TUNE ackfreq setting took effect.
                    eprintln!(
                        "{:?} acks_rx={} ack_frequency_tx={}",
                        st.path, st.frame_rx.acks, st.frame_tx.ack_frequency
                    );
                }
                self.conn.close(0u32.into(), b"done");
            } else {
                let _ = tokio::time::timeout(Duration::from_secs(2), self.conn.closed()).await;
            }
            Ok(())
        })
    }
}
