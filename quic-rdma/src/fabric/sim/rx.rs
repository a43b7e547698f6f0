//! The receive side of a simulated QP, inside the fabric (written by
//! senders' threads, read by the owner's polls).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::fabric::recv_queue::RecvQueue;
use crate::fabric::{AsyncEvent, Gid, QpKeys};

/// The receive side of one QP: its port's GID, its receive queue and its
/// asynchronous events.
pub(crate) struct QpRx {
    pub(crate) gid: Gid,
    pub(crate) rq: RecvQueue<Vec<u8>>,
    pub(crate) events: VecDeque<AsyncEvent>,
    /// Set (under the fabric's lock) whenever a completion or an event may be
    /// waiting; the owner reads it without the lock, so polling an empty queue
    /// — what a spinning poller does most — never contends with senders for
    /// the lock (a NIC's CQ is polled without any lock shared with the wire).
    pub(super) doorbell: Arc<AtomicBool>,
}

impl QpRx {
    pub(crate) fn new(gid: Gid, keys: QpKeys, max_recv_wr: usize) -> Self {
        QpRx {
            gid,
            rq: RecvQueue::new(keys, max_recv_wr),
            events: VecDeque::new(),
            doorbell: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The doorbell, for the owner's lock-free look ([`Doorbell::rung`]).
    pub(crate) fn doorbell(&self) -> Doorbell {
        Doorbell(self.doorbell.clone())
    }

    /// Something may be waiting for the owner: say so before it is woken.
    pub(crate) fn ring(&self) {
        self.doorbell.store(true, Ordering::Release);
    }

    /// After the owner polled (under the lock): clear the doorbell if nothing
    /// is left, so its next look skips the lock. An arrival after this takes
    /// the lock and rings again.
    pub(crate) fn settle(&self) {
        if !self.rq.ready() && self.events.is_empty() {
            self.doorbell.store(false, Ordering::Relaxed);
        }
    }

    /// Queue an asynchronous event and wake the owner.
    pub(crate) fn raise(&mut self, ev: AsyncEvent) {
        self.events.push_back(ev);
        self.ring();
        self.rq.wake();
    }

    /// Enter the error state (flushing every posted receive) and wake the owner.
    pub(crate) fn fail(&mut self) {
        self.ring();
        self.rq.fail();
    }
}

/// The owner's end of a [`QpRx`]'s doorbell.
#[derive(Debug)]
pub(crate) struct Doorbell(Arc<AtomicBool>);

impl Doorbell {
    /// Whether a completion or an event may be waiting (if not, none is: one
    /// that arrives later rings before its wake-up).
    pub(crate) fn rung(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
