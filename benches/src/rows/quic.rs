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
            if std::env::var_os("BENCH_QUINN_STATS").is_some() {
                print_stats(
                    if self.client { "client" } else { "server" },
                    &self.conn.stats(),
                );
            }
            if self.client {
                self.conn.close(0u32.into(), b"done");
            } else {
                let _ = tokio::time::timeout(Duration::from_secs(2), self.conn.closed()).await;
            }
            Ok(())
        })
    }
}

/// `BENCH_QUINN_STATS`: what limited a side (why a quinn side idles).
/// ACKs and ACK_FREQUENCY frames show whether a `BENCH_TUNE` ackfreq setting
/// took effect; the flow-control frames (MAX_DATA, MAX_STREAM_DATA sent by the
/// receiver, DATA_BLOCKED, STREAM_DATA_BLOCKED sent by a blocked sender) and
/// the UDP I/O counts (datagrams per I/O call: the batch sizes) what paced it.
fn print_stats(side: &str, st: &quinn::ConnectionStats) {
    let (tx, rx) = (&st.frame_tx, &st.frame_rx);
    eprintln!(
        "{side}: {:?} acks_rx={} acks_tx={} ack_frequency_tx={} \
         max_data_tx={} max_stream_data_tx={} data_blocked_tx={} stream_data_blocked_tx={} \
         udp_tx={}/{} ios udp_rx={}/{} ios",
        st.path,
        rx.acks,
        tx.acks,
        tx.ack_frequency,
        tx.max_data,
        tx.max_stream_data,
        tx.data_blocked,
        tx.stream_data_blocked,
        st.udp_tx.datagrams,
        st.udp_tx.ios,
        st.udp_rx.datagrams,
        st.udp_rx.ios,
    );
}
