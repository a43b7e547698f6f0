//! Rows: raw UD (`raw-ud/<provider>`), the latency floor under QUIC.
//!
//! 64-byte messages ping-ponged through the socket layer (`UdSocket`: one UD
//! SEND per message, receives from the posted window) with no QUIC, no
//! crypto, no retransmission — what `ibv_ud_pingpong` measures, on the same
//! queue pairs the engine rows use. Both sides busy-poll. The engine's round
//! trip minus this one is what QUIC and TLS cost (goal of the trading path:
//! engine p50 ≤ this p50 + 3 µs). RTT only: raw UD has no streams to move a
//! bulk transfer over and no handshake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quic_rdma::fabric::{UdAddr, UdQueuePair};
use quic_rdma::socket::{SocketConfig, SocketError, UdSocket};

use super::engine::QpPairs;
use super::{
    BulkOutcome, BulkParams, HandshakeOutcome, ProcessSide, Row, RttOutcome, SideOutcome, RTT_MSG,
    RTT_WARMUP,
};
use crate::affinity::Placement;
use crate::side::{run_pair, DoneOnDrop};

/// The message that ends a server's loop (shorter than any request).
const BYE: [u8; 1] = [0xFF];

/// A round trip with no answer within this is a lost datagram: UD does not
/// retransmit, so the run fails instead of hanging.
const LOST_AFTER: Duration = Duration::from_secs(2);

/// Raw UD ping-pong over provider `P`'s queue pairs.
#[derive(Debug)]
pub struct RawUd<P>(P);

impl<P: QpPairs> RawUd<P> {
    /// Over `pairs`' queue pairs.
    pub fn new(pairs: P) -> Self {
        RawUd(pairs)
    }

    fn socket(qp: P::Qp) -> anyhow::Result<UdSocket<P::Qp>> {
        Ok(UdSocket::new(qp, SocketConfig::default())?)
    }
}

/// Send `msg` to `to`, waiting (busy) for send room.
fn send<Q: UdQueuePair>(s: &mut UdSocket<Q>, to: UdAddr, msg: &[u8]) -> anyhow::Result<()> {
    loop {
        match s.send(to, 0, msg, None) {
            Ok(()) => return Ok(()),
            Err(SocketError::WouldBlock) => {
                s.reap_sends();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Spin until one datagram arrives (or `stop` is set: `None`); its sender and
/// length, the payload copied into `buf`.
fn recv<Q: UdQueuePair>(
    s: &mut UdSocket<Q>,
    buf: &mut [u8; RTT_MSG],
    shared_core: bool,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<Option<(UdAddr, usize)>> {
    loop {
        let mut got = None;
        s.reap_sends();
        s.recv(1, |r| {
            let n = r.data.len().min(RTT_MSG);
            buf[..n].copy_from_slice(&r.data[..n]);
            got = Some((r.src, r.data.len()));
        });
        if got.is_some() {
            return Ok(got);
        }
        if stop() {
            return Ok(None);
        }
        if shared_core {
            // The peer needs this core to answer (as the engine rows yield).
            std::thread::yield_now();
        }
    }
}

fn client<Q: UdQueuePair>(
    s: &mut UdSocket<Q>,
    server: UdAddr,
    iters: usize,
    shared_core: bool,
) -> anyhow::Result<Vec<u64>> {
    let req = [0x5Au8; RTT_MSG];
    let mut resp = [0u8; RTT_MSG];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..RTT_WARMUP + iters {
        let t0 = Instant::now();
        send(s, server, &req)?;
        let lost = || t0.elapsed() > LOST_AFTER;
        let (_, n) = recv(s, &mut resp, shared_core, &lost)?.ok_or_else(|| {
            anyhow::anyhow!("round trip {i}: no answer within {LOST_AFTER:?} (a datagram lost)")
        })?;
        anyhow::ensure!(n == RTT_MSG && resp == [0xA5; RTT_MSG], "response bytes");
        if i >= RTT_WARMUP {
            samples.push(t0.elapsed().as_nanos() as u64);
        }
    }
    // Posted is sent on both providers (sim delivers at post, soft sends the
    // UDP datagram at post); unsignalled sends stay "in flight" until a later
    // signalled one, so there is nothing to wait for here.
    send(s, server, &BYE)?;
    Ok(samples)
}

/// Answer every request until the client's goodbye or `done`.
fn server<Q: UdQueuePair>(
    s: &mut UdSocket<Q>,
    done: &AtomicBool,
    shared_core: bool,
) -> anyhow::Result<()> {
    let resp = [0xA5u8; RTT_MSG];
    let mut req = [0u8; RTT_MSG];
    let stop = || done.load(Ordering::Acquire);
    while let Some((from, n)) = recv(s, &mut req, shared_core, &stop)? {
        if n == BYE.len() {
            break;
        }
        anyhow::ensure!(n == RTT_MSG && req == [0x5A; RTT_MSG], "request bytes");
        send(s, from, &resp)?;
    }
    Ok(())
}

fn rtt_only<T>() -> anyhow::Result<T> {
    anyhow::bail!("raw UD rows measure round trips only: no streams, no handshake")
}

impl<P: QpPairs> Row for RawUd<P> {
    fn name(&self) -> String {
        format!("raw-ud/{}", self.0.name())
    }

    fn description(&self) -> String {
        format!(
            "raw UD ping-pong, no QUIC or crypto (the floor): {}",
            self.0.description()
        )
    }

    fn rtt_only(&self) -> bool {
        true
    }

    fn bulk(&self, _: BulkParams, _: Placement) -> anyhow::Result<BulkOutcome> {
        rtt_only()
    }

    fn rtt(&self, iters: usize, place: Placement) -> anyhow::Result<RttOutcome> {
        let (cq, sq) = self.0.make()?;
        let (mut cs, mut ss) = (Self::socket(cq)?, Self::socket(sq)?);
        let server_addr = ss.local_addr();
        let done = AtomicBool::new(false);
        let done = &done;
        let shared = place == Placement::SameCore;
        let (samples, ()) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                client(&mut cs, server_addr, iters, shared)
            },
            move || server(&mut ss, done, shared),
        )?;
        Ok(RttOutcome {
            samples_ns: samples,
            sent: None,
        })
    }

    fn handshakes(&self, _: usize, _: Placement) -> anyhow::Result<HandshakeOutcome> {
        rtt_only()
    }

    fn crosses_processes(&self) -> bool {
        self.0.crosses_processes()
    }

    fn bulk_side(&self, _: BulkParams, _: ProcessSide<'_>) -> anyhow::Result<SideOutcome> {
        rtt_only()
    }

    fn rtt_side(&self, iters: usize, side: ProcessSide<'_>) -> anyhow::Result<Vec<u64>> {
        let mut s = Self::socket(self.0.make_one()?)?;
        match side {
            ProcessSide::Server(ready) => {
                ready(s.local_addr().to_socket_addr())?;
                server(&mut s, &AtomicBool::new(false), false)?;
                Ok(vec![])
            }
            ProcessSide::Client(addr) => {
                client(&mut s, UdAddr::from_socket_addr(addr)?, iters, false)
            }
        }
    }

    fn handshakes_side(&self, _: usize, _: ProcessSide<'_>) -> anyhow::Result<f64> {
        rtt_only()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::engine::SimPairs;

    #[test]
    fn sim_round_trips_are_timed() {
        let row = RawUd::new(SimPairs::default());
        for place in [Placement::SeparateCores, Placement::SameCore] {
            let out = row.rtt(50, place).unwrap();
            assert_eq!(out.samples_ns.len(), 50);
            assert!(out.samples_ns.iter().all(|&ns| ns > 0));
        }
        assert!(row
            .bulk(
                BulkParams {
                    bytes: 1,
                    verify: true
                },
                Placement::SeparateCores
            )
            .is_err());
    }
}
