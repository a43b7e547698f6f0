//! The data path: receive completions into quinn-proto, transmits out to the socket.

use std::time::Instant;

use quinn_proto::{DatagramEvent, EcnCodepoint};

use super::Engine;
use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::peers::LastSource;
use crate::quic::routing;
use crate::socket::SocketError;

/// Endpoint-level responses queued while the send queue is full, at most;
/// further ones are dropped (and counted) like lost packets.
const MAX_QUEUED_RESPONSES: usize = 1024;

/// A transmit the socket refused with `WouldBlock`; its bytes wait in `pending_buf`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingTransmit {
    dest: UdAddr,
    ecn: u8,
    len: usize,
    segment_size: Option<usize>,
}

impl<Q: UdQueuePair> Engine<Q> {
    /// Take up to `recv_batch` datagrams from the socket and hand them to quinn-proto.
    pub(super) fn receive(&mut self, now: Instant) {
        let local_ip = self.local_ip();
        let mtu = self.mtu;
        let batch = self.recv_batch;
        // Disjoint borrows: the socket lends each datagram to the closure, which
        // feeds the endpoint and connections. New attempts are decided after the
        // batch (deciding may queue responses, which need the socket).
        let Engine {
            socket,
            endpoint,
            conns,
            rx_buf,
            tx_buf,
            responses,
            responses_dropped,
            peers,
            routing,
            routing_stats,
            activity,
            ..
        } = self;
        let mut new_incoming = None::<Vec<quinn_proto::Incoming>>;
        let mut last_source = LastSource::default();
        socket.recv(batch, |r| {
            if !routing.accept(r.imm, r.data, routing_stats) {
                return;
            }
            // Reclaim the staging buffer (no allocation when every earlier piece was
            // dropped) or, if some piece is still held, let `bytes` allocate anew.
            if rx_buf.capacity() < r.data.len() {
                rx_buf.reserve(mtu * super::RX_BUF_DATAGRAMS);
            }
            *activity += 1;
            rx_buf.extend_from_slice(r.data);
            let data = rx_buf.split();
            tx_buf.clear();
            let ecn = EcnCodepoint::from_bits(r.ecn);
            match endpoint.handle(
                now,
                last_source.on_receive(peers, r.src, now),
                local_ip,
                ecn,
                data,
                tx_buf,
            ) {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(c) = conns.by_proto(ch) {
                        c.inner.handle_event(ev);
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
                    responses.push((r.src, tx_buf[..t.size].to_vec()));
                }
                None => {}
            }
        });
        for inc in new_incoming.into_iter().flatten() {
            self.on_incoming(now, inc);
        }
    }

    /// Send the endpoint-level responses queued by the receive path and decisions.
    pub(super) fn send_responses(&mut self) {
        while let Some((dest, buf)) = self.responses.pop() {
            if let Err(e) = routing::send(&mut self.socket, dest, 0, &buf, None) {
                if matches!(e, SocketError::WouldBlock) {
                    // Keep it for the next flush.
                    self.responses.push((dest, buf));
                    return;
                }
                tracing::debug!(%e, "dropping endpoint response");
            }
        }
    }

    /// Send a transmit refused earlier. `false` while the socket still refuses it.
    fn retry_pending(&mut self) -> bool {
        let Some(p) = self.pending else {
            return true;
        };
        let data = &self.pending_buf[..p.len];
        match routing::send(&mut self.socket, p.dest, p.ecn, data, p.segment_size) {
            Err(SocketError::WouldBlock) => false,
            r => {
                if let Err(e) = r {
                    tracing::warn!(%e, "dropping transmit");
                }
                self.pending = None;
                true
            }
        }
    }

    /// Pull transmits from every connection until each is idle or the socket is full.
    pub(super) fn flush_connections(&mut self, now: Instant) {
        if !self.retry_pending() {
            return;
        }
        let max_segments = self.socket.max_segments();
        for i in 0..self.conns.capacity() {
            while let Some(c) = self.conns.slot_mut(i) {
                self.tx_buf.clear();
                let Some(t) = c.inner.poll_transmit(now, max_segments, &mut self.tx_buf) else {
                    break;
                };
                self.activity += 1;
                let Some(dest) = self
                    .peers
                    .on_send(t.destination, &self.tx_buf[..t.size], now)
                else {
                    // Counted in the peer table; like a lost packet to QUIC.
                    tracing::debug!(dest = %t.destination, "transmit to an unknown UD peer dropped");
                    continue;
                };
                let ecn = t.ecn.map_or(0, |e| e as u8);
                let data = &self.tx_buf[..t.size];
                match routing::send(&mut self.socket, dest, ecn, data, t.segment_size) {
                    Ok(()) => {}
                    Err(SocketError::WouldBlock) => {
                        // Keep the bytes (swap buffers: no copy, no allocation) and
                        // stop pulling: quinn-proto would only build more to refuse.
                        std::mem::swap(&mut self.tx_buf, &mut self.pending_buf);
                        self.pending = Some(PendingTransmit {
                            dest,
                            ecn,
                            len: t.size,
                            segment_size: t.segment_size,
                        });
                        return;
                    }
                    Err(e) => tracing::warn!(%e, "dropping transmit"),
                }
            }
        }
    }
}
