//! The real-time clock's wire thread: it delivers held packets on time.

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::state::Shared;

/// Longest sleep between looks at the wire (a packet held meanwhile wakes it
/// through the condition variable; this bounds a missed notification).
const MAX_WAIT: Duration = Duration::from_millis(20);

/// Run the wire thread; it exits once the fabric is gone.
pub(crate) fn spawn(shared: Weak<Shared>) {
    std::thread::Builder::new()
        .name("sim-wire".into())
        .spawn(move || loop {
            let Some(sh) = shared.upgrade() else { return };
            let mut st = sh.lock();
            let next = st.pump(&sh.cfg, Instant::now());
            let wait = next
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            let (g, _) = sh
                .wire_cv
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner());
            drop(g);
        })
        .expect("spawn sim wire thread");
}
