//! The receive side of a simulated QP, inside the fabric (written by
//! senders' threads, read by the owner's polls).

use std::collections::VecDeque;

use crate::fabric::recv_queue::RecvQueue;
use crate::fabric::{AsyncEvent, Gid, QpKeys};

/// The receive side of one QP: its port's GID, its receive queue and its
/// asynchronous events.
pub(crate) struct QpRx {
    pub(crate) gid: Gid,
    pub(crate) rq: RecvQueue<Vec<u8>>,
    pub(crate) events: VecDeque<AsyncEvent>,
}

impl QpRx {
    pub(crate) fn new(gid: Gid, keys: QpKeys, max_recv_wr: usize) -> Self {
        QpRx {
            gid,
            rq: RecvQueue::new(keys, max_recv_wr),
            events: VecDeque::new(),
        }
    }

    /// Queue an asynchronous event and wake the owner.
    pub(crate) fn raise(&mut self, ev: AsyncEvent) {
        self.events.push_back(ev);
        self.rq.wake();
    }
}
