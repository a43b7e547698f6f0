//! Allocations per call of the C API's hot path, counted by a global
//! allocator (on this thread only, only inside the measured calls): 64-byte
//! request/response round trips over `sim` after a warm-up, with a key update
//! (RFC 9001 §6) forced inside the measured window. `qr_engine_poll_at`,
//! `qr_stream_read`, `qr_datagram_recv` and `qr_engine_stats_read` must not
//! allocate per packet; the figures for sends and for the key update are
//! printed and bounded.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use quic_rdma_ffi::*;

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs during thread teardown.
    let _ = ON.try_with(|on| {
        if on.get() {
            COUNT.with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `f`'s result and the allocations it made on this thread.
fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = COUNT.with(|c| c.get());
    ON.with(|on| on.set(true));
    let r = f();
    ON.with(|on| on.set(false));
    (r, COUNT.with(|c| c.get()) - before)
}

static RELEASED: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn released(_user: *mut c_void, _data: *const u8, _len: usize) {
    RELEASED.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Default)]
struct Tally {
    poll: u64,
    polls: u64,
    read: u64,
    write_copy: u64,
    write_zc: u64,
    datagram_send: u64,
    datagram_recv: u64,
    stats_read: u64,
    key_update: u64,
}

#[path = "../src/sim_pair.rs"]
mod sim_pair;
use sim_pair::SimPair as Pair;

impl Pair {
    /// Poll both engines, counting the allocations into `t`.
    fn poll_both(&mut self, t: &mut Tally) {
        let (_, a) = counted(|| {
            self.poll(true);
            self.poll(false);
        });
        t.poll += a;
        t.polls += 2;
    }
}

const WARMUP: u64 = 2_000;
const MEASURED: u64 = 10_000;

/// Read exactly `buf.len()` bytes of `stream` on `e`, polling both meanwhile.
fn read_all(p: &mut Pair, client: bool, stream: u64, buf: &mut [u8], t: &mut Tally) {
    let (e, conn) = if client {
        (p.client, p.cconn)
    } else {
        (p.server, p.sconn)
    };
    let mut got = 0;
    while got < buf.len() {
        p.poll_both(t);
        let rest = &mut buf[got..];
        // SAFETY: live engine; `rest` is writable for its length; fin may be NULL.
        let (n, a) = counted(|| unsafe {
            qr_stream_read(
                e,
                conn,
                stream,
                rest.as_mut_ptr(),
                rest.len(),
                std::ptr::null_mut(),
            )
        });
        t.read += a;
        match n {
            n if n > 0 => got += n as usize,
            n if n == i64::from(QR_EAGAIN) => {}
            n => panic!("read: {n}"),
        }
    }
}

/// Stream round trips: the client lends its request (`qr_stream_write_zc`),
/// the server echoes with a copying write; a key update at the start of the
/// measured window, then one halfway.
fn stream_round_trips() -> (Tally, Tally) {
    let mut p = Pair::connected(3);
    let mut s = 0u64;
    // SAFETY: live engine, writable id.
    let rc = unsafe { qr_stream_open(p.client, p.cconn, 1, &mut s) };
    assert_eq!(rc, QR_OK);
    // Requests stay valid until released: one buffer per round trip.
    let requests: Vec<[u8; 64]> = (0..WARMUP + MEASURED)
        .map(|i| {
            let mut m = [0u8; 64];
            m[..8].copy_from_slice(&i.to_le_bytes());
            m
        })
        .collect();
    let (mut warm, mut t) = (Tally::default(), Tally::default());
    let mut buf = [0u8; 64];
    for (i, req) in requests.iter().enumerate() {
        let i = i as u64;
        let tally = if i < WARMUP { &mut warm } else { &mut t };
        if i == WARMUP || i == WARMUP + MEASURED / 2 {
            // SAFETY: live engine.
            let (rc, a) = counted(|| unsafe { qr_conn_key_update(p.client, p.cconn) });
            assert_eq!(rc, QR_OK);
            tally.key_update += a;
        }
        let mut off = 0;
        while off < 64 {
            // SAFETY: `req` lives (in `requests`) until after the pair is dropped.
            let (n, a) = counted(|| unsafe {
                qr_stream_write_zc(
                    p.client,
                    p.cconn,
                    s,
                    req[off..].as_ptr(),
                    64 - off,
                    Some(released),
                    std::ptr::null_mut(),
                )
            });
            tally.write_zc += a;
            if n > 0 {
                off += n as usize;
            } else {
                assert_eq!(n, i64::from(QR_EAGAIN));
                p.poll_both(tally);
            }
        }
        read_all(&mut p, false, s, &mut buf, tally);
        assert_eq!(&buf, req);
        // SAFETY: live engine; `buf` readable.
        let (n, a) = counted(|| unsafe { qr_stream_write(p.server, p.sconn, s, buf.as_ptr(), 64) });
        assert_eq!(n, 64);
        tally.write_copy += a;
        read_all(&mut p, true, s, &mut buf, tally);
        assert_eq!(&buf, req);
    }
    // Everything lent was acknowledged and released, once per call.
    for _ in 0..10_000 {
        p.poll_both(&mut Tally::default());
    }
    drop(p);
    (warm, t)
}

/// Datagram round trips (copying sends; receives into the caller's buffer).
fn datagram_round_trips() -> Tally {
    let mut p = Pair::connected(3);
    let mut t = Tally::default();
    let mut buf = [0u8; 64];
    // Sized once, outside the measured calls (as a poll loop would).
    let mut stats = vec![0u64; qr_stat_count()];
    for i in 0..WARMUP + MEASURED {
        if i == WARMUP {
            t = Tally::default();
        }
        let msg = i.to_le_bytes().repeat(8);
        for (from_client, data) in [(true, msg.clone()), (false, msg.clone())] {
            let (se, sc) = if from_client {
                (p.client, p.cconn)
            } else {
                (p.server, p.sconn)
            };
            let (re, rc_) = if from_client {
                (p.server, p.sconn)
            } else {
                (p.client, p.cconn)
            };
            // SAFETY: live engine; `data` readable.
            let (rc, a) =
                counted(|| unsafe { qr_datagram_send(se, sc, data.as_ptr(), data.len()) });
            assert_eq!(rc, QR_OK);
            t.datagram_send += a;
            loop {
                p.poll_both(&mut t);
                // SAFETY: live engine; `buf` writable; `needed` may be NULL.
                let (n, a) = counted(|| unsafe {
                    qr_datagram_recv(re, rc_, buf.as_mut_ptr(), buf.len(), std::ptr::null_mut())
                });
                t.datagram_recv += a;
                if n == 64 {
                    assert_eq!(&buf[..], &data[..]);
                    break;
                }
                assert_eq!(n, i64::from(QR_EAGAIN));
            }
            // SAFETY: live engine; `stats` writable for its length.
            let (n, a) =
                counted(|| unsafe { qr_engine_stats_read(re, stats.as_mut_ptr(), stats.len()) });
            assert_eq!(n as usize, stats.len());
            t.stats_read += a;
        }
    }
    t
}

#[test]
fn the_c_api_hot_path_does_not_allocate_per_packet() {
    let (warm, st) = stream_round_trips();
    eprintln!("stream warm-up: {warm:?}");
    eprintln!(
        "stream, {MEASURED} round trips, 2 key updates: {st:?}; per round trip: write_zc {:.3}, \
         write {:.3}",
        st.write_zc as f64 / MEASURED as f64,
        st.write_copy as f64 / MEASURED as f64
    );
    assert_eq!(
        RELEASED.load(Ordering::Relaxed),
        WARMUP + MEASURED,
        "every lent request released exactly once"
    );
    let dg = datagram_round_trips();
    eprintln!("datagram, {MEASURED} round trips: {dg:?}");
    // Receiving and reading into the caller's buffers: nothing.
    assert_eq!(st.read, 0);
    assert_eq!(dg.datagram_recv, 0);
    assert_eq!(dg.stats_read, 0, "qr_engine_stats_read allocated");
    assert_eq!(dg.poll, 0, "datagram round trips: allocations in poll");
    // Polling: nothing per packet; a key update makes rustls derive and box the
    // next packet keys (on both sides, in poll): bounded per update.
    assert!(
        st.poll <= 2 * KEY_UPDATE_BOUND,
        "stream round trips: {} allocations in poll with 2 key updates",
        st.poll
    );
    // quinn-proto 0.11 owns sent data as `Bytes`. A copying write of a small
    // message goes into the engine's shared chunk (no allocation of its own;
    // a new chunk, two allocations, at most once per 256 messages while the
    // old one is held); a lent buffer costs its shared reference count (no
    // copy). A stream write in this loop finds the stream's send buffer
    // drained (the last response acknowledged), and quinn-proto's
    // `SendBuffer::ack` shrinks its segment queue to nothing then, so the
    // write allocates it again: one per copying write, two per lent one, as
    // the header says. Datagrams: nothing of their own (two sends per round
    // trip).
    let chunks = 2 * (2 * MEASURED).div_ceil(256);
    assert!(st.write_zc <= 2 * MEASURED, "write_zc: {}", st.write_zc);
    assert!(
        st.write_copy <= MEASURED + chunks,
        "write: {}",
        st.write_copy
    );
    assert!(
        dg.datagram_send <= chunks,
        "datagram send: {} for {} calls",
        dg.datagram_send,
        2 * MEASURED
    );
}

/// Allocations one key update may make in poll (measured: 4, the peer's
/// side deriving its next keys; the initiator's 4 are in qr_conn_key_update).
const KEY_UPDATE_BOUND: u64 = 8;

/// A write while earlier bytes are still unacknowledged allocates nothing:
/// the one allocation of the request/response loop is quinn-proto
/// re-creating the segment queue it freed when everything was acknowledged.
#[test]
fn a_write_with_data_in_flight_allocates_nothing() {
    let mut p = Pair::connected(4);
    let mut s = 0u64;
    // SAFETY: live engine, writable id.
    let rc = unsafe { qr_stream_open(p.client, p.cconn, 1, &mut s) };
    assert_eq!(rc, QR_OK);
    let data = [7u8; 64];
    let write = |p: &Pair| {
        // SAFETY: live engine; `data` readable.
        let (n, a) =
            counted(|| unsafe { qr_stream_write(p.client, p.cconn, s, data.as_ptr(), 64) });
        assert_eq!(n, 64);
        a
    };
    write(&p);
    // A round trip: the server's answer carries the ACK of the request, and
    // the client's send buffer drains.
    let mut buf = [0u8; 64];
    let mut t = Tally::default();
    read_all(&mut p, false, s, &mut buf, &mut t);
    // SAFETY: live engine; `buf` readable.
    let n = unsafe { qr_stream_write(p.server, p.sconn, s, buf.as_ptr(), 64) };
    assert_eq!(n, 64);
    read_all(&mut p, true, s, &mut buf, &mut t);
    let drained = write(&p);
    let in_flight = write(&p);
    eprintln!("write on a drained stream: {drained} allocations; with data in flight: {in_flight}");
    assert_eq!(
        drained, 1,
        "the segment queue only: the copy is in the chunk"
    );
    assert_eq!(
        in_flight, 0,
        "nothing: the copy is in the chunk, the queue has room"
    );
}
