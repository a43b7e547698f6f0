//! The data path: receive completions into quinn-proto, transmits out to the socket.

use std::time::Instant;

use quinn_proto::{DatagramEvent, EcnCodepoint};

use super::Engine;
use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::peers::LastSource;
use crate::quic::routing;
use crate::socket::{TxBuf, TxSendError};

/// Endpoint-level responses queued while the send queue is full, at most;
/// further ones are dropped (and counted) like lost packets.
const MAX_QUEUED_RESPONSES: usize = 1024;

/// A transmit the socket refused with `WouldBlock`; its bytes wait in its
/// transmit buffer.
#[derive(Debug)]
pub(super) struct PendingTransmit {
    buf: TxBuf,
    dest: UdAddr,
    ecn: u8,
    len: usize,
    segment_size: Option<usize>,
}

impl<Q: UdQueuePair> Engine<Q> {
    /// Take up to `recv_batch` datagrams from the socket and hand them to quinn-proto.
    pub(super) fn receive(&mut self, now: Instant) {
        let local_ip = self.local_ip();
        let batch = self.recv_batch;
        // Disjoint borrows: the socket lends each datagram to the closure, which
        // feeds the endpoint and connections. New attempts are decided after the
        // batch (deciding may queue responses, which need the socket).
        let Engine {
            socket,
            endpoint,
            conns,
            rx_copies,
            response_buf,
            responses,
            responses_dropped,
            peers,
            routing,
            routing_log,
            activity,
            ..
        } = self;
        let mut new_incoming = None::<Vec<quinn_proto::Incoming>>;
        let mut last_source = LastSource::default();
        // `now` for the reassembly timeout too: no clock read below the engine.
        socket.recv_at(now, batch, |r| {
            if !routing.accept(&r, routing_log) {
                return;
            }
            *activity += 1;
            let data = rx_copies.copy(r.data);
            response_buf.clear();
            let ecn = EcnCodepoint::from_bits(r.ecn);
            let remote = last_source.on_receive(peers, r.src, r.data, now);
            match endpoint.handle(now, remote, local_ip, ecn, data, response_buf) {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(c) = conns.by_proto(ch) {
                        c.inner.handle_event(ev);
                        c.may_send = true;
                        // At most one ACK per datagram: one RTT sample (rtt.rs).
                        c.rtt.observe(c.inner.rtt());
                        if r.timestamp.is_some() {
                            // Stamping: datagrams keep their own packet's arrival.
                            c.last_rx_stamp = r.timestamp;
                            c.rx_datagrams.take_stamped(&mut c.inner, r.timestamp);
                        }
                    }
                }
                Some(DatagramEvent::NewConnection(inc)) => {
                    new_incoming.get_or_insert_with(Vec::new).push(inc);
                }
                // Stateless answers to whoever sent a packet: bounded, since
                // anyone can make us owe them one.
                Some(DatagramEvent::Response(_)) if responses.len() >= MAX_QUEUED_RESPONSES => {
                    *responses_dropped += 1;
                }
                Some(DatagramEvent::Response(t)) => {
                    responses.push((remote, response_buf[..t.size].to_vec()));
                }
                None => {}
            }
        });
        for inc in new_incoming.into_iter().flatten() {
            self.on_incoming(now, inc);
        }
    }

    /// Send the endpoint-level responses queued by the receive path and decisions.
    ///
    /// They go through the peer table like any transmit: to an unvalidated
    /// peer only within its 3× budget (RFC 9000 §8.1).
    pub(super) fn send_responses(&mut self, now: Instant) {
        while let Some((to, buf)) = self.responses.pop() {
            if !self.socket.can_send() {
                // Keep it for the next flush (not yet charged to the peer).
                self.responses.push((to, buf));
                return;
            }
            let Some((dest, len)) = self.peers.on_send(to, &buf, None, now) else {
                tracing::debug!(dest = %to, "endpoint response dropped by the peer table");
                continue;
            };
            if let Err(e) = routing::send(&mut self.socket, dest, 0, &buf[..len], None) {
                tracing::debug!(%e, "dropping endpoint response");
            }
        }
    }

    /// Send a transmit refused earlier. `false` while the socket still refuses it.
    fn retry_pending(&mut self) -> bool {
        let Some(p) = self.pending.take() else {
            return true;
        };
        match routing::send_tx_buf(
            &mut self.socket,
            p.buf,
            p.dest,
            p.ecn,
            p.len,
            p.segment_size,
        ) {
            Ok(()) => true,
            Err(TxSendError::WouldBlock(buf)) => {
                self.pending = Some(PendingTransmit { buf, ..p });
                false
            }
            Err(TxSendError::Failed(e)) => {
                tracing::warn!(%e, "dropping transmit");
                true
            }
        }
    }

    /// Pull transmits from every connection until each is idle or the socket is full.
    ///
    /// quinn-proto writes each transmit straight into a registered transmit
    /// buffer of the socket, whose send WRs point at what it wrote: no copy
    /// (docs/architecture.md §4). The buffer's capacity is `max_segments` ×
    /// MTU, what quinn-proto reserves for a full batch, plus room for an ACK
    /// frame it writes and takes back (`socket/tx_buf.rs`), so it never grows.
    pub(super) fn flush_connections(&mut self, now: Instant) {
        if !self.retry_pending() {
            return;
        }
        let max_segments = self.socket.max_segments();
        for i in 0..self.conns.capacity() {
            while let Some(c) = self.conns.slot_mut(i) {
                if !c.may_send {
                    break;
                }
                // The buffer an idle connection left unused, else a new one.
                // Every buffer in flight: like a full send queue, stop
                // pulling; the last one posted was signaled, so a completion
                // frees it.
                let Some(buf) = self.tx_spare.take().or_else(|| self.socket.take_tx_buf()) else {
                    return;
                };
                let vec = self.socket.tx_vec(&buf);
                vec.clear();
                let Some(t) = c.inner.poll_transmit(now, max_segments, vec) else {
                    // Kept for the next transmit: a busy-polling engine asks
                    // idle connections far more often than they send.
                    self.tx_spare = Some(buf);
                    c.may_send = false;
                    break;
                };
                self.activity += 1;
                let data = &self.socket.tx_bytes(&buf)[..t.size];
                let Some((dest, len)) =
                    self.peers.on_send(t.destination, data, t.segment_size, now)
                else {
                    // Counted in the peer table; like a lost packet to QUIC.
                    tracing::debug!(dest = %t.destination, "transmit dropped by the peer table");
                    self.tx_spare = Some(buf);
                    continue;
                };
                let ecn = t.ecn.map_or(0, |e| e as u8);
                match routing::send_tx_buf(&mut self.socket, buf, dest, ecn, len, t.segment_size) {
                    Ok(()) => {}
                    Err(TxSendError::WouldBlock(buf)) => {
                        // Keep the bytes (in their buffer: no copy) and stop
                        // pulling: quinn-proto would only build more to refuse.
                        self.pending = Some(PendingTransmit {
                            buf,
                            dest,
                            ecn,
                            len,
                            segment_size: t.segment_size,
                        });
                        return;
                    }
                    Err(TxSendError::Failed(e)) => tracing::warn!(%e, "dropping transmit"),
                }
            }
        }
    }
}
