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

impl WakeHub {
    /// Wake everyone registered except `me`, who is running and stays registered.
    ///
    /// A task that consumes what another sleeps on must call this: retiring send
    /// completions frees the room a writer waits for, and arming a `verbs` QP
    /// drains its completion channel, so the descriptor edge that would have woken
    /// the other sleepers never reaches the watcher.
    pub(crate) fn wake_others(&self, me: &Waker) {
        let mut v = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let mine = v
            .iter()
            .position(|w| w.will_wake(me))
            .map(|i| v.swap_remove(i));
        let woken = std::mem::replace(&mut *v, mine.into_iter().collect());
        drop(v);
        for w in woken {
            w.wake();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn wake_others_wakes_the_others_once_and_keeps_the_caller_registered() {
        let hub = Arc::new(WakeHub::default());
        let (reader, rw) = counter();
        let (writer, ww) = counter();
        hub.register(&rw);
        hub.register(&ww);
        hub.register(&ww); // deduplicated

        // The reader retired the writer's send completions: the writer wakes,
        // the reader (running) does not.
        hub.wake_others(&rw);
        assert_eq!(writer.0.load(Ordering::Relaxed), 1);
        assert_eq!(reader.0.load(Ordering::Relaxed), 0);

        // The writer's wake was consumed; the reader is still registered, so the
        // next descriptor edge reaches it (and only it).
        hub.wake_by_ref();
        assert_eq!(reader.0.load(Ordering::Relaxed), 1);
        assert_eq!(writer.0.load(Ordering::Relaxed), 1);

        // Nobody left: a wake reaches no one.
        hub.wake_by_ref();
        assert_eq!(reader.0.load(Ordering::Relaxed), 1);
        assert_eq!(writer.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn wake_others_from_an_unregistered_caller_wakes_everyone() {
        let hub = Arc::new(WakeHub::default());
        let (a, aw) = counter();
        let (b, bw) = counter();
        let (_me, mw) = counter();
        hub.register(&aw);
        hub.register(&bw);
        hub.wake_others(&mw);
        assert_eq!(a.0.load(Ordering::Relaxed), 1);
        assert_eq!(b.0.load(Ordering::Relaxed), 1);
        hub.wake_by_ref();
        assert_eq!(a.0.load(Ordering::Relaxed) + b.0.load(Ordering::Relaxed), 2);
    }
}
