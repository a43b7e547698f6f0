//! The sends a UD queue pair has in flight and the address handles they use:
//! the accounting every provider keeps the same way. `sim` and `soft` reach it
//! through their software [`SendQueue`](super::send_queue::SendQueue); `verbs`,
//! whose send queue is the device's, uses it directly.
//!
//! - an address handle counts the sends in flight that use it, and destroying
//!   it is refused (`AhBusy`) while any is: the HCA reads the AH when it
//!   transmits, so destroying it under a posted WR is undefined behaviour;
//! - completions are in order (IBA 10.8.3): a completion for a WR retires it
//!   and every WR posted before it, signaled or not (IBA 10.8.6, selective
//!   signaling: an unsignaled WR is complete once a later WR's completion is
//!   polled). The completion names its WR by `wr_id`, the only thing a device
//!   completion carries; the oldest send in flight with that `wr_id` is the one
//!   it covers, so sends in flight should carry distinct `wr_id`s (the socket's
//!   do) for the count to be exact;
//! - a QP reset forgets every send in flight; the address handles stay (they
//!   belong to the protection domain, not to the QP).

use std::collections::VecDeque;

use slab::Slab;

use super::{AhId, FabricError};

/// A send posted and not yet retired by a polled completion.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    wr_id: u64,
    ah: AhId,
}

/// Address-handle table and sends in flight of one QP. `A` is the provider's
/// per-AH data (the resolved destination, or the device's `ibv_ah`).
pub(crate) struct SendLedger<A> {
    /// Each AH with the number of sends in flight that use it.
    ahs: Slab<(A, u32)>,
    in_flight: VecDeque<InFlight>,
}

impl<A> SendLedger<A> {
    /// An empty ledger with room for `depth` sends in flight.
    pub(crate) fn new(depth: usize) -> Self {
        SendLedger {
            ahs: Slab::new(),
            in_flight: VecDeque::with_capacity(depth),
        }
    }

    /// Add an address handle; its id names it in [`SendLedger::posted`].
    pub(crate) fn create_ah(&mut self, a: A) -> AhId {
        AhId(self.ahs.insert((a, 0)) as u32)
    }

    /// The provider's data of `ah`, if it exists.
    pub(crate) fn ah(&self, ah: AhId) -> Option<&A> {
        self.ahs.get(ah.0 as usize).map(|(a, _)| a)
    }

    /// Remove `ah` and hand back its data for the provider to free:
    /// `InvalidAh` if it does not exist, `AhBusy` while sends using it are in flight.
    pub(crate) fn destroy_ah(&mut self, ah: AhId) -> Result<A, FabricError> {
        match self.ahs.get(ah.0 as usize) {
            None => Err(FabricError::InvalidAh(ah.0)),
            Some((_, n)) if *n > 0 => Err(FabricError::AhBusy(ah.0)),
            Some(_) => Ok(self.ahs.remove(ah.0 as usize).0),
        }
    }

    /// Record a send posted with `wr_id` on `ah` (the caller checked that `ah`
    /// exists): it holds the AH until a completion retires it.
    pub(crate) fn posted(&mut self, wr_id: u64, ah: AhId) {
        if let Some((_, n)) = self.ahs.get_mut(ah.0 as usize) {
            *n += 1;
        }
        self.in_flight.push_back(InFlight { wr_id, ah });
    }

    /// A completion for `wr_id` was polled: retire the oldest send in flight
    /// with that `wr_id` and every send posted before it (in-order completion).
    /// Returns how many sends were retired; a `wr_id` not in flight retires none.
    pub(crate) fn retire(&mut self, wr_id: u64) -> usize {
        let Some(pos) = self.in_flight.iter().position(|s| s.wr_id == wr_id) else {
            return 0;
        };
        for s in self.in_flight.drain(..=pos) {
            if let Some((_, n)) = self.ahs.get_mut(s.ah.0 as usize) {
                *n = n.saturating_sub(1);
            }
        }
        pos + 1
    }

    /// Sends posted and not yet retired.
    pub(crate) fn outstanding(&self) -> usize {
        self.in_flight.len()
    }

    /// The QP was reset: every send in flight is gone, no AH is held by one.
    pub(crate) fn reset(&mut self) {
        self.in_flight.clear();
        for (_, (_, n)) in self.ahs.iter_mut() {
            *n = 0;
        }
    }

    /// Take every address handle out (the QP is going away; the provider frees them).
    // `sim` and `soft` drop theirs with the ledger; only `verbs` frees handles.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn drain_ahs(&mut self) -> impl Iterator<Item = A> + '_ {
        self.in_flight.clear();
        self.ahs.drain().map(|(a, _)| a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> (SendLedger<&'static str>, AhId, AhId) {
        let mut l = SendLedger::new(8);
        let a = l.create_ah("a");
        let b = l.create_ah("b");
        (l, a, b)
    }

    #[test]
    fn an_ah_in_use_cannot_be_destroyed_until_its_sends_retire() {
        let (mut l, a, b) = ledger();
        l.posted(1, a);
        assert_eq!(l.ah(a), Some(&"a"));
        assert!(matches!(l.destroy_ah(a), Err(FabricError::AhBusy(id)) if id == a.0));
        assert_eq!(l.destroy_ah(b).unwrap(), "b", "an unused AH goes at once");
        assert!(matches!(l.destroy_ah(b), Err(FabricError::InvalidAh(_))));
        assert_eq!(l.retire(1), 1);
        assert_eq!(l.destroy_ah(a).unwrap(), "a");
        assert_eq!(l.ah(a), None);
    }

    #[test]
    fn one_completion_retires_every_earlier_send_in_order() {
        let (mut l, a, b) = ledger();
        // Four unsignaled sends, then a signaled one (selective signaling).
        for (id, ah) in [(10, a), (11, b), (12, a), (13, b), (14, a)] {
            l.posted(id, ah);
        }
        l.posted(20, b);
        assert_eq!(l.outstanding(), 6);
        assert_eq!(l.retire(14), 5, "14 and the four posted before it");
        assert_eq!(l.outstanding(), 1);
        assert_eq!(l.destroy_ah(a).unwrap(), "a", "no send on a is in flight");
        assert!(matches!(l.destroy_ah(b), Err(FabricError::AhBusy(_))));
        assert_eq!(l.retire(20), 1);
        assert_eq!(l.outstanding(), 0);
        assert_eq!(l.destroy_ah(b).unwrap(), "b");
    }

    #[test]
    fn a_completion_not_in_flight_retires_nothing() {
        let (mut l, a, _) = ledger();
        l.posted(1, a);
        l.posted(2, a);
        assert_eq!(l.retire(99), 0);
        assert_eq!(l.outstanding(), 2);
        // A reused wr_id covers the oldest send that carries it.
        l.posted(1, a);
        assert_eq!(l.retire(1), 1);
        assert_eq!(l.outstanding(), 2);
        assert_eq!(l.retire(1), 2);
        assert_eq!(l.outstanding(), 0);
    }

    #[test]
    fn a_reset_forgets_the_sends_and_keeps_the_ahs() {
        let (mut l, a, b) = ledger();
        l.posted(1, a);
        l.posted(2, b);
        l.reset();
        assert_eq!(l.outstanding(), 0);
        assert_eq!(l.retire(2), 0, "nothing left to retire");
        assert_eq!(l.ah(a), Some(&"a"));
        assert_eq!(l.destroy_ah(a).unwrap(), "a");
        assert_eq!(l.destroy_ah(b).unwrap(), "b");
    }

    #[test]
    fn draining_hands_back_every_ah() {
        let (mut l, a, _) = ledger();
        l.posted(1, a);
        let mut all: Vec<_> = l.drain_ahs().collect();
        all.sort_unstable();
        assert_eq!(all, ["a", "b"]);
        assert_eq!(l.outstanding(), 0);
    }
}
