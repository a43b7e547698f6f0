//! Wake-ups for async callers: the completion channel (docs/architecture.md §5).
//!
//! `VerbsQp::arm` consumes the completion channel's pending events, asks both
//! CQs for an event on their next completion (`ibv_req_notify_cq`), stores the
//! waker, and polls once (returning `true` if completions were already there, so
//! the caller polls again instead of sleeping). The next event makes the
//! channel's descriptor readable:
//!
//! - every caller that sleeps on a provider's descriptor — the quinn adapter,
//!   an engine caller — waits on `UdQueuePair::readiness_fd` (an epoll set of
//!   the channel's fd and the async-event fd) like on any provider's, and polls
//!   when it turns readable; the next `arm` consumes a completion event, the
//!   socket's poll an async event;
//! - an event loop that wants the stored waker woken instead watches
//!   [`VerbsNotifier::fd`] (and [`VerbsNotifier::async_fd`]) and calls
//!   [`VerbsNotifier::drain_and_wake`];
//! - busy-polling callers never arm and need none of it.
//!
//! No runtime here: the fabric layer uses no tokio.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use super::device::Device;

pub(crate) struct NotifyShared {
    pub(crate) dev: Arc<Device>,
    waker: Mutex<Option<Waker>>,
}

impl NotifyShared {
    pub(crate) fn new(dev: Arc<Device>) -> Self {
        NotifyShared {
            dev,
            waker: Mutex::new(None),
        }
    }

    pub(crate) fn store(&self, w: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some(old) if old.will_wake(w) => {}
            _ => *slot = Some(w.clone()),
        }
    }

    fn wake(&self) {
        let w = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The queue pair is going away: wake whoever waits, so it notices.
    pub(crate) fn shutdown(&self) {
        self.wake();
    }
}

/// Reads completion-channel events and wakes the waker of the last `arm`
/// (see the [module docs](self)). Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct VerbsNotifier {
    pub(crate) shared: Arc<NotifyShared>,
}

impl std::fmt::Debug for VerbsNotifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsNotifier")
            .field("fd", &self.fd())
            .finish()
    }
}

impl VerbsNotifier {
    /// The completion channel's fd (non-blocking): readable when an armed CQ
    /// got a completion.
    pub fn fd(&self) -> RawFd {
        self.shared.dev.channel_fd()
    }

    /// The device's async-event fd (non-blocking): readable on port/QP events,
    /// which `UdQueuePair::poll_event` then reports.
    pub fn async_fd(&self) -> RawFd {
        self.shared.dev.async_fd()
    }

    /// Consume every pending completion-channel event (without blocking),
    /// acknowledge each, and wake the waker stored by the last `arm`.
    /// Returns the number of events consumed.
    pub fn drain_and_wake(&self) -> usize {
        let n = self.shared.dev.drain_channel();
        self.shared.wake();
        n
    }
}
