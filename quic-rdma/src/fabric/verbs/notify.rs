//! Wake-ups for async callers: the completion channel (docs/architecture.md §5).
//!
//! `VerbsQp::arm` asks both CQs for an event on their next completion
//! (`ibv_req_notify_cq`), stores the waker, and polls once (returning `true` if
//! completions were already there, so the caller polls again instead of sleeping).
//! The event arrives on the completion channel's file descriptor; someone must
//! read it and wake the stored waker. That is a [`VerbsNotifier`]:
//!
//! - tokio: `qp.notifier().spawn()` starts a task that waits on the channel fd
//!   (and the device's async-event fd) with `tokio::io::unix::AsyncFd` and wakes
//!   the armed waker — no extra thread;
//! - any other event loop: watch [`VerbsNotifier::fd`] (and
//!   [`VerbsNotifier::async_fd`]) for readability, then call
//!   [`VerbsNotifier::drain_and_wake`];
//! - busy-polling callers never arm and need none of it.

#[cfg(feature = "quinn")]
use std::io;
#[cfg(feature = "quinn")]
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use rdma_sys::*;

use super::device::Device;

pub(crate) struct NotifyShared {
    pub(crate) dev: Arc<Device>,
    waker: Mutex<Option<Waker>>,
    #[cfg(feature = "quinn")]
    shutdown: tokio::sync::Notify,
}

impl NotifyShared {
    pub(crate) fn new(dev: Arc<Device>) -> Self {
        NotifyShared {
            dev,
            waker: Mutex::new(None),
            #[cfg(feature = "quinn")]
            shutdown: tokio::sync::Notify::new(),
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

    pub(crate) fn shutdown(&self) {
        #[cfg(feature = "quinn")]
        self.shutdown.notify_one();
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

#[cfg(feature = "quinn")]
struct Fd(RawFd);

#[cfg(feature = "quinn")]
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
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
        let dev = &self.shared.dev;
        let mut n = 0;
        loop {
            let mut cq: *mut ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: the channel is valid while `dev` lives; its fd is non-blocking,
            // so this returns -1 (EAGAIN) when no event is pending.
            let rc = unsafe { ibv_get_cq_event(dev.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                break;
            }
            // SAFETY: `cq` is the CQ the event came from (one of ours); ack it once.
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
        self.shared.wake();
        n
    }

    /// Wait on the channel and async-event fds with tokio (feature `quinn`) and wake the armed waker
    /// on each event, until the queue pair is dropped. Must run inside a tokio
    /// runtime with IO enabled.
    #[cfg(feature = "quinn")]
    pub async fn run(self) -> io::Result<()> {
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        // SAFETY: both fds belong to the Device, which `self.shared.dev` keeps open
        // (and unchanged) until after both AsyncFds are dropped at the end of run().
        let chan = unsafe { AsyncFd::register_with_interest(Fd(self.fd()), Interest::READABLE) }
            .map_err(io::Error::from)?;
        // SAFETY: as above.
        let asy =
            unsafe { AsyncFd::register_with_interest(Fd(self.async_fd()), Interest::READABLE) }
                .map_err(io::Error::from)?;
        loop {
            tokio::select! {
                _ = self.shared.shutdown.notified() => return Ok(()),
                g = chan.readable() => {
                    let mut g = g?;
                    self.drain_and_wake();
                    g.clear_ready();
                }
                g = asy.readable() => {
                    // The events themselves are read by poll_event (the socket
                    // drains them all on its next recv); waking its tasks makes it
                    // run. tokio's readiness is edge-triggered, so clearing it waits
                    // for the next event instead of spinning on an unread one.
                    let mut g = g?;
                    g.clear_ready();
                    self.shared.wake();
                }
            }
        }
    }

    /// Spawn [`VerbsNotifier::run`] on the current tokio runtime.
    #[cfg(feature = "quinn")]
    pub fn spawn(self) -> tokio::task::JoinHandle<io::Result<()>> {
        tokio::spawn(self.run())
    }
}
