//! The send half of a UD queue pair done in software: what the HCA does for
//! `verbs`, shared by `sim` and `soft` so both keep exactly the same semantics.
//!
//! - a send queue of `max_send_wr` entries; an entry leaves it only when a polled
//!   completion covers it: completions are in order, so a signaled completion
//!   retires every earlier unsignaled send (IBA 10.8.3, selective signaling);
//! - error completions are always generated, successes only when signaled;
//! - inline sends are read at post time without an lkey check, others must name a
//!   region registered with this QP (else `LocProtErr`, IBA 10.6.3);
//! - a send above the active MTU is dropped and still completes as success —
//!   what hardware does, and why the socket enforces the MTU itself;
//! - address handles count the sends in flight that use them, so destroying one
//!   under an in-flight send is refused (undefined behaviour on hardware) — the
//!   [`SendLedger`] that `verbs` keeps too;
//! - a WR that completes in error moves the QP to the error state (IBA 10.8.3):
//!   every later WR completes with `WrFlushErr` and sends nothing, until
//!   [`SendQueue::reset`] (the provider's `recover`).

use std::collections::VecDeque;
use std::time::Instant;

use super::send_ledger::SendLedger;
use super::{
    AhId, Completion, FabricError, Memory, QpAttr, Region, SendWr, StampClock, Timestamp, WcStatus,
};

/// Software send queue, completion queue, AH table and lkey table of one QP.
/// `A` is the provider's per-AH data (e.g. the resolved destination).
pub(crate) struct SendQueue<A> {
    /// The AH table and the sends in flight (the send queue's entries).
    ledger: SendLedger<A>,
    cq: VecDeque<Completion>,
    lkeys: Vec<u32>,
    max_send_wr: usize,
    max_inline: u32,
    mtu: usize,
    oversize_sent: u64,
    /// In the error state: WRs are flushed, not sent.
    error: bool,
    /// The clock send completions are stamped on; `None`: not stamped.
    stamp_clock: Option<StampClock>,
}

impl<A> SendQueue<A> {
    pub(crate) fn new(attr: &QpAttr) -> Self {
        SendQueue {
            ledger: SendLedger::new(attr.max_send_wr as usize),
            cq: VecDeque::with_capacity(attr.max_send_wr as usize),
            lkeys: Vec::new(),
            max_send_wr: attr.max_send_wr as usize,
            max_inline: attr.max_inline,
            mtu: attr.active_mtu.bytes(),
            oversize_sent: 0,
            error: false,
            stamp_clock: None,
        }
    }

    /// Stamp later send completions on `clock` (the provider's
    /// `enable_timestamps`).
    pub(crate) fn enable_stamps(&mut self, clock: StampClock) {
        self.stamp_clock = Some(clock);
    }

    /// Whether send completions are stamped (the provider reads its clock
    /// only then).
    pub(crate) fn stamping(&self) -> bool {
        self.stamp_clock.is_some()
    }

    /// How many completions wait to be polled: the mark a provider takes
    /// before posting a batch, to [`stamp_since`](Self::stamp_since) it.
    pub(crate) fn queued(&self) -> usize {
        self.cq.len()
    }

    /// Stamp the completions queued since `mark` with `at`, the time the
    /// batch left (on the stamp clock; a no-op when not stamping).
    pub(crate) fn stamp_since(&mut self, mark: usize, at: Instant) {
        let Some(clock) = self.stamp_clock else {
            return;
        };
        for c in self.cq.iter_mut().skip(mark) {
            c.timestamp = Some(Timestamp { at, clock });
        }
    }

    /// Record `region` as registered with this QP under `lkey`.
    pub(crate) fn register(&mut self, region: &mut Region, lkey: u32) {
        self.lkeys.push(lkey);
        region.set_lkey(Some(lkey));
    }

    /// Forget `region`'s registration: its lkey no longer resolves here.
    pub(crate) fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let lkey = region.lkey();
        let Some(i) = self.lkeys.iter().position(|k| Some(*k) == lkey) else {
            return Err(FabricError::Registration(format!(
                "lkey {lkey:?} is not registered with this QP"
            )));
        };
        self.lkeys.swap_remove(i);
        region.set_lkey(None);
        Ok(())
    }

    /// Whether `lkey` names a region registered with this QP.
    pub(crate) fn is_registered(&self, lkey: u32) -> bool {
        self.lkeys.contains(&lkey)
    }

    pub(crate) fn create_ah(&mut self, a: A) -> AhId {
        self.ledger.create_ah(a)
    }

    /// Destroy an AH; `AhBusy` while sends using it are in flight.
    pub(crate) fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError> {
        self.ledger.destroy_ah(ah).map(drop)
    }

    /// Post one WR: validate it, hand its payload to `transmit` unless the
    /// hardware would drop it, and queue its completion. An `Err` means the WR
    /// was not posted (the caller reports its index). The payload handed to
    /// `transmit` borrows `mem`, so a provider may keep it until it sends,
    /// within the `post_send`, instead of copying it.
    pub(crate) fn post<'m>(
        &mut self,
        mem: &'m Memory,
        wr: &SendWr,
        transmit: impl FnOnce(&A, &'m [u8]),
    ) -> Result<(), FabricError> {
        if self.ledger.outstanding() >= self.max_send_wr {
            return Err(FabricError::QueueFull(self.ledger.outstanding()));
        }
        let Some(ah) = self.ledger.ah(wr.ah) else {
            return Err(FabricError::InvalidAh(wr.ah.0));
        };
        if wr.flags.inline && wr.sge.len > self.max_inline {
            return Err(FabricError::QpError(format!(
                "inline send of {} bytes exceeds max_inline {}",
                wr.sge.len, self.max_inline
            )));
        }
        let data = if wr.flags.inline {
            // No lkey check (the library copies the bytes), but the memory
            // must still be where its region says, as `verbs` requires too.
            mem.region(wr.sge.region)
                .filter(|r| r.intact())
                .and_then(|r| r.slice(wr.sge.offset as usize, wr.sge.len as usize))
        } else {
            mem.resolve(&wr.sge)
                .filter(|_| self.lkeys.contains(&wr.sge.lkey))
        };
        let status = match data {
            _ if self.error => WcStatus::WrFlushErr,
            None => {
                self.error = true;
                WcStatus::LocProtErr
            }
            Some(d) if d.len() > self.mtu => {
                self.oversize_sent += 1;
                WcStatus::Success
            }
            Some(d) => {
                transmit(ah, d);
                WcStatus::Success
            }
        };
        self.ledger.posted(wr.wr_id, wr.ah);
        if wr.flags.signaled || status != WcStatus::Success {
            self.cq.push_back(Completion {
                status,
                ..Completion::send(wr.wr_id)
            });
        }
        Ok(())
    }

    /// Enter the error state (a fatal event, or the receive side failed).
    pub(crate) fn set_error(&mut self) {
        self.error = true;
    }

    /// Whether the QP is in the error state.
    pub(crate) fn in_error(&self) -> bool {
        self.error
    }

    /// Leave the error state with nothing outstanding: the send queue and
    /// unpolled completions are discarded; address handles stay (they belong
    /// to the protection domain, not the QP) with no sends counted against them.
    pub(crate) fn reset(&mut self) {
        self.ledger.reset();
        self.cq.clear();
        self.error = false;
    }

    /// Poll send completions, retiring the sends each one covers.
    pub(crate) fn poll(&mut self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.cq.pop_front() else {
                break;
            };
            self.ledger.retire(c.wr_id);
            out[n] = c;
            n += 1;
        }
        n
    }

    /// Whether completions wait to be polled.
    pub(crate) fn has_completions(&self) -> bool {
        !self.cq.is_empty()
    }

    /// Sends posted and not yet retired.
    pub(crate) fn outstanding(&self) -> usize {
        self.ledger.outstanding()
    }

    /// Sends dropped for exceeding the MTU (completed as success).
    pub(crate) fn oversize_sent(&self) -> u64 {
        self.oversize_sent
    }
}
