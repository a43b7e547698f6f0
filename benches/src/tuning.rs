//! The `TransportConfig` of every tuned QUIC row (engine, adapter, quinn/udp at
//! MTU 4096), with optional experimental changes from the `BENCH_TUNE`
//! environment variable, so a setting's effect can be measured before/after in
//! interleaved runs of the same binary (which settings fit a lossless
//! microsecond fabric). Side processes inherit the variable.
//!
//! `BENCH_TUNE` is a comma-separated list of:
//! - `ackfreq=N`: negotiate the ACK frequency extension
//!   (draft-ietf-quic-ack-frequency) asking the peer to ACK every N
//!   ack-eliciting packets;
//! - `ackdelay=US`: with it, the peer's max ACK delay in microseconds;
//! - `newreno` / `bbr`: that congestion controller instead of CUBIC;
//! - `window=BYTES`: the controller's initial window;
//! - `nofair`: `send_fairness(false)` (one stream at a time fills packets);
//! - `sendwin=BYTES`: the send window (unacknowledged bytes in flight,
//!   all streams);
//! - `streamwin=BYTES`: the stream receive window each side grants;
//! - `idle=MS`: idle timeout MS milliseconds, keep-alive a fifth of it (for
//!   runs under valgrind, which slows a side past the default 1.5 s when the
//!   machine is loaded; `benches/callgrind.sh` sets `idle=60000`).
//!
//! [`SPIN_ENV`] (`BENCH_IDLE_SPIN_US`) sets the adapter rows' receive spin
//! window in microseconds (`RdmaUdpSocket::with_idle_spin`; 0: sleep at once,
//! as a UDP socket does), for before/after runs of the same binary.

use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
use quinn::{AckFrequencyConfig, TransportConfig, VarInt};

/// Environment variable with the experimental settings.
pub const TUNE_ENV: &str = "BENCH_TUNE";

/// Environment variable with the adapter rows' spin window, in microseconds.
pub const SPIN_ENV: &str = "BENCH_IDLE_SPIN_US";

/// An adapter row's socket: `RdmaUdpSocket::new` with [`SPIN_ENV`]'s window if set.
pub fn adapter_socket<Q: quic_rdma::fabric::UdQueuePair>(
    sock: quic_rdma::socket::UdSocket<Q>,
) -> quic_rdma::quinn_adapter::RdmaUdpSocket<Q> {
    let s = quic_rdma::quinn_adapter::RdmaUdpSocket::new(sock);
    match std::env::var(SPIN_ENV) {
        Ok(us) => {
            let us: u64 = us
                .parse()
                .unwrap_or_else(|e| panic!("{SPIN_ENV}={us}: {e} (microseconds)"));
            s.with_idle_spin(Duration::from_micros(us))
        }
        Err(_) => s,
    }
}

/// `quic_rdma::quinn_adapter::FabricConfig::new(mtu).transport_config()` plus [`TUNE_ENV`]'s changes.
pub fn transport(mtu: usize) -> Arc<TransportConfig> {
    let mut t = quic_rdma::quinn_adapter::FabricConfig::new(mtu).transport_config();
    if let Ok(spec) = std::env::var(TUNE_ENV) {
        apply(&mut t, &spec).unwrap_or_else(|e| panic!("{TUNE_ENV}={spec}: {e}"));
    }
    Arc::new(t)
}

/// Apply a [`TUNE_ENV`] list to `t`.
pub fn apply(t: &mut TransportConfig, spec: &str) -> anyhow::Result<()> {
    let mut ack: Option<AckFrequencyConfig> = None;
    let mut cc = "cubic";
    let mut window: Option<u64> = None;
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').unwrap_or((item, ""));
        match k {
            "ackfreq" => {
                ack.get_or_insert_with(AckFrequencyConfig::default)
                    .ack_eliciting_threshold(VarInt::from_u32(v.parse()?));
            }
            "ackdelay" => {
                ack.get_or_insert_with(AckFrequencyConfig::default)
                    .max_ack_delay(Some(Duration::from_micros(v.parse()?)));
            }
            "newreno" | "bbr" | "cubic" => cc = k,
            "window" => window = Some(v.parse()?),
            "nofair" => {
                t.send_fairness(false);
            }
            "sendwin" => {
                t.send_window(v.parse()?);
            }
            "streamwin" => {
                t.stream_receive_window(VarInt::from_u64(v.parse()?)?);
            }
            "idle" => {
                let ms: u32 = v.parse()?;
                t.max_idle_timeout(Some(VarInt::from_u32(ms).into()))
                    .keep_alive_interval(Some(Duration::from_millis(u64::from(ms / 5))));
            }
            other => anyhow::bail!(
                "unknown setting {other:?}: use ackfreq=N, ackdelay=US, newreno, bbr, window=BYTES, nofair, \
                 sendwin=BYTES, streamwin=BYTES, idle=MS"
            ),
        }
    }
    if ack.is_some() {
        t.ack_frequency_config(ack);
    }
    match cc {
        "newreno" => {
            let mut c = NewRenoConfig::default();
            if let Some(w) = window {
                c.initial_window(w);
            }
            t.congestion_controller_factory(Arc::new(c));
        }
        "bbr" => {
            let mut c = BbrConfig::default();
            if let Some(w) = window {
                c.initial_window(w);
            }
            t.congestion_controller_factory(Arc::new(c));
        }
        _ => {
            if let Some(w) = window {
                let mut c = CubicConfig::default();
                c.initial_window(w);
                t.congestion_controller_factory(Arc::new(c));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_unknown_ones_are_refused() {
        let mut t = TransportConfig::default();
        apply(
            &mut t,
            "ackfreq=8,ackdelay=200,bbr,window=1000000,nofair,sendwin=4194304,streamwin=4194304,idle=60000",
        )
        .unwrap();
        let e = apply(&mut t, "turbo").unwrap_err().to_string();
        assert!(e.contains("turbo") && e.contains("ackfreq"), "{e}");
        assert!(apply(&mut t, "ackfreq=x").is_err());
        assert!(apply(&mut t, "idle=-1").is_err());
    }
}
