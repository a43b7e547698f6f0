//! A channel agent's mutual-TLS identity for its whole life: loaded from
//! `--cert`/`--key`/`--ca` at start and loaded again on SIGHUP, so a
//! certificate is rotated without a restart (docs/operations.md
//! "Certificate rotation").
//!
//! A reload changes what *new* handshakes use: servers get a new crypto
//! config (quinn keeps its token key and transport, so address-validation
//! tokens stay good), clients build each dial's config from the current
//! identity. Connections already up keep the keys they agreed; nothing is
//! closed. Files that fail to load (a half-written copy, a key that does not
//! match) leave the old identity in place and are counted and logged with the
//! file and the fix.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quic_rdma::counters::{Counters, Metric};

use crate::metric::{Counter, Gauge, Text};
use crate::pki::{Mtls, MtlsArgs, PkiError};

/// What the reloads did, and when the certificate in use expires: the
/// `qr_tls_*` families of each channel agent's `/metrics`.
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Successful loads after the first (SIGHUP).
    pub reloads: Counter,
    /// Reloads refused (the old identity stayed in use).
    pub reload_failures: Counter,
    /// The `notAfter` of this agent's certificate in use, in seconds since
    /// the Unix epoch.
    pub certificate_expiration_timestamp_seconds: Gauge,
}

impl Counters for TlsStats {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            reloads: Counter, Count, "Certificate reloads that took effect (SIGHUP)";
            reload_failures: Counter, Count, "Certificate reloads refused: the old certificate stays in use";
            certificate_expiration_timestamp_seconds: Gauge, Seconds,
                "When this agent's certificate in use expires (notAfter), seconds since the Unix epoch";
        );
    }
}

impl TlsStats {
    /// The Prometheus text of these values (`qr_tls_*`).
    pub fn render(&self) -> String {
        Text::default().visited("qr_tls", self).render()
    }

    fn expires(&self, m: &Mtls) {
        let secs = m
            .not_after()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        let secs = i64::try_from(secs).unwrap_or(i64::MAX);
        self.certificate_expiration_timestamp_seconds.set(secs);
    }
}

/// The identity a channel agent presents and the CA it trusts, reloadable.
#[derive(Debug)]
pub struct Identity {
    files: MtlsArgs,
    current: RwLock<Arc<Mtls>>,
    stats: Arc<TlsStats>,
}

impl Identity {
    /// Load the three files (errors name the file and the fix).
    pub fn load(files: &MtlsArgs) -> Result<Arc<Identity>, PkiError> {
        let m = files.load()?;
        let stats = Arc::new(TlsStats::default());
        stats.expires(&m);
        Ok(Arc::new(Identity {
            files: files.clone(),
            current: RwLock::new(Arc::new(m)),
            stats,
        }))
    }

    /// The identity in use now.
    pub fn current(&self) -> Arc<Mtls> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The reload counters and the expiry gauge.
    pub fn stats(&self) -> &Arc<TlsStats> {
        &self.stats
    }

    /// Read the files again; on success the new identity is the current
    /// one and is returned, on failure the old one stays.
    pub fn reload(&self) -> Result<Arc<Mtls>, PkiError> {
        match self.files.load() {
            Ok(m) => {
                let m = Arc::new(m);
                self.stats.expires(&m);
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = m.clone();
                self.stats.reloads.inc();
                Ok(m)
            }
            Err(e) => {
                self.stats.reload_failures.inc();
                Err(e)
            }
        }
    }

    /// On every SIGHUP for the rest of the process: [`reload`](Self::reload),
    /// then hand the new identity to `apply` (which installs it on the
    /// agent's servers; clients read [`current`](Self::current) at each
    /// dial). `who` names the agent in the log lines. Call inside a tokio
    /// runtime.
    pub fn reload_on_hangup<E: std::error::Error + 'static>(
        self: &Arc<Self>,
        who: &'static str,
        apply: impl Fn(&Mtls) -> Result<(), E> + Send + 'static,
    ) {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!(target: "qr::tls", "{who}: cannot handle SIGHUP: certificates reload only on restart");
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let applied = match me.reload() {
                    Ok(m) => apply(&m).map(|()| m).map_err(|e| crate::logging::chain(&e)),
                    Err(e) => Err(crate::logging::chain(&e)),
                };
                match applied {
                    Ok(m) => tracing::info!(
                        target: "qr::tls",
                        "{who}: SIGHUP: reloaded {} (expires in {} days); new handshakes \
                         use it, open connections keep theirs",
                        me.files.cert.display(),
                        m.not_after()
                            .duration_since(SystemTime::now())
                            .unwrap_or(Duration::ZERO)
                            .as_secs()
                            / 86_400,
                    ),
                    Err(e) => tracing::error!(
                        target: "qr::tls",
                        "{who}: SIGHUP: kept the certificate in use: {e} \
                         (fix the files, then send SIGHUP again)"
                    ),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{generate_dev_pki, LeafSpec};

    fn args(dir: &std::path::Path, leaf: &str) -> MtlsArgs {
        MtlsArgs {
            cert: dir.join(format!("{leaf}.pem")),
            key: dir.join(format!("{leaf}-key.pem")),
            ca: dir.join("ca.pem"),
        }
    }

    #[test]
    fn reload_swaps_on_success_and_keeps_the_old_on_failure() {
        let d = tempfile::tempdir().unwrap();
        let leaf = |s: &str| s.parse::<LeafSpec>().unwrap();
        generate_dev_pki(d.path(), &[leaf("a=127.0.0.1"), leaf("b=127.0.0.2")]).unwrap();
        let id = Identity::load(&args(d.path(), "a")).unwrap();
        let first = id.current();
        let expiry = id.stats().certificate_expiration_timestamp_seconds.get();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(expiry > now, "{expiry} <= {now}");

        // Same files: a reload is a new identity, counted.
        let second = id.reload().unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(Arc::ptr_eq(&second, &id.current()));
        assert_eq!(id.stats().reloads.get(), 1);

        // b's key under a's certificate: refused, the current one stays.
        std::fs::copy(d.path().join("b-key.pem"), d.path().join("a-key.pem")).unwrap();
        let e = id.reload().unwrap_err().to_string();
        assert!(e.contains("a.pem"), "{e}");
        assert!(Arc::ptr_eq(&second, &id.current()));
        assert_eq!(id.stats().reload_failures.get(), 1);
        assert_eq!(id.stats().reloads.get(), 1);

        let text = id.stats().render();
        assert!(text.contains("qr_tls_reloads_total 1"), "{text}");
        assert!(text.contains("qr_tls_reload_failures_total 1"), "{text}");
        assert!(
            text.contains(&format!(
                "qr_tls_certificate_expiration_timestamp_seconds {expiry}"
            )),
            "{text}"
        );
    }
}
