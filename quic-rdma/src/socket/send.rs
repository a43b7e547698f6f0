//! The send path: datagrams → chained UD send WRs, one doorbell per batch.

use std::ops::Range;

use super::{InflightSend, SocketError, UdSocket, MAX_SEND_BATCH};
use crate::fabric::{AhAttr, SendFlags, SendWr, Sge, UdAddr, UdQueuePair, WcStatus};

/// Where the bytes of a send are.
#[derive(Clone, Copy, Debug)]
pub(super) enum Payload<'a> {
    /// The caller's memory: each segment is copied into a registered slot (or
    /// the inline staging area).
    Copied(&'a [u8]),
    /// The first `len` bytes of registered region `region` (a transmit
    /// buffer): the WRs point straight at them.
    Registered {
        /// Index of the region in the socket's `Memory`.
        region: u32,
        /// Its lkey.
        lkey: u32,
        /// Bytes to send.
        len: usize,
    },
}

impl Payload<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Payload::Copied(c) => c.len(),
            Payload::Registered { len, .. } => *len,
        }
    }
}

/// Send completions polled per `poll_cq` call.
pub(super) const SEND_POLL_BATCH: usize = 32;

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
        self.post_datagram(dest, ecn, imm, Payload::Copied(contents), segment_size)
    }

    /// The one send path behind [`send_with_imm`](Self::send_with_imm) and
    /// [`send_tx_buf`](Self::send_tx_buf): checks, room for every segment,
    /// then one post per batch of at most [`MAX_SEND_BATCH`] WRs.
    pub(super) fn post_datagram(
        &mut self,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        payload: Payload<'_>,
        segment_size: Option<usize>,
    ) -> Result<(), SocketError> {
        if let Some(why) = &self.failed {
            return Err(SocketError::QpFailed(why.clone()));
        }
        let len = payload.len();
        let seg = segment_size.unwrap_or(len).max(1);
        if seg > self.fabric_mtu && seg <= self.mtu && len > self.fabric_mtu {
            // Datagrams larger than a UD message: as parts (docs/architecture.md §6).
            return self.post_parts(dest, ecn, imm, payload, seg);
        }
        if seg > self.mtu {
            self.stats.mtu_refusals += 1;
            return Err(SocketError::Oversize {
                len: seg.min(len),
                mtu: self.mtu,
            });
        }
        let segments = len.div_ceil(seg).max(1);
        let big = self.big_segments(payload, len, seg);
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
        let mut start = 0;
        while start < len {
            let end = len.min(start + seg * MAX_SEND_BATCH);
            match self.send_batch(dest, ecn, imm, payload, start..end, seg) {
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
            start = end;
        }
        Ok(())
    }

    /// Segments of a `len`-byte datagram cut at `seg` that need a slot: none
    /// inline, and none of a payload already in registered memory.
    fn big_segments(&self, payload: Payload<'_>, len: usize, seg: usize) -> usize {
        if seg <= self.inline_max || matches!(payload, Payload::Registered { .. }) {
            return 0;
        }
        let last = len % seg;
        len / seg + usize::from(last > self.inline_max)
    }

    /// Post one batch, bytes `range` of `payload` (room checked by the caller).
    /// `Err((posted, why))` when the provider took only part of it.
    fn send_batch(
        &mut self,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        payload: Payload<'_>,
        range: Range<usize>,
        seg: usize,
    ) -> Result<usize, (usize, crate::fabric::FabricError)> {
        let n = range.len().div_ceil(seg).max(1);
        let sq_room = (self.qp.attr().max_send_wr as usize).saturating_sub(self.inflight.len());
        let big = self.big_segments(payload, range.len(), seg);
        debug_assert!(sq_room >= n && self.send_pool.available() >= big);
        self.wrs.clear();
        self.wr_ahs.clear();
        self.wr_slots.clear();
        // Unsignaled sends hold their slot (or transmit buffer) and SQ entry
        // until a later signaled one completes: when any would run short after
        // this batch, signal its last WR, or a quiet sender could wait forever
        // for a completion never requested.
        let every = self.cfg.signal_every as usize;
        let tx_short =
            matches!(payload, Payload::Registered { .. }) && self.tx_pool.available() < every;
        let signal_tail =
            sq_room - n < every || self.send_pool.available() - big < every || tx_short;
        // (offset, length) of each segment; an empty datagram is still one
        // (zero-length) UD message.
        let segments = range
            .clone()
            .step_by(seg)
            .map(|off| (off, seg.min(range.end - off)))
            .chain(std::iter::once((range.start, 0)).filter(|_| range.is_empty()));
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
        for (i, (off, len)) in segments.enumerate() {
            let inline = len <= self.inline_max;
            let (sge, slot) = match payload {
                // Already registered: the WR points at it (an inline one is
                // copied into the WQE by the provider at post time).
                Payload::Registered { region, lkey, .. } => (
                    Sge {
                        region,
                        offset: off as u32,
                        len: len as u32,
                        lkey,
                    },
                    None,
                ),
                Payload::Copied(c) if inline => (self.stage(i, &c[off..off + len]), None),
                Payload::Copied(c) => {
                    let slot = self.send_pool.alloc().expect("availability checked above");
                    let sge = self.send_pool.send_sge(&self.mem, slot, len);
                    self.mem
                        .resolve_mut(&sge)
                        .expect("pool slots lie in registered regions")
                        .copy_from_slice(&c[off..off + len]);
                    (sge, Some(slot))
                }
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
        self.post_built()
    }

    /// Post the WRs built in `self.wrs` (with their slots and AH references
    /// beside them): each one the provider took becomes an in-flight send
    /// and is counted, and leaves the three lists. `Err((posted, why))` when
    /// the provider took only `posted` of them; the rest are released.
    /// `send_batch` and the segmented path (`send_parts`) both post here.
    pub(super) fn post_built(&mut self) -> Result<usize, (usize, crate::fabric::FabricError)> {
        let n = self.wrs.len();
        let (posted, failure) = match self.qp.post_send(&self.mem, &self.wrs) {
            Ok(()) => (n, None),
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
                tx_buf: None,
            });
        }
        self.next_wr_id += n as u64;
        self.stats.send_posts += 1;
        self.wrs.drain(..posted);
        self.wr_ahs.drain(..posted);
        self.wr_slots.drain(..posted);
        if let Some(e) = failure {
            // Release what the provider did not take, then report.
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
        r.slice_mut(off, d.len())
            .expect("staging slots lie in the stage region, which takes no receives")
            .copy_from_slice(d);
        Sge {
            region,
            offset: off as u32,
            len: d.len() as u32,
            lkey: r.lkey().unwrap_or(0),
        }
    }

    /// Give back the slots and AH references of WRs built but not posted.
    pub(super) fn unwind_batch(&mut self) {
        for slot in self.wr_slots.drain(..).flatten() {
            self.send_pool.release(slot);
        }
        for r in std::mem::take(&mut self.wr_ahs) {
            self.ahs.completed(&mut self.qp, r, &mut self.stats);
        }
        self.wrs.clear();
    }

    /// Give back what a send held: its slot, the transmit buffer whose last
    /// WR it was, and its AH reference.
    pub(super) fn retire_send(&mut self, s: InflightSend) {
        if let Some(slot) = s.slot {
            self.send_pool.release(slot);
        }
        if let Some(b) = s.tx_buf {
            self.tx_pool.release(b);
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
        let mut wcs = std::mem::take(&mut self.send_wcs);
        let mut qp_failed = false;
        loop {
            let n = self.qp.poll_send_cq(&mut wcs);
            for wc in &wcs[..n] {
                self.stats.send_completions += 1;
                if wc.timestamp.is_some() {
                    self.last_send_stamp = wc.timestamp;
                }
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
            if n < wcs.len() {
                break;
            }
        }
        self.send_wcs = wcs;
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
        self.max_segments
    }

    /// Whether a full-MTU datagram could be posted now (send-queue room and a slot).
    pub fn can_send(&self) -> bool {
        self.can_send_datagrams(1)
    }

    /// Whether `n` full-MTU datagrams could be posted now as one batch (a
    /// GSO-style send is posted whole or not at all): send-queue room and a
    /// slot for each (for each part, when they are segmented).
    pub fn can_send_datagrams(&self, n: usize) -> bool {
        // A full-size datagram above the active MTU takes one WR and slot per part.
        let n = n.max(1) * super::segment::parts_for(self.mtu, self.fabric_mtu);
        self.inflight.len() + n <= self.qp.attr().max_send_wr as usize
            && self.send_pool.available() >= n
    }
}
