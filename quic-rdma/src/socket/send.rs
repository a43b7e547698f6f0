//! The send path: datagrams → chained UD send WRs, one doorbell per batch.

use super::{InflightSend, SocketError, UdSocket, MAX_SEND_BATCH};
use crate::fabric::{AhAttr, Completion, SendFlags, SendWr, Sge, UdAddr, UdQueuePair, WcStatus};

/// Send completions polled per `poll_cq` call.
const SEND_POLL_BATCH: usize = 32;

impl<Q: UdQueuePair> UdSocket<Q> {
    /// Send `contents` to `dest`: one datagram, or GSO-style one datagram per
    /// `segment_size` bytes (the last may be shorter), all in one `post_send`.
    ///
    /// `ecn` is the ECN codepoint for the GRH traffic class (RFC 3168, 0..=3).
    /// Either every segment is posted or none: room for all of them is checked
    /// before the first is posted. `WouldBlock` (nothing posted) when the send
    /// queue or the slot pool lacks room now (poll completions —
    /// [`UdSocket::reap_sends`] does — and retry), `TooManySegments` when they
    /// never could hold them all, `Oversize` when a segment exceeds the active
    /// MTU. Only a provider failing part way through a post (the queue pair
    /// broke) leaves some posted: `PartiallyPosted` says how many.
    ///
    /// Sent as plain SENDs (no immediate data, flow label 0); see
    /// [`send_with_imm`](Self::send_with_imm).
    pub fn send(
        &mut self,
        dest: UdAddr,
        ecn: u8,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> Result<(), SocketError> {
        self.send_with_imm(dest, ecn, None, contents, segment_size)
    }

    /// [`send`](Self::send), every segment carrying immediate data `imm` (SEND
    /// with immediate); `imm` is also the address handle's flow label (ECMP
    /// entropy). What the value means is the caller's business: the QUIC
    /// drivers put the destination CID's routing key there (the QUIC side's `routing`).
    pub fn send_with_imm(
        &mut self,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> Result<(), SocketError> {
        if let Some(why) = &self.failed {
            return Err(SocketError::QpFailed(why.clone()));
        }
        let seg = segment_size.unwrap_or(contents.len()).max(1);
        if seg > self.mtu {
            self.stats.mtu_refusals += 1;
            return Err(SocketError::Oversize {
                len: seg.min(contents.len()),
                mtu: self.mtu,
            });
        }
        let segments = contents.len().div_ceil(seg).max(1);
        let big = self.big_segments(contents.len(), seg);
        let sq_depth = self.qp.attr().max_send_wr as usize;
        if segments > sq_depth || big > self.send_pool.total() {
            return Err(SocketError::TooManySegments {
                segments,
                max: sq_depth.min(self.send_pool.total()),
            });
        }
        self.reap_sends();
        let sq_room = sq_depth.saturating_sub(self.inflight.len());
        if sq_room < segments || self.send_pool.available() < big {
            self.stats.would_block += 1;
            return Err(SocketError::WouldBlock);
        }
        // One post per batch of at most MAX_SEND_BATCH WRs (the staging area's
        // size); room for every batch was checked above, and only grows.
        let mut posted = 0;
        for chunk in contents.chunks(seg * MAX_SEND_BATCH) {
            match self.send_batch(dest, ecn, imm, chunk, seg) {
                Ok(n) => posted += n,
                // Nothing of this send reached the wire: a plain failure.
                Err((0, source)) if posted == 0 => return Err(source.into()),
                Err((n, source)) => {
                    self.stats.partial_posts += 1;
                    self.stats.unposted_segments += (segments - posted - n) as u64;
                    return Err(SocketError::PartiallyPosted {
                        posted: posted + n,
                        segments,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Segments of a `len`-byte datagram cut at `seg` that need a slot (not inline).
    fn big_segments(&self, len: usize, seg: usize) -> usize {
        if seg <= self.inline_max {
            return 0;
        }
        let last = len % seg;
        len / seg + usize::from(last > self.inline_max)
    }

    /// Post one batch (room checked by the caller). `Err((posted, why))` when the
    /// provider took only part of it.
    fn send_batch(
        &mut self,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        contents: &[u8],
        seg: usize,
    ) -> Result<usize, (usize, crate::fabric::FabricError)> {
        let n = contents.len().div_ceil(seg).max(1);
        let sq_room = (self.qp.attr().max_send_wr as usize).saturating_sub(self.inflight.len());
        let big = self.big_segments(contents.len(), seg);
        debug_assert!(sq_room >= n && self.send_pool.available() >= big);
        self.wrs.clear();
        self.wr_ahs.clear();
        self.wr_slots.clear();
        // Unsignaled sends hold their slot and SQ entry until a later signaled one
        // completes: when either would run short after this batch, signal its last
        // WR, or a quiet sender could wait forever for a completion never requested.
        let every = self.cfg.signal_every as usize;
        let signal_tail = sq_room - n < every || self.send_pool.available() - big < every;
        let segments = contents.chunks(seg).chain(
            // An empty datagram is still one (zero-length) UD message.
            std::iter::once(&contents[..0]).filter(|_| contents.is_empty()),
        );
        // One AH for the whole batch: same destination, ECN and key. Looked up
        // once (a hash of the attributes), referenced by each WR.
        let base = AhAttr::new(dest.gid, imm.unwrap_or(0));
        let attr = AhAttr {
            traffic_class: (base.traffic_class & !0b11) | (ecn & 0b11),
            ..base
        };
        let (ah_ref, ah) = self
            .ahs
            .get(&mut self.qp, &attr, &mut self.stats)
            .map_err(|e| (0, e))?;
        for (i, d) in segments.enumerate() {
            let inline = d.len() <= self.inline_max;
            let (sge, slot) = if inline {
                (self.stage(i, d), None)
            } else {
                let slot = self.send_pool.alloc().expect("availability checked above");
                let sge = self.send_pool.send_sge(&self.mem, slot, d.len());
                self.mem
                    .resolve_mut(&sge)
                    .expect("pool slots lie in registered regions")
                    .copy_from_slice(d);
                (sge, Some(slot))
            };
            self.since_signal += 1;
            let signaled =
                self.since_signal >= self.cfg.signal_every || (signal_tail && i + 1 == n);
            if signaled {
                self.since_signal = 0;
            }
            self.ahs.sent(ah_ref);
            self.wr_ahs.push(ah_ref);
            self.wr_slots.push(slot);
            self.wrs.push(SendWr {
                wr_id: self.next_wr_id + i as u64,
                sge,
                ah,
                remote_qpn: dest.qpn,
                remote_qkey: dest.qkey,
                imm,
                flags: SendFlags { signaled, inline },
            });
        }
        let (posted, failure) = match self.qp.post_send(&self.mem, &self.wrs) {
            Ok(()) => (self.wrs.len(), None),
            Err((k, e)) => {
                tracing::warn!(posted = k, err = %e, "post_send failed");
                (k, Some(e))
            }
        };
        for i in 0..posted {
            let wr = &self.wrs[i];
            self.stats.sent_wrs += 1;
            self.stats.sent_bytes += u64::from(wr.sge.len);
            self.stats.inline_sends += u64::from(wr.flags.inline);
            self.stats.signaled_sends += u64::from(wr.flags.signaled);
            self.inflight.push_back(InflightSend {
                wr_id: wr.wr_id,
                slot: self.wr_slots[i],
                ah: self.wr_ahs[i],
            });
        }
        self.next_wr_id += self.wrs.len() as u64;
        self.stats.send_posts += 1;
        if let Some(e) = failure {
            // Release what the provider did not take, then report.
            self.wrs.drain(..posted);
            self.wr_ahs.drain(..posted);
            self.wr_slots.drain(..posted);
            self.unwind_batch();
            return Err((posted, e));
        }
        Ok(posted)
    }

    /// Copy a small datagram into the inline staging area for WR `i` of a batch.
    fn stage(&mut self, i: usize, d: &[u8]) -> Sge {
        let region = self.stage_region;
        let r = self.mem.region_mut(region).expect("stage region exists");
        let off = i * self.stage_stride;
        r.bytes_mut()[off..off + d.len()].copy_from_slice(d);
        Sge {
            region,
            offset: off as u32,
            len: d.len() as u32,
            lkey: r.lkey().unwrap_or(0),
        }
    }

    /// Give back the slots and AH references of WRs built but not posted.
    fn unwind_batch(&mut self) {
        for slot in self.wr_slots.drain(..).flatten() {
            self.send_pool.release(slot);
        }
        for r in std::mem::take(&mut self.wr_ahs) {
            self.ahs.completed(&mut self.qp, r, &mut self.stats);
        }
        self.wrs.clear();
    }

    /// Give back what a send held: its slot and its AH reference.
    pub(super) fn retire_send(&mut self, s: InflightSend) {
        if let Some(slot) = s.slot {
            self.send_pool.release(slot);
        }
        self.ahs.completed(&mut self.qp, s.ah, &mut self.stats);
    }

    /// Poll send completions and retire what they cover: a completion retires every
    /// earlier send (in-order completion, IBA 10.8.3), freeing its slot and AH reference.
    ///
    /// A completion in error means the QP entered the error state (IBA 10.8.3):
    /// it is recovered once the completions are drained.
    pub fn reap_sends(&mut self) -> usize {
        let mut total = 0;
        let mut wcs = [Completion::send(0); SEND_POLL_BATCH];
        let mut qp_failed = false;
        loop {
            let n = self.qp.poll_send_cq(&mut wcs);
            for wc in &wcs[..n] {
                self.stats.send_completions += 1;
                if wc.status != WcStatus::Success {
                    self.stats.send_errors += 1;
                    qp_failed = true;
                    if wc.status != WcStatus::WrFlushErr {
                        tracing::warn!(wr_id = wc.wr_id, status = ?wc.status, "send completed with error");
                    }
                }
                while let Some(s) = self.inflight.pop_front() {
                    let last = s.wr_id == wc.wr_id;
                    self.retire_send(s);
                    if last {
                        break;
                    }
                }
            }
            total += n;
            if n < SEND_POLL_BATCH {
                break;
            }
        }
        if qp_failed {
            self.recover_qp();
        }
        total
    }
}

impl<Q: UdQueuePair> UdSocket<Q> {
    /// The most segments one [`send`](Self::send) can take (the send queue's depth
    /// and the slot pool bound it): give quinn this as its GSO segment limit.
    pub fn max_segments(&self) -> usize {
        MAX_SEND_BATCH
            .min(self.qp.attr().max_send_wr as usize)
            .min(self.send_pool.total())
            .max(1)
    }

    /// Whether a full-MTU datagram could be posted now (send-queue room and a slot).
    pub fn can_send(&self) -> bool {
        self.inflight.len() < self.qp.attr().max_send_wr as usize && self.send_pool.available() > 0
    }
}
