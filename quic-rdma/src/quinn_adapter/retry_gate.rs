//! A quinn server's connection attempts screened by a [`RetryPolicy`]
//! (address validation, RFC 9000 §8.1.2): what every accept loop over the
//! adapter uses, so one policy and one count serve them all.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::quic::retry::RetryPolicy;

/// Screens attempts by a [`RetryPolicy`], counting the handshakes in flight
/// from unvalidated addresses; clones share the count.
///
/// ```no_run
/// # async fn serve(endpoint: quinn::Endpoint) {
/// use quic_rdma::quic::RetryPolicy;
/// use quic_rdma::quinn_adapter::RetryGate;
///
/// let gate = RetryGate::new(RetryPolicy::Auto);
/// while let Some(attempt) = gate.accept(&endpoint).await {
///     tokio::spawn(async move {
///         if let Ok(conn) = attempt.await {
///             // serve `conn`
///         }
///     });
/// }
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct RetryGate {
    policy: RetryPolicy,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    unvalidated: AtomicUsize,
    retries: AtomicU64,
}

impl RetryGate {
    /// A gate with `policy` and nothing counted yet.
    pub fn new(policy: RetryPolicy) -> Self {
        RetryGate {
            policy,
            counts: Arc::default(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// The next attempt on `endpoint` the policy lets through (those answered
    /// with a Retry are skipped); `None` once the endpoint is closed.
    pub async fn accept(&self, endpoint: &quinn::Endpoint) -> Option<Attempt> {
        loop {
            if let Some(a) = self.screen(endpoint.accept().await?) {
                return Some(a);
            }
        }
    }

    /// Answer `incoming` with a Retry if the policy asks for one (`None`),
    /// else hand it back as an [`Attempt`].
    pub fn screen(&self, incoming: quinn::Incoming) -> Option<Attempt> {
        let validated = incoming.remote_address_validated();
        let in_flight = self.counts.unvalidated.load(Ordering::Relaxed);
        if self
            .policy
            .should_retry(validated, incoming.may_retry(), in_flight)
        {
            // Cannot fail: `may_retry` was checked.
            if incoming.retry().is_ok() {
                self.counts.retries.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        let ticket = (!validated).then(|| {
            self.counts.unvalidated.fetch_add(1, Ordering::Relaxed);
            Ticket(self.counts.clone())
        });
        Some(Attempt { incoming, ticket })
    }

    /// Attempts answered with a Retry since the gate was made.
    pub fn retries(&self) -> u64 {
        self.counts.retries.load(Ordering::Relaxed)
    }

    /// Handshakes from unvalidated addresses in flight now.
    pub fn unvalidated_handshakes(&self) -> usize {
        self.counts.unvalidated.load(Ordering::Relaxed)
    }
}

/// Counts one unvalidated handshake while it lives.
#[derive(Debug)]
struct Ticket(Arc<Counts>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.unvalidated.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An attempt a [`RetryGate`] let through. Await it to accept it and complete
/// the handshake (as a `quinn::Incoming`); until then, if its address is not
/// validated, it counts toward the gate's unvalidated handshakes.
#[derive(Debug)]
pub struct Attempt {
    incoming: quinn::Incoming,
    ticket: Option<Ticket>,
}

impl Attempt {
    /// The peer's address as quinn sees it.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }

    /// Whether a token proved the peer's address (then it is not counted).
    pub fn remote_address_validated(&self) -> bool {
        self.incoming.remote_address_validated()
    }

    /// Accept it with `config` instead of the endpoint's server config (a
    /// peer that needs other transport settings, e.g. one behind a UDP
    /// gateway) and complete the handshake.
    pub async fn accept_with(
        self,
        config: Arc<quinn::ServerConfig>,
    ) -> Result<quinn::Connection, quinn::ConnectionError> {
        let Attempt { incoming, ticket } = self;
        let result = match incoming.accept_with(config) {
            Ok(connecting) => connecting.await,
            Err(e) => Err(e),
        };
        drop(ticket);
        result
    }

    /// Refuse it (CONNECTION_REFUSED).
    pub fn refuse(self) {
        self.incoming.refuse();
    }

    /// Drop it without answering.
    pub fn ignore(self) {
        self.incoming.ignore();
    }
}

impl IntoFuture for Attempt {
    type Output = Result<quinn::Connection, quinn::ConnectionError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Attempt { incoming, ticket } = self;
            let result = incoming.await;
            drop(ticket);
            result
        })
    }
}
