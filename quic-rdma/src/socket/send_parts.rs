//! The send path of datagrams larger than the active MTU: each goes as parts,
//! one UD SEND per part (the wire format is `segment`'s; docs/architecture.md
//! §6, "Segmented datagrams").
//!
//! Every part is copied into a send slot behind its 4-byte header, from the
//! caller's memory or a transmit buffer alike: a WR has one SGE, and the
//! header must precede the bytes. The zero-copy transmit path thus costs one
//! copy more, only on fabrics below 2048 bytes.

use super::ah_cache::AhRef;
use super::send::Payload;
use super::{segment, SocketError, UdSocket, MAX_SEND_BATCH};
use crate::fabric::{AhAttr, AhId, Memory, SendFlags, SendWr, Sge, UdAddr, UdQueuePair};

impl<Q: UdQueuePair> UdSocket<Q> {
    /// Post `payload` — datagrams of `seg` bytes (the last may be shorter),
    /// `seg` above the active MTU — cutting each datagram larger than the
    /// active MTU into parts; one that fits goes whole. All or nothing, as
    /// [`post_datagram`](Self::post_datagram): room for every WR is checked
    /// before the first is posted; `TooManySegments` and `PartiallyPosted`
    /// count WRs (parts).
    pub(super) fn post_parts(
        &mut self,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        payload: Payload<'_>,
        seg: usize,
    ) -> Result<(), SocketError> {
        let Some(part_imm) = segment::part_imm(imm) else {
            return Err(SocketError::ImmTooWide(imm.unwrap_or_default()));
        };
        let len = payload.len();
        let fabric = self.fabric_mtu;
        let datagram_len = |k: usize| seg.min(len - k * seg);
        let datagrams = len.div_ceil(seg);
        let wrs: usize = (0..datagrams)
            .map(|k| segment::parts_for(datagram_len(k), fabric))
            .sum();
        let sq_depth = self.qp.attr().max_send_wr as usize;
        if wrs > sq_depth || wrs > self.send_pool.total() {
            return Err(SocketError::TooManySegments {
                segments: wrs,
                max: sq_depth.min(self.send_pool.total()),
            });
        }
        self.reap_sends();
        let sq_room = sq_depth.saturating_sub(self.inflight.len());
        if sq_room < wrs || self.send_pool.available() < wrs {
            self.stats.would_block += 1;
            return Err(SocketError::WouldBlock);
        }
        // One AH for every piece of the send, looked up once: the datagram's
        // own immediate data is the flow label (a part's would not fit 20
        // bits), so all parts take one path and arrive in order where the
        // fabric keeps it.
        let base = AhAttr::new(dest.gid, imm.unwrap_or(0));
        let attr = AhAttr {
            traffic_class: (base.traffic_class & !0b11) | (ecn & 0b11),
            ..base
        };
        let ah = self.ahs.get(&mut self.qp, &attr, &mut self.stats)?;
        self.wrs.clear();
        self.wr_ahs.clear();
        self.wr_slots.clear();
        let mut posted = 0;
        for k in 0..datagrams {
            let (start, dlen) = (k * seg, datagram_len(k));
            if dlen <= fabric {
                self.push_piece(dest, ah, imm, payload, None, start, dlen);
            } else {
                let id = self.next_part_id;
                self.next_part_id = (id + 1) & segment::ID_MASK;
                self.stats.seg_datagrams_sent += 1;
                for (h, r) in segment::split(id, dlen, fabric) {
                    if self.wrs.len() == MAX_SEND_BATCH {
                        posted += self
                            .post_pieces()
                            .map_err(|e| self.fail_parts(posted, wrs, e))?;
                    }
                    let at = start + r.start;
                    self.push_piece(
                        dest,
                        ah,
                        Some(part_imm),
                        payload,
                        Some(h.encode()),
                        at,
                        r.len(),
                    );
                    self.stats.seg_parts_sent += 1;
                }
            }
            if self.wrs.len() == MAX_SEND_BATCH {
                posted += self
                    .post_pieces()
                    .map_err(|e| self.fail_parts(posted, wrs, e))?;
            }
        }
        if !self.wrs.is_empty() {
            self.post_pieces()
                .map_err(|e| self.fail_parts(posted, wrs, e))?;
        }
        Ok(())
    }

    /// Build the WR of one piece — a whole datagram or a part (`header`) —
    /// bytes `start..start + len` of `payload`, copied into a send slot.
    #[allow(clippy::too_many_arguments)]
    fn push_piece(
        &mut self,
        dest: UdAddr,
        (ah_ref, ah): (AhRef, AhId),
        imm: Option<u32>,
        payload: Payload<'_>,
        header: Option<[u8; segment::PART_HEADER_LEN]>,
        start: usize,
        len: usize,
    ) {
        let hlen = header.map_or(0, |h| h.len());
        let slot = self.send_pool.alloc().expect("room checked by post_parts");
        let sge = self.send_pool.send_sge(&self.mem, slot, hlen + len);
        if let Some(h) = header {
            self.mem
                .resolve_mut(&sge)
                .expect("pool slots lie in registered regions")[..hlen]
                .copy_from_slice(&h);
        }
        copy_payload(&mut self.mem, payload, start, len, &sge, hlen);
        self.ahs.sent(ah_ref);
        self.wr_ahs.push(ah_ref);
        self.wr_slots.push(Some(slot));
        self.wrs.push(SendWr {
            wr_id: self.next_wr_id + self.wrs.len() as u64,
            sge,
            ah,
            remote_qpn: dest.qpn,
            remote_qkey: dest.qkey,
            imm,
            flags: SendFlags::default(),
        });
    }

    /// Post the WRs built so far. `Err((posted, why))` when the provider
    /// took only part of them.
    fn post_pieces(&mut self) -> Result<usize, (usize, crate::fabric::FabricError)> {
        // Selective signaling as in `send_batch`: signal the last WR when the
        // queue or the slots would run short of `signal_every` afterwards, or
        // a quiet sender could wait forever for a completion never requested.
        let every = self.cfg.signal_every as usize;
        let sq_room = (self.qp.attr().max_send_wr as usize).saturating_sub(self.inflight.len());
        let n = self.wrs.len();
        let signal_tail = sq_room.saturating_sub(n) < every || self.send_pool.available() < every;
        for i in 0..n {
            self.since_signal += 1;
            let signaled =
                self.since_signal >= self.cfg.signal_every || (signal_tail && i + 1 == n);
            if signaled {
                self.since_signal = 0;
            }
            self.wrs[i].flags.signaled = signaled;
        }
        self.post_built()
    }

    /// The error for a send whose post failed after `posted` of its `wrs` WRs
    /// went out (plus `part.0` of the failing post).
    fn fail_parts(
        &mut self,
        posted: usize,
        wrs: usize,
        part: (usize, crate::fabric::FabricError),
    ) -> SocketError {
        self.unwind_batch();
        let (n, source) = part;
        if posted + n == 0 {
            return source.into();
        }
        self.stats.partial_posts += 1;
        self.stats.unposted_segments += (wrs - posted - n) as u64;
        SocketError::PartiallyPosted {
            posted: posted + n,
            segments: wrs,
            source,
        }
    }
}

/// Copy bytes `start..start + len` of `payload` into the send slot `dst`,
/// after its first `at` bytes (the part header).
fn copy_payload(
    mem: &mut Memory,
    payload: Payload<'_>,
    start: usize,
    len: usize,
    dst: &Sge,
    at: usize,
) {
    match payload {
        Payload::Copied(c) => mem
            .resolve_mut(dst)
            .expect("pool slots lie in registered regions")[at..]
            .copy_from_slice(&c[start..start + len]),
        Payload::Registered { region, .. } => {
            // A transmit buffer and a slot region: two regions of one Memory.
            let (s, d) = (region as usize, dst.region as usize);
            let regions = mem.regions_mut();
            let (src, to) = if s < d {
                let (a, b) = regions.split_at_mut(d);
                (&a[s], &mut b[0])
            } else {
                let (a, b) = regions.split_at_mut(s);
                (&b[0], &mut a[d])
            };
            let from = src
                .slice(start, len)
                .expect("the transmit buffer holds the bytes sent (checked by send_tx_buf)");
            to.slice_mut(dst.offset as usize + at, len)
                .expect("pool slots lie in registered regions")
                .copy_from_slice(from);
        }
    }
}
