//! A log hook: the library's `tracing` events (quinn-proto's included) handed
//! to a C callback, filtered by a level the caller sets at run time.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void, CString};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{OnceLock, RwLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::error::{fail, guard, QR_EBUSY, QR_EINVAL, QR_OK};

/// Log level: nothing.
pub const QR_LOG_OFF: i32 = 0;
/// Log level: errors.
pub const QR_LOG_ERROR: i32 = 1;
/// Log level: warnings and above.
pub const QR_LOG_WARN: i32 = 2;
/// Log level: information and above.
pub const QR_LOG_INFO: i32 = 3;
/// Log level: debugging and above.
pub const QR_LOG_DEBUG: i32 = 4;
/// Log level: everything (per packet: slow).
pub const QR_LOG_TRACE: i32 = 5;

/// A log callback: `level` is one of `QR_LOG_*`, `target` the module that
/// logged ("quinn_proto::connection"), `message` the text with its fields;
/// both strings live only for the call. Called on whichever thread logged
/// (the thread polling the engine, for everything the engine does).
pub type qr_log_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        level: i32,
        target: *const c_char,
        message: *const c_char,
    ),
>;

struct Hook {
    cb: unsafe extern "C" fn(*mut c_void, i32, *const c_char, *const c_char),
    user: usize,
}

static HOOK: RwLock<Option<Hook>> = RwLock::new(None);
static LEVEL: AtomicI32 = AtomicI32::new(QR_LOG_OFF);
/// Whether our subscriber became the process's global one (set once).
static INSTALLED: OnceLock<bool> = OnceLock::new();

fn level_of(l: &Level) -> i32 {
    match *l {
        Level::ERROR => QR_LOG_ERROR,
        Level::WARN => QR_LOG_WARN,
        Level::INFO => QR_LOG_INFO,
        Level::DEBUG => QR_LOG_DEBUG,
        Level::TRACE => QR_LOG_TRACE,
    }
}

/// Collects an event's message and its other fields as `key=value`.
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

/// The subscriber behind the hook: events only (spans are not reported).
struct CHook;

impl Subscriber for CHook {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        level_of(m.level()) <= LEVEL.load(Ordering::Relaxed)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(match LEVEL.load(Ordering::Relaxed) {
            QR_LOG_ERROR => LevelFilter::ERROR,
            QR_LOG_WARN => LevelFilter::WARN,
            QR_LOG_INFO => LevelFilter::INFO,
            QR_LOG_DEBUG => LevelFilter::DEBUG,
            QR_LOG_TRACE => LevelFilter::TRACE,
            _ => LevelFilter::OFF,
        })
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let guard = HOOK.read().unwrap_or_else(|p| p.into_inner());
        let Some(hook) = guard.as_ref() else { return };
        let mut text = Text(String::new());
        event.record(&mut text);
        let target = CString::new(event.metadata().target()).unwrap_or_default();
        let message = CString::new(text.0.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the callback and its user pointer came from `qr_log_set`,
        // whose caller promised they stay valid while set; the strings live
        // across the call.
        unsafe {
            (hook.cb)(
                hook.user as *mut c_void,
                level_of(event.metadata().level()),
                target.as_ptr(),
                message.as_ptr(),
            )
        };
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Send the library's log to `cb` (called with `user`) at `level` and above
/// (`QR_LOG_*`); `cb` NULL or `QR_LOG_OFF` turns logging off. Process-wide;
/// may be called again to change the callback or the level. `QR_EBUSY` when
/// the process already installed another `tracing` subscriber (a Rust host
/// program's own logger): then that logger receives the library's events.
///
/// Returns: `QR_OK`, `QR_EINVAL` (`level` not one of `QR_LOG_*`), `QR_EBUSY`,
/// `QR_EPANIC`.
///
/// # Safety
/// `cb` is safe to call from any thread with `user` until logging is turned
/// off or another callback is set.
#[no_mangle]
pub unsafe extern "C" fn qr_log_set(cb: qr_log_fn, user: *mut c_void, level: i32) -> i32 {
    guard(|| {
        if !(QR_LOG_OFF..=QR_LOG_TRACE).contains(&level) {
            return Err(fail(QR_EINVAL, "level is not one of QR_LOG_*"));
        }
        if !*INSTALLED.get_or_init(|| tracing::subscriber::set_global_default(CHook).is_ok()) {
            return Err(fail(
                QR_EBUSY,
                "another tracing subscriber is already the process's global logger",
            ));
        }
        let level = if cb.is_some() { level } else { QR_LOG_OFF };
        *HOOK.write().unwrap_or_else(|p| p.into_inner()) = cb.map(|cb| Hook {
            cb,
            user: user as usize,
        });
        LEVEL.store(level, Ordering::Relaxed);
        // Callsites cached "never" under the old level must ask again.
        tracing::callsite::rebuild_interest_cache();
        Ok(QR_OK)
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;
    use std::sync::Mutex;

    use super::*;

    static SEEN: Mutex<Vec<(i32, String, String)>> = Mutex::new(Vec::new());

    unsafe extern "C" fn collect(
        user: *mut c_void,
        level: i32,
        target: *const c_char,
        msg: *const c_char,
    ) {
        assert_eq!(user as usize, 0x1234);
        // SAFETY: the hook passes NUL-terminated strings live for the call.
        let (t, m) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(msg)) };
        SEEN.lock().unwrap().push((
            level,
            t.to_string_lossy().into(),
            m.to_string_lossy().into(),
        ));
    }

    fn set(cb: qr_log_fn, level: i32) -> i32 {
        // SAFETY: `collect` is callable from any thread with any user pointer.
        unsafe { qr_log_set(cb, 0x1234 as *mut c_void, level) }
    }

    #[test]
    fn events_reach_the_callback_at_the_level_set() {
        assert_eq!(set(Some(collect), QR_LOG_WARN), QR_OK);
        tracing::warn!(target: "qr_test", peer = 7, "hello {}", 5);
        tracing::info!(target: "qr_test", "not at WARN");
        assert_eq!(set(Some(collect), QR_LOG_INFO), QR_OK);
        tracing::info!(target: "qr_test", "now at INFO");
        assert_eq!(set(None, QR_LOG_TRACE), QR_OK);
        tracing::error!(target: "qr_test", "off");
        assert_eq!(set(None, 9), QR_EINVAL);
        let seen = SEEN.lock().unwrap().clone();
        let ours: Vec<_> = seen
            .into_iter()
            .filter(|(_, t, _)| t == "qr_test")
            .collect();
        assert_eq!(
            ours,
            vec![
                (
                    QR_LOG_WARN,
                    "qr_test".to_owned(),
                    "hello 5 peer=7".to_owned()
                ),
                (QR_LOG_INFO, "qr_test".to_owned(), "now at INFO".to_owned()),
            ]
        );
    }
}
