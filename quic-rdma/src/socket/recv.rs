//! The receive path: batched completion polling, GRH parsing, reassembly of
//! segmented datagrams, batched reposting.

use std::time::Instant;

use super::{segment, SocketError, UdSocket, RECV_POLL_BATCH};
use crate::fabric::addr::MAX_QPN;
use crate::fabric::grh::Grh;
use crate::fabric::{RecvWr, Timestamp, UdAddr, UdQueuePair, WcStatus, GRH_LEN};

/// One received datagram, borrowed from its receive slot until the callback returns.
#[derive(Debug)]
pub struct Received<'a> {
    /// The sender: GID from the GRH, QPN from the completion. The Q_Key is ours —
    /// every endpoint of a deployment shares one Q_Key, so it is also the reply's.
    pub src: UdAddr,
    /// ECN codepoint from the GRH traffic class.
    pub ecn: u8,
    /// The immediate data, if the sender used SEND with immediate.
    pub imm: Option<u32>,
    /// The payload (after the 40-byte GRH area).
    pub data: &'a [u8],
    /// When it arrived, if the socket stamps completions
    /// ([`UdSocket::enable_timestamps`]); for a segmented datagram, when its
    /// last part arrived.
    pub timestamp: Option<Timestamp>,
}

impl<Q: UdQueuePair> UdSocket<Q> {
    /// Post free receive slots until the window is posted (at construction,
    /// after a recovery, and when the window grows).
    pub(super) fn fill_recv_queue(&mut self) -> Result<(), SocketError> {
        self.top_up_reposts();
        self.post_reposts()
    }

    /// Queue free slots for posting until posted plus queued fill the window
    /// (registering more buffers first if the window outgrew them).
    fn top_up_reposts(&mut self) {
        if let Err(e) = self
            .recv_pool
            .grow_to(self.recv_window, &mut self.qp, &mut self.mem)
        {
            // The window stays what the registered buffers allow.
            tracing::warn!(%e, window = self.recv_window, "registering receive buffers failed");
        }
        while self.recv_posted + self.reposts.len() < self.recv_window {
            let Some(slot) = self.recv_pool.alloc() else {
                break;
            };
            let sge = self.recv_pool.recv_sge(&self.mem, slot);
            self.reposts.push(RecvWr {
                wr_id: u64::from(slot),
                sge,
            });
        }
    }

    /// The receiver fell behind (a quarter of the window or less is still
    /// posted): double the window, up to `recv_depth`, and queue the extra
    /// slots. Never shrinks: the next burst like this one must not lose.
    fn grow_window_if_low(&mut self) {
        if self.recv_posted > self.recv_window / 4 || self.recv_window >= self.cfg.recv_depth {
            return;
        }
        self.recv_window = (self.recv_window * 2).min(self.cfg.recv_depth);
        self.stats.recv_window_grows += 1;
        self.top_up_reposts();
    }

    fn post_reposts(&mut self) -> Result<(), SocketError> {
        if self.reposts.is_empty() || self.failed.is_some() {
            return Ok(());
        }
        let r = self.qp.post_recv(&mut self.mem, &self.reposts);
        let posted = match &r {
            Ok(()) => self.reposts.len(),
            Err((k, _)) => *k,
        };
        self.stats.recv_posts += 1;
        self.stats.recv_wrs_posted += posted as u64;
        self.recv_posted += posted;
        for wr in self.reposts.drain(..posted) {
            self.recv_slot_posted[wr.wr_id as usize] = true;
        }
        r.map_err(|(_, e)| e.into())
    }

    /// Receive up to `max` datagrams, handing each to `deliver`. Returns how many
    /// were delivered. Malformed packets (bad GRH, error completions) are dropped
    /// and counted, never delivered.
    ///
    /// Reads the wall clock for the reassembly timeout of segmented datagrams;
    /// a caller with a clock of its own (the engine) calls [`recv_at`](Self::recv_at).
    pub fn recv(&mut self, max: usize, deliver: impl FnMut(Received<'_>)) -> usize {
        self.recv_at(Instant::now(), max, deliver)
    }

    /// [`recv`](Self::recv) at time `now`: a part of a segmented datagram
    /// (docs/architecture.md §6) is taken into its datagram, which is handed up
    /// whole once its last part is in; datagrams whose parts have not all
    /// arrived within the reassembly timeout of `now` are dropped and counted.
    pub fn recv_at(
        &mut self,
        now: Instant,
        max: usize,
        mut deliver: impl FnMut(Received<'_>),
    ) -> usize {
        self.handle_events();
        self.reassembly.expire(now);
        let mut wcs = std::mem::take(&mut self.recv_wcs);
        let mut delivered = 0;
        let mut qp_failed = false;
        while delivered < max {
            let want = (max - delivered).min(RECV_POLL_BATCH);
            let n = self.qp.poll_recv_cq(&mut self.mem, &mut wcs[..want]);
            for wc in &wcs[..n] {
                let Some(slot) = self.take_posted(wc.wr_id) else {
                    self.stats.recv_bogus_completions += 1;
                    continue;
                };
                self.recv_posted -= 1;
                let sge = self.recv_pool.recv_sge(&self.mem, slot);
                if wc.status == WcStatus::Success {
                    let buf = self
                        .mem
                        .resolve(&sge)
                        .expect("pool slots lie in registered regions");
                    let len = wc.byte_len as usize;
                    if !(GRH_LEN..=buf.len()).contains(&len) || wc.src_qp > MAX_QPN {
                        // Hardware reports an overlong message as LocLenErr and
                        // always writes the GRH area: this completion is not real.
                        self.stats.recv_bogus_completions += 1;
                    } else {
                        match Grh::parse(&buf[..GRH_LEN], self.layout) {
                            Err(e) => {
                                self.stats.drop_bad_grh += 1;
                                tracing::debug!(%e, "dropping packet with bad GRH");
                            }
                            Ok(grh) if self.cfg.segmentation && segment::is_part(wc.imm) => {
                                let part_imm = wc.imm.unwrap_or_default();
                                let src = (grh.sgid, wc.src_qp);
                                let payload = &buf[GRH_LEN..len];
                                if let Some(d) =
                                    self.reassembly
                                        .accept(now, src, part_imm, grh.ecn(), payload)
                                {
                                    self.stats.recv_packets += 1;
                                    self.stats.recv_bytes += d.data.len() as u64;
                                    delivered += 1;
                                    deliver(Received {
                                        src: UdAddr::new(grh.sgid, wc.src_qp, self.local.qkey),
                                        ecn: d.ecn,
                                        imm: d.imm,
                                        data: d.data,
                                        timestamp: wc.timestamp,
                                    });
                                }
                            }
                            Ok(grh) => {
                                let data = &buf[GRH_LEN..len];
                                self.stats.recv_packets += 1;
                                self.stats.recv_bytes += data.len() as u64;
                                delivered += 1;
                                deliver(Received {
                                    src: UdAddr::new(grh.sgid, wc.src_qp, self.local.qkey),
                                    ecn: grh.ecn(),
                                    imm: wc.imm,
                                    data,
                                    timestamp: wc.timestamp,
                                });
                            }
                        }
                    }
                } else {
                    self.stats.recv_errors += 1;
                    if wc.status == WcStatus::WrFlushErr {
                        // The QP is in the error state: its slots come back
                        // when it is recovered, below; reposting now would
                        // only be flushed again.
                        qp_failed = true;
                        continue;
                    }
                }
                self.reposts.push(RecvWr {
                    wr_id: u64::from(slot),
                    sge,
                });
            }
            // Repost in batches, and at once if the queue runs low (a UD packet that
            // finds no posted receive is lost).
            self.grow_window_if_low();
            if self.reposts.len() >= self.cfg.repost_batch
                || self.recv_posted <= self.recv_window / 2
            {
                if let Err(e) = self.post_reposts() {
                    tracing::warn!(%e, "post_recv failed");
                }
            }
            if n < want || qp_failed {
                break;
            }
        }
        self.recv_wcs = wcs;
        if qp_failed {
            self.recover_qp();
        }
        delivered
    }

    /// The receive slot a completion's wr_id names, if the provider holds it
    /// (and from now on it does not).
    fn take_posted(&mut self, wr_id: u64) -> Option<u32> {
        let slot = u32::try_from(wr_id).ok()?;
        let held = self.recv_slot_posted.get_mut(slot as usize)?;
        std::mem::replace(held, false).then_some(slot)
    }
}
