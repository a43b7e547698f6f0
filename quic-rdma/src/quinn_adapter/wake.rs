//! One provider wake-up fanned out to every task waiting on the socket.
//!
//! A queue pair arms one waker (one completion channel), but quinn has several
//! tasks waiting: the endpoint driver for receives and one `UdpPoller` per
//! connection for send room. The hub is the waker the QP holds; waking it wakes
//! everyone registered since the last wake.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

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

/// The provider's readiness descriptor (the `soft` UDP socket, the `verbs`
/// epoll set of its completion channel and async events), registered with the
/// runtime's reactor, which wakes the hub directly when it becomes readable.
///
/// It is owned by the socket (not by a task), so dropping the socket closes the
/// descriptor at once: a `soft` port's address is free again when the last
/// handle to its socket is gone.
pub(crate) struct FdReadiness {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

impl FdReadiness {
    /// Register `fd` (a duplicate the caller gives up) with the current runtime's
    /// reactor. Call inside a runtime.
    pub(crate) fn new(fd: std::os::fd::OwnedFd) -> std::io::Result<Self> {
        // The safe constructor is deprecated because an arbitrary `AsRawFd` may not
        // own its descriptor (tokio#8587); ours is an `OwnedFd` (a dup) that the
        // AsyncFd owns and closes after deregistering, which is the I/O-safe case.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)?;
        Ok(FdReadiness { fd })
    }

    /// Have the reactor wake `hub` on the descriptor's next readable edge.
    ///
    /// Readiness the reactor already reported is cleared first, so the caller
    /// must look for work after this (the queue pair's `arm` does, peeking at
    /// the descriptor): what arrived before the registration is found by that
    /// look, what arrives after raises a new edge. No wake-up is lost.
    pub(crate) fn register(&self, hub: &Waker) {
        let mut cx = Context::from_waker(hub);
        loop {
            match self.fd.poll_read_ready(&mut cx) {
                Poll::Ready(Ok(mut guard)) => guard.clear_ready(),
                Poll::Ready(Err(e)) => {
                    // The reactor is gone (runtime shut down): nothing can wake us.
                    tracing::warn!(%e, "readiness of the provider's descriptor lost");
                    return;
                }
                Poll::Pending => return,
            }
        }
    }
}
