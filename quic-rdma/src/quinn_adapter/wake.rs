//! One provider wake-up fanned out to every task waiting on the socket.
//!
//! A queue pair arms one waker (one completion channel), but quinn has several
//! tasks waiting: the endpoint driver for receives and one `UdpPoller` per
//! connection for send room. The hub is the waker the QP holds; waking it wakes
//! everyone registered since the last wake.

use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

#[derive(Default)]
pub(crate) struct WakeHub {
    waiting: Mutex<Vec<Waker>>,
}

impl WakeHub {
    /// Register `w` for the next wake (deduplicated).
    pub(crate) fn register(&self, w: &Waker) {
        let mut v = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !v.iter().any(|x| x.will_wake(w)) {
            v.push(w.clone());
        }
    }
}

impl Wake for WakeHub {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let woken = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        for w in woken {
            w.wake();
        }
    }
}
