//! Socket counters: cheap, always on (docs/architecture.md §4).

use crate::fabric::ProviderDrops;

/// Every counter of a UD socket. Plain integers bumped on the hot path; read a
/// copy with [`UdSocket::stats`](super::UdSocket::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketStats {
    /// Send work requests posted.
    pub sent_wrs: u64,
    /// Payload bytes posted for sending.
    pub sent_bytes: u64,
    /// `post_send` calls (doorbells); `sent_wrs / send_posts` is WRs per post.
    pub send_posts: u64,
    /// Sends posted inline.
    pub inline_sends: u64,
    /// Sends posted signaled.
    pub signaled_sends: u64,
    /// Send completions polled.
    pub send_completions: u64,
    /// Send completions with an error status.
    pub send_errors: u64,
    /// Sends refused because they exceed the active MTU.
    pub mtu_refusals: u64,
    /// Sends refused for lack of send-queue room or slots (caller retries).
    pub would_block: u64,
    /// Sends the provider took only part of (its queue pair broke mid-post).
    pub partial_posts: u64,
    /// Segments of those sends that were not posted (lost, never resent).
    pub unposted_segments: u64,
    /// Packets received and handed up.
    pub recv_packets: u64,
    /// Payload bytes received and handed up.
    pub recv_bytes: u64,
    /// `post_recv` calls.
    pub recv_posts: u64,
    /// Receive WRs posted (initial fill + reposts).
    pub recv_wrs_posted: u64,
    /// Times the posted receive window doubled because the receiver fell
    /// behind (see [`SocketConfig::recv_start`](super::SocketConfig::recv_start)).
    pub recv_window_grows: u64,
    /// Receive completions with an error status.
    pub recv_errors: u64,
    /// Receive completions no conforming provider produces, dropped: a wr_id
    /// the provider does not hold (never posted, or already completed), a
    /// length outside the GRH area and buffer, a source QPN over 24 bits.
    pub recv_bogus_completions: u64,
    /// Packets dropped because the GRH area did not parse.
    pub drop_bad_grh: u64,
    /// Address handles created.
    pub ah_created: u64,
    /// Address handles destroyed (after their last send completed).
    pub ah_destroyed: u64,
    /// Address handles built again because our own GID changed (a peer that
    /// moves to a new GID needs that GID's AH: counted in `ah_created`).
    pub ah_rebuilt: u64,
    /// Send batches (one AH lookup per `post_send`) that found their AH in the cache.
    pub ah_hits: u64,
    /// Times our own GID changed.
    pub gid_changes: u64,
    /// Asynchronous events seen (port down, QP fatal, ...).
    pub async_events: u64,
    /// Times the queue pair left the error state again (same QPN): after a
    /// fatal event or a work request that completed in error.
    pub qp_recoveries: u64,
    /// Recoveries that failed: the socket cannot send or receive any more.
    pub qp_recovery_failures: u64,
    /// Transmits posted zero-copy from a transmit buffer
    /// ([`UdSocket::send_tx_buf`](super::UdSocket::send_tx_buf)).
    pub tx_buf_sends: u64,
    /// Transmit buffers registered (created on first need).
    pub tx_bufs_created: u64,
    /// Times [`UdSocket::take_tx_buf`](super::UdSocket::take_tx_buf) found every
    /// buffer held or in flight.
    pub tx_bufs_exhausted: u64,
    /// Transmit buffers whose `Vec` reallocated while lent (quinn-proto grew it
    /// past its capacity): sent by copy instead, and the buffer re-registered.
    /// 0 in normal operation.
    pub tx_buf_reallocations: u64,
    /// Transmit buffers that could not be registered (or re-registered).
    pub tx_buf_failures: u64,
    /// Datagrams larger than the active MTU sent as parts (docs/architecture.md §6).
    pub seg_datagrams_sent: u64,
    /// Parts sent (one UD SEND each; also counted in `sent_wrs`).
    pub seg_parts_sent: u64,
    /// Parts received and taken into a datagram in progress.
    pub seg_parts_received: u64,
    /// Datagrams reassembled from parts and handed up (also counted in
    /// `recv_packets`).
    pub seg_reassembled: u64,
    /// Datagrams dropped because a part did not arrive within the reassembly
    /// timeout (a lost part loses the whole datagram; QUIC recovers).
    pub seg_expired: u64,
    /// Datagrams dropped incomplete to make room for newer ones (the per-peer
    /// or total bound of reassembly buffers).
    pub seg_evicted: u64,
    /// Parts dropped as malformed: a bad part header, or disagreeing with the
    /// datagram's other parts.
    pub seg_malformed: u64,
    /// Parts dropped as duplicates.
    pub seg_duplicates: u64,
    /// The provider's drops (P_Key, Q_Key, unknown QPN, starvation, ...).
    pub provider: ProviderDrops,
}

impl SocketStats {
    /// Mean send WRs per doorbell.
    pub fn wrs_per_post(&self) -> f64 {
        if self.send_posts == 0 {
            0.0
        } else {
            self.sent_wrs as f64 / self.send_posts as f64
        }
    }
}

/// The public names follow the JSON reports `qr` has always written
/// (`recv_wrs`, `drops.bad_grh`); the socket's own drops and the provider's
/// share the `drops` group so a reader finds every loss in one place.
impl crate::counters::Counters for SocketStats {
    fn visit(&self, f: &mut dyn FnMut(crate::counters::Metric)) {
        crate::visit_fields!(f, self, None;
            sent_wrs: Counter, Count, "Send work requests posted";
            sent_bytes: Counter, Bytes, "Payload bytes posted for sending";
            send_posts: Counter, Count, "post_send calls (doorbells)";
            inline_sends: Counter, Count, "Sends posted inline";
            signaled_sends: Counter, Count, "Sends posted signaled";
            send_completions: Counter, Count, "Send completions polled";
            send_errors: Counter, Count, "Send completions with an error status";
            mtu_refusals: Counter, Count, "Sends refused for exceeding the active MTU";
            would_block: Counter, Count, "Sends refused for lack of send-queue room (retried)";
            partial_posts: Counter, Count, "Sends the provider took only part of";
            unposted_segments: Counter, Count, "Segments of partial sends never posted";
            recv_packets => recv_wrs: Counter, Count, "Packets received and handed up";
            recv_bytes: Counter, Bytes, "Payload bytes received and handed up";
            recv_posts: Counter, Count, "post_recv calls";
            recv_wrs_posted: Counter, Count, "Receive work requests posted";
            recv_window_grows: Counter, Count, "Times the posted receive window doubled";
            recv_errors: Counter, Count, "Receive completions with an error status";
            recv_bogus_completions: Counter, Count, "Receive completions no conforming provider produces, dropped";
            ah_created: Counter, Count, "Address handles created";
            ah_destroyed: Counter, Count, "Address handles destroyed";
            ah_rebuilt: Counter, Count, "Address handles rebuilt because our GID changed";
            ah_hits: Counter, Count, "Send batches that found their address handle cached";
            gid_changes: Counter, Count, "Times our own GID changed";
            async_events: Counter, Count, "Asynchronous events seen";
            qp_recoveries: Counter, Count, "Times the queue pair left the error state again";
            qp_recovery_failures: Counter, Count, "Queue pair recoveries that failed";
            tx_buf_sends: Counter, Count, "Transmits posted zero-copy from a transmit buffer";
            tx_bufs_created: Counter, Count, "Transmit buffers registered";
            tx_bufs_exhausted: Counter, Count, "Times every transmit buffer was held or in flight";
            tx_buf_reallocations: Counter, Count, "Transmit buffers that reallocated while lent";
            tx_buf_failures: Counter, Count, "Transmit buffers that could not be registered";
            seg_datagrams_sent: Counter, Count, "Datagrams above the active MTU sent as parts";
            seg_parts_sent: Counter, Count, "Parts sent";
            seg_parts_received: Counter, Count, "Parts received into a datagram in progress";
            seg_reassembled: Counter, Count, "Datagrams reassembled from parts";
        );
        let drops = Some("drops");
        crate::visit_fields!(f, self, drops;
            drop_bad_grh => bad_grh: Counter, Count, "Packets dropped because the GRH area did not parse";
            seg_expired: Counter, Count, "Segmented datagrams dropped with a part missing after the timeout";
            seg_evicted: Counter, Count, "Segmented datagrams dropped incomplete to make room";
            seg_malformed: Counter, Count, "Parts dropped as malformed";
            seg_duplicates: Counter, Count, "Parts dropped as duplicates";
        );
        self.provider.visit(f);
    }
}
