//! The admission path both directions share: which client a datagram belongs
//! to, who gets a new entry, when an entry is validated, and the counters of
//! all of it (see the [module docs](super)).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use quic_rdma::quic::{is_client_initial, CidKey};

use super::table::{Activity, Admission, ClientTable, Refusal};
use super::validation::Validation;
use super::{GatewayStats, Limits};

/// A client entry's state: its validation, whatever else it holds.
pub(super) trait HasValidation {
    /// The client's validation state.
    fn validation(&self) -> &Validation;
}

/// The client table with its counters and the key hashing the server's CIDs.
pub(super) struct Clients<V> {
    table: ClientTable<SocketAddr, V>,
    cid_key: Arc<CidKey>,
    stats: Arc<GatewayStats>,
    /// See [`Validation`]: non-random bits of the server's CIDs.
    predictable_bits: u32,
}

/// Where a datagram goes.
pub(super) struct Routed<V> {
    /// Its client.
    pub(super) client: V,
    /// This datagram validated the client.
    pub(super) validated_now: bool,
}

impl<V: Clone + HasValidation> Clients<V> {
    pub(super) fn new(limits: Limits, stats: Arc<GatewayStats>, predictable_bits: u32) -> Self {
        Clients {
            table: ClientTable::new(limits),
            cid_key: Arc::default(),
            stats,
            predictable_bits,
        }
    }

    /// The key hashing the server's CIDs, for the reply tasks.
    pub(super) fn cid_key(&self) -> Arc<CidKey> {
        self.cid_key.clone()
    }

    /// The client `datagram` from `from` belongs to: a known one (its
    /// datagram accounted, perhaps validating it), or a new one if the
    /// datagram is a client Initial and the table admits it (`make` builds its
    /// state). `None` (counted) for anything else.
    pub(super) fn route(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        now: Instant,
        make: impl FnOnce(Arc<Activity>, Validation) -> io::Result<V>,
    ) -> Option<Routed<V>> {
        if let Some((client, validated)) = self.table.get(&from, now) {
            let client = client.clone();
            let proves = !validated
                && client
                    .validation()
                    .heard_from_client(datagram, &self.cid_key);
            let validated_now = proves && self.table.validate(&from);
            if validated_now {
                client.validation().set_validated();
                self.stats.clients_validated.inc();
                self.gauges();
            }
            return Some(Routed {
                client,
                validated_now,
            });
        }
        if !is_client_initial(datagram) {
            self.stats.drop_not_initial.inc();
            return None;
        }
        let bits = self.predictable_bits;
        let admitted = self.table.admit(&from, from.ip(), now, |activity| {
            make(activity, Validation::new(datagram, bits))
        });
        let client = match admitted {
            Ok(Admission::New { value, evicted }) => {
                let client = value.clone();
                if evicted.is_some() {
                    self.stats.clients_evicted.inc();
                }
                self.stats.clients_admitted.inc();
                self.gauges();
                tracing::debug!(client = %from, "gateway: new client");
                client
            }
            Ok(Admission::Refused(Refusal::SourceLimit)) => {
                self.stats.drop_source_limit.inc();
                return None;
            }
            Ok(Admission::Refused(Refusal::Full)) => {
                self.stats.drop_refused.inc();
                return None;
            }
            Err(e) => {
                tracing::warn!(%e, client = %from, "gateway: no resources for a new client");
                self.stats.drop_client_setup.inc();
                return None;
            }
        };
        Some(Routed {
            client,
            validated_now: false,
        })
    }

    /// Remove what expired by `now`.
    pub(super) fn sweep(&mut self, now: Instant) {
        let gone = self.table.expire(now);
        self.stats
            .clients_expired_unvalidated
            .add(gone.unvalidated.len() as u64);
        self.stats.clients_expired.add(gone.idle.len() as u64);
        self.gauges();
    }

    fn gauges(&self) {
        self.stats.clients_active.set(self.table.len() as i64);
        self.stats
            .clients_unvalidated
            .set(self.table.unvalidated() as i64);
    }
}
