//! Several datasets behind one channel end: the upstream relay of a Redis
//! Cluster keeps one [`Master`] per shard and serves them all on each QUIC
//! connection. A session names its dataset with [`Frame::Select`] before its
//! `Hello`; session ids are unique in the process, so the replica end routes
//! every session's uni streams on the one connection as it always has.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::error::ChannelError;
use super::frame::{ErrorCode, Frame};
use super::master::{first_frame, refuse, Master};
use super::metrics::Metrics;
use super::stream::FrameReader;

/// Named masters served on shared connections.
#[derive(Clone, Debug)]
pub struct Datasets {
    named: Arc<BTreeMap<String, Master>>,
    /// Counts what fails before a session reaches its master.
    metrics: Arc<Metrics>,
}

impl Datasets {
    /// Serve `named`; failures before a dataset is chosen count in `metrics`.
    pub fn new(named: BTreeMap<String, Master>, metrics: Arc<Metrics>) -> Datasets {
        Datasets {
            named: Arc::new(named),
            metrics,
        }
    }

    /// The names served, comma-separated, for messages.
    fn names(&self) -> String {
        self.named.keys().cloned().collect::<Vec<_>>().join(" ")
    }

    /// Serve sessions on `conn` until it closes, each with the master it selects.
    pub async fn serve(&self, conn: quinn::Connection) -> Result<(), ChannelError> {
        while let Some((send, recv)) = super::master::next_session(&conn).await? {
            let (me, conn) = (self.clone(), conn.clone());
            tokio::spawn(async move {
                if let Err(e) = me.session(conn, send, recv).await {
                    tracing::info!("kv master: session ended: {e}");
                }
            });
        }
        Ok(())
    }

    async fn session(
        &self,
        conn: quinn::Connection,
        mut send: quinn::SendStream,
        recv: quinn::RecvStream,
    ) -> Result<(), ChannelError> {
        let mut ctl = FrameReader::new(recv);
        let refused = |e: ChannelError| {
            self.metrics.link_errors.fetch_add(1, Relaxed);
            if matches!(e, ChannelError::Frame(_) | ChannelError::Protocol(_)) {
                self.metrics.malformed.fetch_add(1, Relaxed);
            }
            e
        };
        let first = first_frame(&mut ctl).await.map_err(refused)?;
        let dataset = match first {
            Frame::Select { dataset } => dataset,
            other => {
                let e = ChannelError::Protocol(format!(
                    "this upstream relay follows a Redis Cluster: a session must name its \
                     shard (the downstream's --shard), one of {}; got {other:?}",
                    self.names()
                ));
                refuse(&mut send, ErrorCode::Unavailable, &e).await;
                return Err(refused(e));
            }
        };
        let Some(master) = self.named.get(&dataset) else {
            let e = ChannelError::Protocol(format!(
                "no shard {dataset:?} here; this upstream relay serves {}",
                self.names()
            ));
            refuse(&mut send, ErrorCode::Unavailable, &e).await;
            return Err(refused(e));
        };
        let hello = first_frame(&mut ctl).await.map_err(refused)?;
        let r = master.serve_session(conn, send, ctl, hello).await;
        if let Err(e) = &r {
            let m = master.metrics();
            m.link_errors.fetch_add(1, Relaxed);
            if matches!(e, ChannelError::Frame(_) | ChannelError::Protocol(_)) {
                m.malformed.fetch_add(1, Relaxed);
            }
        }
        r
    }
}
