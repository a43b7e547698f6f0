//! Every counter of an engine by index: the list is what the counters'
//! visitors (`quic_rdma::counters::Counters`) of the UD socket (provider
//! drops included) and of the routing check visit — the same names, groups,
//! kinds and values as `qr`'s JSON report of a socket and its `/metrics` — so
//! a counter added to a visitor reaches C programs with no code here.
//!
//! Built for poll loops: look the indices up once at start-up
//! (`qr_stat_count`, `qr_stat_info`, `qr_stat_find`), then
//! `qr_engine_stats_read` fills the caller's array without allocating.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use quic_rdma::counters::{Counters, Kind, Metric, Unit};
use quic_rdma::quic::RoutingStats;
use quic_rdma::socket::SocketStats;

use crate::engine::qr_engine;
use crate::error::{fail, guard, QR_EINVAL, QR_ENULL, QR_OK};
use crate::ptr::{obj, text, write_versioned, Versioned};
use crate::valgrind::mark_defined;

/// `qr_stat_desc.kind`: only grows while the engine lives.
pub const QR_STAT_COUNTER: u32 = 0;
/// `qr_stat_desc.kind`: a current level that goes up and down.
pub const QR_STAT_GAUGE: u32 = 1;

/// `qr_stat_desc.unit`: a count of things (packets, events, work requests).
pub const QR_STAT_UNIT_COUNT: u32 = 0;
/// `qr_stat_desc.unit`: bytes.
pub const QR_STAT_UNIT_BYTES: u32 = 1;
/// `qr_stat_desc.unit`: seconds.
pub const QR_STAT_UNIT_SECONDS: u32 = 2;

/// What one counter of `qr_engine_stats_read`'s array is (`qr_stat_info`).
/// Version 1. The strings are static: valid, unchanged, for the life of the
/// process; never free them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_stat_desc {
    /// Set by the caller to `sizeof(qr_stat_desc)`; set on return to the bytes written.
    pub struct_size: u32,
    /// `QR_STAT_COUNTER` or `QR_STAT_GAUGE`.
    pub kind: u32,
    /// `QR_STAT_UNIT_COUNT`, `QR_STAT_UNIT_BYTES` or `QR_STAT_UNIT_SECONDS`.
    pub unit: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The key `qr_stat_find` takes and `qr demo --json` nests under:
    /// `name`, or `group.name` (`"sent_wrs"`, `"drops.bad_grh"`). Unique.
    pub path: *const c_char,
    /// The name within its group, snake case (`"bad_grh"`).
    pub name: *const c_char,
    /// The group (`"drops"`: every cause of a lost packet), or NULL.
    pub group: *const c_char,
    /// One line for people (what `/metrics` says in `# HELP`).
    pub help: *const c_char,
}

// SAFETY: repr(C), first field u32 struct_size, integers and raw pointers only.
unsafe impl Versioned for qr_stat_desc {
    // Written, not read: a caller may know any prefix of it.
    const V1_SIZE: usize = 4;
}

/// The engine's visited values, in the order indices follow: the socket's
/// visitor (its drops and the provider's), then the routing check's.
fn visit(socket: &SocketStats, routing: &RoutingStats, f: &mut dyn FnMut(Metric)) {
    let sources: [&dyn Counters; 2] = [socket, routing];
    for c in sources {
        c.visit(f);
    }
}

/// One entry of the process-wide descriptor table: the visitor's strings
/// made NUL-terminated once.
struct Entry {
    kind: u32,
    unit: u32,
    path: CString,
    name: CString,
    group: Option<CString>,
    help: CString,
}

/// The descriptor table, built on first use from zero-valued stats (only the
/// shape matters): setup calls allocate it once; reading values never does.
fn table() -> &'static [Entry] {
    static TABLE: OnceLock<Box<[Entry]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut v = Vec::new();
        let c = |s: &str| CString::new(s).expect("a visited name has no NUL");
        visit(
            &SocketStats::default(),
            &RoutingStats::default(),
            &mut |m| {
                let path = match m.group {
                    Some(g) => format!("{g}.{}", m.name),
                    None => m.name.to_string(),
                };
                v.push(Entry {
                    kind: match m.kind {
                        Kind::Counter => QR_STAT_COUNTER,
                        Kind::Gauge => QR_STAT_GAUGE,
                    },
                    unit: match m.unit {
                        Unit::Count => QR_STAT_UNIT_COUNT,
                        Unit::Bytes => QR_STAT_UNIT_BYTES,
                        Unit::Seconds => QR_STAT_UNIT_SECONDS,
                    },
                    path: c(&path),
                    name: c(m.name),
                    group: m.group.map(c),
                    help: c(m.help),
                });
            },
        );
        v.into_boxed_slice()
    })
}

/// How many counters `qr_engine_stats_read` reports: the same for every
/// engine of this library build. A newer library may list more (new counters
/// can appear at any index): look indices up by name with `qr_stat_find`
/// rather than hard-coding them.
#[no_mangle]
pub extern "C" fn qr_stat_count() -> usize {
    // No panic crosses the boundary: were building the table to panic, the
    // list reads as empty.
    std::panic::catch_unwind(table).map_or(0, <[Entry]>::len)
}

/// What counter `index` (below `qr_stat_count()`) is, into `*out` (set
/// `out->struct_size` first). Setup call: the first `qr_stat_*` call of the
/// process builds the table; later calls allocate nothing.
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_EINVAL` (`index` out of range, or
/// `out->struct_size` below 4), `QR_EPANIC`.
///
/// # Safety
/// `out` points to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_stat_info(index: usize, out: *mut qr_stat_desc) -> i32 {
    guard(|| {
        let t = table();
        let Some(e) = t.get(index) else {
            return Err(fail(
                QR_EINVAL,
                format!(
                    "stat index {index} out of range: qr_stat_count() is {}",
                    t.len()
                ),
            ));
        };
        let d = qr_stat_desc {
            struct_size: 0,
            kind: e.kind,
            unit: e.unit,
            reserved: 0,
            path: e.path.as_ptr(),
            name: e.name.as_ptr(),
            group: e.group.as_ref().map_or(std::ptr::null(), |g| g.as_ptr()),
            help: e.help.as_ptr(),
        };
        // SAFETY: the caller's contract above.
        unsafe { write_versioned(out, &d) }?;
        Ok(QR_OK)
    })
}

/// The index of the counter whose `qr_stat_desc.path` is `path`
/// (`"sent_wrs"`, `"drops.no_recv_posted"`).
///
/// Returns: the index (non-negative), `QR_ENULL`, `QR_EINVAL` (no such
/// counter; `qr_last_error` says so), `QR_EPANIC`.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn qr_stat_find(path: *const c_char) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let p = unsafe { text(path) }?;
        match table()
            .iter()
            .position(|e| e.path.to_bytes() == p.as_bytes())
        {
            Some(i) => Ok(i as i32),
            None => Err(fail(
                QR_EINVAL,
                format!("no counter named {p:?}: qr_stat_info lists them"),
            )),
        }
    })
}

/// Every counter of `e` now, in index order, into `values[0..cap]`: the first
/// `min(cap, qr_stat_count())` are written, the rest of the array is left
/// alone. Allocates nothing; cheap enough for every turn of a poll loop (one
/// copy of the socket's counters).
///
/// Returns: how many counters there are (`qr_stat_count()`, even when `cap`
/// is smaller), `QR_ENULL` (`e` NULL, or `values` NULL with `cap` > 0),
/// `QR_EPANIC`.
///
/// # Safety
/// `e` is a live engine; `values` points to `cap` writable `uint64_t`s (NULL
/// allowed when `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn qr_engine_stats_read(
    e: *mut qr_engine,
    values: *mut u64,
    cap: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let e = unsafe { obj(e) }?;
        let out: &mut [u64] = match (values.is_null(), cap) {
            (_, 0) => &mut [],
            (true, _) => return Err(QR_ENULL),
            // SAFETY: non-null, `cap` writable u64s by the caller's contract.
            (false, _) => unsafe { std::slice::from_raw_parts_mut(values, cap) },
        };
        let (socket, routing) = (e.engine.socket_stats(), e.engine.routing_stats());
        let mut n = 0usize;
        visit(&socket, &routing, &mut |m| {
            if let Some(v) = out.get_mut(n) {
                *v = m.value;
            }
            n += 1;
        });
        mark_defined(values.cast(), n.min(cap) * size_of::<u64>());
        Ok(n as i32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_pair::SimPair;
    use crate::{qr_datagram_send, QR_EAGAIN};
    use std::ffi::CStr;

    /// Static strings of a descriptor.
    fn s(p: *const c_char) -> &'static str {
        // SAFETY: the table's strings live for the process.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn every_index_describes_itself_and_is_found_by_its_path() {
        let n = qr_stat_count();
        assert!(n >= 50, "{n} counters");
        for i in 0..n {
            // SAFETY: all-zero is a valid desc (null pointers, zero numbers).
            let mut d: qr_stat_desc = unsafe { std::mem::zeroed() };
            d.struct_size = size_of::<qr_stat_desc>() as u32;
            // SAFETY: `d` is a whole writable desc.
            assert_eq!(unsafe { qr_stat_info(i, &mut d) }, QR_OK);
            assert_eq!(d.struct_size as usize, size_of::<qr_stat_desc>());
            let path = s(d.path);
            let want = if d.group.is_null() {
                s(d.name).to_string()
            } else {
                format!("{}.{}", s(d.group), s(d.name))
            };
            assert_eq!(path, want);
            assert!(!s(d.help).is_empty(), "{path}: help");
            let c = CString::new(path).unwrap();
            // SAFETY: a NUL-terminated string.
            assert_eq!(unsafe { qr_stat_find(c.as_ptr()) }, i as i32, "{path}");
        }
        // SAFETY: as above.
        let mut d: qr_stat_desc = unsafe { std::mem::zeroed() };
        d.struct_size = size_of::<qr_stat_desc>() as u32;
        // SAFETY: `d` writable; the string NUL-terminated; NULL is checked.
        unsafe {
            assert_eq!(qr_stat_info(n, &mut d), QR_EINVAL);
            assert_eq!(qr_stat_find(c"drops.nonesuch".as_ptr()), QR_EINVAL);
            assert_eq!(qr_stat_find(std::ptr::null()), QR_ENULL);
            assert_eq!(
                qr_engine_stats_read(std::ptr::null_mut(), std::ptr::null_mut(), 0),
                QR_ENULL
            );
        }
    }

    /// Engines on one `sim` fabric, connected, with some datagrams sent:
    /// every socket counter path has run.
    fn pair_with_traffic() -> SimPair {
        let mut p = SimPair::connected(5);
        let mut sent = 0;
        for _ in 0..100_000 {
            if sent == 20 {
                break;
            }
            // SAFETY: live engine; the data is readable.
            let rc = unsafe { qr_datagram_send(p.client, p.cconn, b"tick".as_ptr(), 4) };
            assert!(rc == QR_OK || rc == QR_EAGAIN, "send: {rc}");
            sent += i32::from(rc == QR_OK);
            p.poll(true);
            p.poll(false);
        }
        assert_eq!(sent, 20, "datagrams");
        p
    }

    /// Counter coverage: every value the Rust visitors of the engine's socket
    /// and routing check list is reachable through the C API at its index,
    /// with the same name, group, kind, unit and value.
    #[test]
    fn every_visited_counter_is_in_the_c_api_with_its_value() {
        let p = pair_with_traffic();
        for e in [p.client, p.server] {
            let mut values = vec![u64::MAX; qr_stat_count() + 1];
            // SAFETY: live engine; `values` writable for its length.
            let n = unsafe { qr_engine_stats_read(e, values.as_mut_ptr(), values.len()) };
            assert_eq!(n as usize, qr_stat_count());
            assert_eq!(
                values[n as usize],
                u64::MAX,
                "nothing written past the count"
            );
            // The Rust side, read with no poll in between.
            // SAFETY: live engine from qr_engine_new.
            let engine = &unsafe { &*e }.engine;
            let (socket, routing) = (engine.socket_stats(), engine.routing_stats());
            let mut rust = Vec::new();
            socket.visit(&mut |m| rust.push(m));
            routing.visit(&mut |m| rust.push(m));
            assert_eq!(rust.len(), n as usize);
            for (i, m) in rust.iter().enumerate() {
                // SAFETY: all-zero is a valid desc.
                let mut d: qr_stat_desc = unsafe { std::mem::zeroed() };
                d.struct_size = size_of::<qr_stat_desc>() as u32;
                // SAFETY: `d` is a whole writable desc.
                assert_eq!(unsafe { qr_stat_info(i, &mut d) }, QR_OK);
                assert_eq!(s(d.name), m.name);
                assert_eq!((!d.group.is_null()).then(|| s(d.group)), m.group);
                let kind = match m.kind {
                    Kind::Counter => QR_STAT_COUNTER,
                    Kind::Gauge => QR_STAT_GAUGE,
                };
                assert_eq!(d.kind, kind, "{}", m.name);
                assert_eq!(s(d.help), m.help);
                let unit = match m.unit {
                    Unit::Count => QR_STAT_UNIT_COUNT,
                    Unit::Bytes => QR_STAT_UNIT_BYTES,
                    Unit::Seconds => QR_STAT_UNIT_SECONDS,
                };
                assert_eq!(d.unit, unit, "{}", m.name);
                assert_eq!(values[i], m.value, "{}", s(d.path));
            }
            // Traffic happened: the values are the engine's, not zeros.
            let at = |path: &CStr| {
                // SAFETY: a NUL-terminated string.
                let i = unsafe { qr_stat_find(path.as_ptr()) };
                assert!(i >= 0, "{path:?}");
                values[i as usize]
            };
            assert_eq!(at(c"sent_wrs"), socket.sent_wrs);
            assert!(at(c"sent_wrs") > 0 && at(c"recv_wrs") > 0);
            assert_eq!(at(c"recv_bytes"), socket.recv_bytes);
        }
    }
}
