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

/// Wake the hub whenever `fd` becomes readable, for providers whose completions
/// arrive through a descriptor (the `soft` UDP socket, the `verbs` completion
/// channel). Readiness is cleared *before* waking, so data arriving while the woken
/// tasks poll raises a new edge: no wake-up is lost. Runs until aborted.
pub(crate) fn spawn_fd_watcher(
    fd: std::os::fd::OwnedFd,
    hub: Arc<WakeHub>,
) -> std::io::Result<tokio::task::AbortHandle> {
    // The safe constructor is deprecated because an arbitrary `AsRawFd` may not own
    // its descriptor (tokio#8587); ours is an `OwnedFd` (a dup) that the AsyncFd
    // owns and closes after deregistering, which is the I/O-safe case.
    #[allow(deprecated)]
    let afd = tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)?;
    let task = tokio::spawn(async move {
        loop {
            match afd.readable().await {
                Ok(mut guard) => {
                    guard.clear_ready();
                    hub.wake_by_ref();
                }
                Err(e) => {
                    tracing::warn!(%e, "readiness watcher stopped");
                    hub.wake_by_ref();
                    return;
                }
            }
        }
    });
    Ok(task.abort_handle())
}
