//! The receive half of a UD queue pair done in software: what the HCA does for
//! `verbs`, shared by `sim` and `soft` so both keep exactly the same semantics
//! (the counterpart of `send_queue.rs`).
//!
//! - a receive queue of `max_recv_wr` entries; `post_recv` refuses a WR when the
//!   queue is full, when its SGE names no region registered with this QP, or
//!   when it is shorter than the 40-byte GRH area every UD receive starts with
//!   (IBA 11.4.1.2), reporting the index of the first WR not posted;
//! - after the receiver's key checks ([`super::keys::accept`]), the UD rule: a
//!   packet finding no posted receive is dropped and counted (UD has no
//!   receiver-not-ready retry, docs/architecture.md §2); a posted receive
//!   shorter than the packet completes with `LocLenErr`;
//! - an arrival takes the oldest posted receive, and completes in arrival
//!   order; the bytes land in registered memory when the owner polls (software
//!   cannot DMA into memory it does not hold), so a region swapped since
//!   `post_recv` completes with `LocProtErr` — or, when the arrival happens
//!   during the owner's own poll ([`RecvQueue::arrive_into`]), at once, as a
//!   NIC's DMA would (one copy fewer), with the same `LocProtErr` rule;
//! - in the error state (IBA 10.3.1, 10.8.3) arrivals are dropped and every
//!   receive still posted completes with `WrFlushErr`, in order, until
//!   [`RecvQueue::reset`] (the provider's `recover`);
//! - one waker, woken once per arm when there is something to poll.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use super::{
    Completion, FabricError, Memory, ProviderDrops, QpKeys, Qpn, RecvWr, StampClock, Timestamp,
    WcOpcode, WcStatus, GRH_LEN,
};

/// A packet matched to a posted receive, waiting for its QP to poll.
pub(crate) struct Arrival<B> {
    wr: RecvWr,
    status: WcStatus,
    /// GRH area + payload length (what the completion reports).
    byte_len: u32,
    imm: Option<u32>,
    src_qp: Qpn,
    data: Payload<B>,
    /// When it arrived, if this queue stamps arrivals.
    timestamp: Option<Timestamp>,
}

/// A receive completion taken off the queue, its bytes not yet in memory
/// ([`RecvQueue::take`], [`RecvQueue::finish`]).
pub(crate) enum Taken<B> {
    /// A packet matched to a posted receive.
    Arrived(Arrival<B>),
    /// A posted receive flushed in the error state (its `wr_id`).
    Flushed(u64),
}

impl<B: AsRef<[u8]>> Taken<B> {
    /// Copy a parked packet into its receive's memory (a region swapped since
    /// `post_recv` completes with `LocProtErr`) and make its completion.
    fn complete(self, mem: &mut Memory, recycle: &mut impl FnMut(B)) -> Completion {
        let a = match self {
            Taken::Flushed(wr_id) => return Completion::recv_flushed(wr_id),
            Taken::Arrived(a) => a,
        };
        let mut status = a.status;
        if let Payload::Parked(data) = a.data {
            let len = a.byte_len as usize;
            match mem.resolve_mut(&a.wr.sge) {
                Some(buf) if buf.len() >= len => buf[..len].copy_from_slice(&data.as_ref()[..len]),
                // The region was swapped out since post_recv.
                _ => status = WcStatus::LocProtErr,
            }
            recycle(data);
        }
        Completion {
            wr_id: a.wr.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: a.byte_len,
            imm: a.imm,
            src_qp: a.src_qp,
            timestamp: a.timestamp,
        }
    }
}

/// Where an arrival's bytes are.
enum Payload<B> {
    /// GRH area + payload in a provider buffer, copied into the posted
    /// receive's memory when the owner polls.
    Parked(B),
    /// Already in the posted receive's memory ([`RecvQueue::arrive_into`]).
    Placed,
    /// Nothing to copy: the completion is an error (`LocLenErr`, `LocProtErr`).
    Lost,
}

/// Software receive queue and receive completion queue of one QP, with the
/// keys it accepts and its per-QP drop counters. `B` is the provider's packet
/// buffer (GRH area followed by the payload).
pub(crate) struct RecvQueue<B> {
    keys: QpKeys,
    posted: VecDeque<RecvWr>,
    arrived: VecDeque<Arrival<B>>,
    max_recv_wr: usize,
    /// Per-QP drops: `bad_pkey`, `bad_qkey`, `no_recv_posted`, `too_long`.
    pub(crate) drops: ProviderDrops,
    waker: Option<Waker>,
    /// In the error state: arrivals are dropped, posted receives flushed.
    error: bool,
    /// The clock arrivals are stamped on; `None`: not stamped.
    stamp_clock: Option<StampClock>,
    /// The time of the arrivals being delivered now, set by the provider
    /// ([`set_arrival_time`](Self::set_arrival_time)) only while stamping.
    arrival_time: Option<Instant>,
}

impl<B: AsRef<[u8]>> RecvQueue<B> {
    /// An empty queue of `max_recv_wr` entries for a QP accepting `keys`.
    pub(crate) fn new(keys: QpKeys, max_recv_wr: usize) -> Self {
        RecvQueue {
            keys,
            posted: VecDeque::with_capacity(max_recv_wr),
            arrived: VecDeque::with_capacity(max_recv_wr),
            max_recv_wr,
            drops: ProviderDrops::default(),
            waker: None,
            error: false,
            stamp_clock: None,
            arrival_time: None,
        }
    }

    /// Stamp later arrivals on `clock` (the provider's `enable_timestamps`).
    pub(crate) fn enable_stamps(&mut self, clock: StampClock) {
        self.stamp_clock = Some(clock);
    }

    /// Whether arrivals are stamped: the provider then reads its clock and
    /// calls [`set_arrival_time`](Self::set_arrival_time) before an arrival
    /// (and only then, so an unstamped queue costs no clock read).
    pub(crate) fn stamping(&self) -> bool {
        self.stamp_clock.is_some()
    }

    /// The time of the arrivals about to be delivered.
    pub(crate) fn set_arrival_time(&mut self, at: Instant) {
        self.arrival_time = Some(at);
    }

    /// The P_Key and Q_Key this QP accepts.
    pub(crate) fn keys(&self) -> QpKeys {
        self.keys
    }

    /// `ibv_post_recv`: queue `wrs` in order; `registered` says whether an lkey
    /// names a region registered with this QP. On error, `.0` WRs were posted.
    /// Receives posted in the error state are flushed like the others.
    pub(crate) fn post(
        &mut self,
        mem: &Memory,
        wrs: &[RecvWr],
        registered: impl Fn(u32) -> bool,
    ) -> Result<(), (usize, FabricError)> {
        for (i, wr) in wrs.iter().enumerate() {
            if self.posted.len() >= self.max_recv_wr {
                return Err((i, FabricError::QueueFull(self.posted.len())));
            }
            if mem.resolve(&wr.sge).is_none()
                || !registered(wr.sge.lkey)
                || (wr.sge.len as usize) < GRH_LEN
            {
                return Err((
                    i,
                    FabricError::QpError(format!(
                        "receive buffer {:?} not registered or shorter than the GRH",
                        wr.sge
                    )),
                ));
            }
            self.posted.push_back(*wr);
        }
        Ok(())
    }

    /// A packet of `byte_len` bytes (GRH area included) passed the key checks:
    /// match it to the oldest posted receive and park it for the owner's poll.
    /// `fill` builds the packet buffer; it is not called when the packet is
    /// dropped (no usable receive) or does not fit (`LocLenErr`). `starved`
    /// drops the packet as if no receive were posted (fault injection).
    /// Returns the status its completion will carry, `None` if it was dropped.
    pub(crate) fn arrive(
        &mut self,
        byte_len: usize,
        imm: Option<u32>,
        src_qp: Qpn,
        starved: bool,
        fill: impl FnOnce() -> B,
    ) -> Option<WcStatus> {
        self.arrive_with(byte_len, imm, src_qp, starved, |_| {
            (WcStatus::Success, Payload::Parked(fill()))
        })
    }

    /// [`arrive`](Self::arrive) while the owner is polling, its memory at hand:
    /// `fill` writes the GRH area and payload (`byte_len` bytes) straight into
    /// the posted receive's buffer in `mem`, so no packet buffer is parked and
    /// copied later. A buffer `mem` no longer resolves (region swapped since
    /// `post_recv`) completes with `LocProtErr`, as at poll time.
    pub(crate) fn arrive_into(
        &mut self,
        mem: &mut Memory,
        byte_len: usize,
        imm: Option<u32>,
        src_qp: Qpn,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<WcStatus> {
        self.arrive_with(byte_len, imm, src_qp, false, |wr| {
            match mem.resolve_mut(&wr.sge) {
                Some(buf) if buf.len() >= byte_len => {
                    fill(&mut buf[..byte_len]);
                    (WcStatus::Success, Payload::Placed)
                }
                _ => (WcStatus::LocProtErr, Payload::Lost),
            }
        })
    }

    /// The UD receive rule shared by both arrivals: take the oldest posted
    /// receive (or drop), check its length, then `place` the bytes.
    fn arrive_with(
        &mut self,
        byte_len: usize,
        imm: Option<u32>,
        src_qp: Qpn,
        starved: bool,
        place: impl FnOnce(&RecvWr) -> (WcStatus, Payload<B>),
    ) -> Option<WcStatus> {
        // A QP in the error state has no usable receive (IBA 10.3.1); the
        // receives it holds stay posted, to be flushed.
        let wr = if self.error || starved {
            None
        } else {
            self.posted.pop_front()
        };
        let Some(wr) = wr else {
            self.drops.no_recv_posted += 1;
            return None;
        };
        let (status, data) = if (wr.sge.len as usize) < byte_len {
            self.drops.too_long += 1;
            (WcStatus::LocLenErr, Payload::Lost)
        } else {
            place(&wr)
        };
        self.arrived.push_back(Arrival {
            wr,
            status,
            byte_len: byte_len as u32,
            imm,
            src_qp,
            data,
            timestamp: self
                .stamp_clock
                .zip(self.arrival_time)
                .map(|(clock, at)| Timestamp { at, clock }),
        });
        self.wake();
        Some(status)
    }

    /// Poll up to `out.len()` receive completions: arrivals first, written into
    /// `mem` now; then, in the error state, every receive still posted, flushed.
    /// Each packet buffer goes back through `recycle`.
    pub(crate) fn poll(
        &mut self,
        mem: &mut Memory,
        out: &mut [Completion],
        mut recycle: impl FnMut(B),
    ) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(t) = self.next_taken() else { break };
            out[n] = t.complete(mem, &mut recycle);
            n += 1;
        }
        n
    }

    /// The first half of [`poll`](Self::poll), for a provider whose queue sits
    /// behind a lock its senders take too (`sim`): move up to `max`
    /// completions' worth into `taken` without copying any bytes, so the lock
    /// is held only for that; [`finish`](Self::finish) does the rest after it
    /// is released.
    pub(crate) fn take(&mut self, max: usize, taken: &mut Vec<Taken<B>>) {
        while taken.len() < max {
            let Some(t) = self.next_taken() else { break };
            taken.push(t);
        }
    }

    /// The second half of [`poll`](Self::poll): write each of `taken` (in
    /// order, at most `out.len()`; it came from [`take`](Self::take) with
    /// that bound) into `mem` and `out`; the number written.
    pub(crate) fn finish(
        taken: &mut Vec<Taken<B>>,
        mem: &mut Memory,
        out: &mut [Completion],
        mut recycle: impl FnMut(B),
    ) -> usize {
        debug_assert!(taken.len() <= out.len());
        let mut n = 0;
        for (t, o) in taken.drain(..).zip(out.iter_mut()) {
            *o = t.complete(mem, &mut recycle);
            n += 1;
        }
        n
    }

    /// The next completion due: an arrival, or in the error state a posted
    /// receive to flush.
    fn next_taken(&mut self) -> Option<Taken<B>> {
        if let Some(a) = self.arrived.pop_front() {
            return Some(Taken::Arrived(a));
        }
        // In the error state every receive still posted completes flushed.
        if !self.error {
            return None;
        }
        self.posted.pop_front().map(|wr| Taken::Flushed(wr.wr_id))
    }

    /// Arrivals waiting to be polled.
    pub(crate) fn arrived(&self) -> usize {
        self.arrived.len()
    }

    /// Whether a poll would return a completion now.
    pub(crate) fn ready(&self) -> bool {
        !self.arrived.is_empty() || (self.error && !self.posted.is_empty())
    }

    /// Store the waker to wake on the next completion (`ibv_req_notify_cq`).
    pub(crate) fn set_waker(&mut self, waker: &Waker) {
        match &self.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => self.waker = Some(waker.clone()),
        }
    }

    /// Wake the armed waker, once: the owner re-arms before it sleeps again.
    pub(crate) fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Enter the error state (a fatal event, or a send completed in error,
    /// IBA 10.8.3) and wake the owner to collect the flushed receives.
    pub(crate) fn fail(&mut self) {
        self.error = true;
        self.wake();
    }

    /// Whether the QP is in the error state.
    pub(crate) fn in_error(&self) -> bool {
        self.error
    }

    /// Error → Reset (IBA 10.3.1): nothing posted, nothing to poll, no error.
    /// Unpolled packet buffers go back through `recycle`.
    pub(crate) fn reset(&mut self, mut recycle: impl FnMut(B)) {
        self.posted.clear();
        for a in self.arrived.drain(..) {
            if let Payload::Parked(d) = a.data {
                recycle(d);
            }
        }
        self.error = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Region, Sge, DEFAULT_PKEY, DEFAULT_QKEY};

    const LKEY: u32 = 0x77;

    fn setup(depth: usize) -> (RecvQueue<Vec<u8>>, Memory) {
        let mut mem = Memory::new();
        let mut r = Region::new(4096);
        r.set_lkey(Some(LKEY));
        mem.push(r);
        let keys = QpKeys {
            pkey: DEFAULT_PKEY,
            qkey: DEFAULT_QKEY,
        };
        (RecvQueue::new(keys, depth), mem)
    }

    fn wr(id: u64, offset: u32, len: u32) -> RecvWr {
        RecvWr {
            wr_id: id,
            sge: Sge {
                region: 0,
                offset,
                len,
                lkey: LKEY,
            },
        }
    }

    fn poll_all(rq: &mut RecvQueue<Vec<u8>>, mem: &mut Memory) -> Vec<Completion> {
        let mut out = [Completion::send(0); 16];
        let n = rq.poll(mem, &mut out, drop);
        out[..n].to_vec()
    }

    #[test]
    fn post_refuses_with_the_failing_index() {
        let (mut rq, mem) = setup(2);
        let ok = |l| l == LKEY;
        let short = wr(1, 0, GRH_LEN as u32 - 1);
        assert!(matches!(
            rq.post(&mem, &[wr(0, 0, 64), short], ok),
            Err((1, FabricError::QpError(_)))
        ));
        let foreign = RecvWr {
            sge: Sge {
                lkey: 9,
                ..wr(2, 0, 64).sge
            },
            ..wr(2, 0, 64)
        };
        assert!(matches!(
            rq.post(&mem, &[foreign], |_| true),
            Err((0, FabricError::QpError(_)))
        ));
        assert!(matches!(
            rq.post(&mem, &[wr(3, 64, 64)], |_| false),
            Err((0, FabricError::QpError(_)))
        ));
        assert!(matches!(
            rq.post(&mem, &[wr(4, 64, 64), wr(5, 128, 64)], ok),
            Err((1, FabricError::QueueFull(2)))
        ));
    }

    #[test]
    fn arrivals_fill_the_oldest_receive_and_count_what_cannot() {
        let (mut rq, mut mem) = setup(4);
        assert_eq!(rq.arrive(48, None, 5, false, || vec![1; 48]), None);
        assert_eq!(rq.drops.no_recv_posted, 1);
        rq.post(&mem, &[wr(0, 0, 64), wr(1, 64, 44), wr(2, 128, 64)], |_| {
            true
        })
        .unwrap();
        let ok = Some(WcStatus::Success);
        assert_eq!(rq.arrive(48, Some(9), 5, false, || vec![1; 48]), ok);
        let too_long = rq.arrive(48, None, 5, false, || unreachable!("too long"));
        assert_eq!(too_long, Some(WcStatus::LocLenErr));
        assert_eq!(
            rq.arrive(48, None, 5, true, || unreachable!("starved")),
            None
        );
        assert_eq!((rq.drops.too_long, rq.drops.no_recv_posted), (1, 2));
        let got = poll_all(&mut rq, &mut mem);
        let ids: Vec<_> = got.iter().map(|c| (c.wr_id, c.status, c.imm)).collect();
        assert_eq!(
            ids,
            [
                (0, WcStatus::Success, Some(9)),
                (1, WcStatus::LocLenErr, None)
            ]
        );
        assert_eq!(mem.region(0).unwrap().slice(0, 48).unwrap(), &[1; 48][..]);
        assert!(!rq.ready());
        assert!(poll_all(&mut rq, &mut mem).is_empty());
        let ok = Some(WcStatus::Success);
        assert_eq!(
            rq.arrive(48, None, 5, false, || vec![2; 48]),
            ok,
            "receive 2 stayed posted"
        );
    }

    #[test]
    fn a_region_swapped_since_post_completes_with_a_protection_error() {
        let (mut rq, mut mem) = setup(4);
        rq.post(&mem, &[wr(0, 0, 64)], |_| true).unwrap();
        assert!(rq.arrive(48, None, 5, false, || vec![1; 48]).is_some());
        mem.region_mut(0).unwrap().set_lkey(Some(LKEY + 1));
        let got = poll_all(&mut rq, &mut mem);
        assert_eq!(got[0].status, WcStatus::LocProtErr);
    }

    #[test]
    fn arrivals_during_the_owners_poll_land_in_its_memory_at_once() {
        let (mut rq, mut mem) = setup(4);
        rq.post(&mem, &[wr(0, 0, 64), wr(1, 64, 44), wr(2, 128, 64)], |_| {
            true
        })
        .unwrap();
        // Parked and placed arrivals complete in arrival order alike.
        assert!(rq.arrive(48, None, 5, false, || vec![1; 48]).is_some());
        let too_long = rq.arrive_into(&mut mem, 48, None, 5, |_| unreachable!("too long"));
        assert_eq!(too_long, Some(WcStatus::LocLenErr));
        let placed = rq.arrive_into(&mut mem, 48, Some(3), 6, |b| b.fill(2));
        assert_eq!(placed, Some(WcStatus::Success));
        // Written before any poll, as a NIC's DMA would be.
        assert_eq!(mem.region(0).unwrap().slice(128, 48).unwrap(), &[2; 48][..]);
        let got = poll_all(&mut rq, &mut mem);
        let ids: Vec<_> = got
            .iter()
            .map(|c| (c.wr_id, c.status, c.imm, c.src_qp))
            .collect();
        assert_eq!(
            ids,
            [
                (0, WcStatus::Success, None, 5),
                (1, WcStatus::LocLenErr, None, 5),
                (2, WcStatus::Success, Some(3), 6)
            ]
        );
        assert_eq!(mem.region(0).unwrap().slice(0, 48).unwrap(), &[1; 48][..]);
        assert_eq!(mem.region(0).unwrap().slice(128, 48).unwrap(), &[2; 48][..]);
        // A buffer that no longer resolves: a protection error, nothing written.
        rq.post(&mem, &[wr(3, 192, 64)], |_| true).unwrap();
        mem.region_mut(0).unwrap().set_lkey(Some(LKEY + 1));
        let swapped = rq.arrive_into(&mut mem, 48, None, 5, |_| unreachable!("swapped"));
        assert_eq!(swapped, Some(WcStatus::LocProtErr));
        assert_eq!(poll_all(&mut rq, &mut mem)[0].status, WcStatus::LocProtErr);
    }

    #[test]
    fn error_state_flushes_every_posted_receive_in_order_until_reset() {
        let (mut rq, mut mem) = setup(4);
        rq.post(&mem, &[wr(0, 0, 64), wr(1, 64, 64), wr(2, 128, 64)], |_| {
            true
        })
        .unwrap();
        assert!(rq.arrive(48, None, 5, false, || vec![1; 48]).is_some());
        rq.fail();
        assert!(rq
            .arrive(48, None, 5, false, || unreachable!("failed"))
            .is_none());
        rq.post(&mem, &[wr(3, 192, 64)], |_| true).unwrap();
        let got = poll_all(&mut rq, &mut mem);
        let ids: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            ids,
            [
                (0, WcStatus::Success),
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::WrFlushErr)
            ]
        );
        rq.reset(drop);
        assert!(!rq.in_error() && !rq.ready());
        rq.post(&mem, &[wr(4, 0, 64)], |_| true).unwrap();
        assert!(rq.arrive(48, None, 5, false, || vec![2; 48]).is_some());
        assert_eq!(poll_all(&mut rq, &mut mem)[0].status, WcStatus::Success);
    }
}
