//! Zero allocations per packet on the engine's send and receive paths.
//!
//! A counting global allocator (counting only on this test's thread, only while
//! a window is open) measures 10 000 request/response round trips of 64 bytes
//! between two engines over `sim`, after a warm-up. Allocations are attributed
//! to the call that made them: `poll` (receive completions → quinn-proto →
//! events → timers → transmits → post_send: the engine's data path) versus the
//! application's `write`/`read`/`send_datagram` calls.
//!
//! The counting allocator is `allocation-counter`'s (a dev-dependency: it
//! replaces the global allocator of this test binary and counts per thread),
//! so this test needs no `unsafe` of its own. To find where an allocation
//! comes from, run the test under gdb with a breakpoint on `malloc` once the
//! warm-up is over, or under `valgrind --tool=massif`.

mod engine_common;

use std::time::Instant;

use engine_common::EnginePair;
use quic_rdma::engine::{EngineError, Event};
use quic_rdma::fabric::sim::SimConfig;

/// `f`'s result, and the allocations it made on this thread.
fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let mut r = None;
    let info = allocation_counter::measure(|| r = Some(f()));
    (r.expect("measure runs the closure"), info.count_total)
}

#[derive(Default, Debug)]
struct Tally {
    poll: u64,
    /// In `write` / `send_datagram` (the data copied into a `Bytes` for quinn-proto).
    send: u64,
    /// In `read` / `recv_datagram`.
    recv: u64,
    polls: u64,
    round_trips: u64,
}

const WARMUP: u64 = 2_000;
const MEASURED: u64 = 10_000;

fn poll_both(p: &mut EnginePair, t: &mut Tally) {
    let now = Instant::now();
    p.cev.clear();
    p.sev.clear();
    let (_, n) = counted(|| {
        p.client.poll(now, &mut p.cev);
        p.server.poll(now, &mut p.sev);
    });
    t.poll += n;
    t.polls += 1;
}

/// 64-byte request/response on one long-lived bidirectional stream.
fn stream_ping_pong() -> Tally {
    let mut p = EnginePair::real_time(SimConfig::default());
    let (c, s) = p.connect();
    let stream = p.client.open_bi(c).unwrap();
    let mut msg = [0u8; 64];
    let mut buf = [0u8; 64];
    let mut t = Tally::default();
    let mut warm = Tally::default();
    for i in 0..WARMUP + MEASURED {
        let tally = if i < WARMUP { &mut warm } else { &mut t };
        msg[..8].copy_from_slice(&i.to_le_bytes());
        let (n, a) = counted(|| p.client.write(c, stream, &msg));
        assert_eq!(n.unwrap(), 64);
        tally.send += a;
        // Server: read the request, echo it.
        let mut got = 0;
        while got < 64 {
            poll_both(&mut p, tally);
            let (r, a) = counted(|| p.server.read(s, stream, &mut buf[got..]));
            tally.recv += a;
            match r {
                Ok(r) => got += r.len,
                Err(EngineError::WouldBlock) => {}
                Err(e) => panic!("server read: {e}"),
            }
        }
        assert_eq!(buf, msg);
        let (n, a) = counted(|| p.server.write(s, stream, &buf));
        assert_eq!(n.unwrap(), 64);
        tally.send += a;
        // Client: read the response.
        let mut got = 0;
        while got < 64 {
            poll_both(&mut p, tally);
            let (r, a) = counted(|| p.client.read(c, stream, &mut buf[got..]));
            tally.recv += a;
            match r {
                Ok(r) => got += r.len,
                Err(EngineError::WouldBlock) => {}
                Err(e) => panic!("client read: {e}"),
            }
        }
        assert_eq!(buf, msg);
        tally.round_trips += 1;
    }
    eprintln!("stream warm-up: {warm:?}");
    t
}

/// 64-byte request/response as datagrams.
fn datagram_ping_pong() -> Tally {
    let mut p = EnginePair::real_time(SimConfig::default());
    let (c, s) = p.connect();
    let mut msg = [0u8; 64];
    let mut buf = [0u8; 64];
    let mut t = Tally::default();
    let mut warm = Tally::default();
    for i in 0..WARMUP + MEASURED {
        let tally = if i < WARMUP { &mut warm } else { &mut t };
        msg[..8].copy_from_slice(&i.to_le_bytes());
        let (r, a) = counted(|| p.client.send_datagram(c, &msg));
        r.unwrap();
        tally.send += a;
        loop {
            poll_both(&mut p, tally);
            if p.sev.contains(&Event::Datagram { conn: s }) {
                break;
            }
        }
        let (n, a) = counted(|| p.server.recv_datagram(s, &mut buf));
        assert_eq!(n.unwrap(), 64);
        tally.recv += a;
        let (r, a) = counted(|| p.server.send_datagram(s, &buf));
        r.unwrap();
        tally.send += a;
        loop {
            poll_both(&mut p, tally);
            if p.cev.contains(&Event::Datagram { conn: c }) {
                break;
            }
        }
        let (n, a) = counted(|| p.client.recv_datagram(c, &mut buf));
        assert_eq!(n.unwrap(), 64);
        assert_eq!(buf, msg);
        tally.recv += a;
        tally.round_trips += 1;
    }
    eprintln!("datagram warm-up: {warm:?}");
    t
}

// One test function: the counters are per thread, and the two scenarios run in turn.
#[test]
fn zero_allocations_per_packet_in_steady_state() {
    // The counter must see an allocation, or every zero below proves nothing.
    let (v, n) = counted(|| Vec::<u8>::with_capacity(64));
    assert!(
        n >= 1 && v.capacity() >= 64,
        "the allocation counter is not active"
    );
    let st = stream_ping_pong();
    eprintln!(
        "stream ping-pong: {st:?}; per round trip: poll {:.4}, write {:.4}, read {:.4}",
        st.poll as f64 / st.round_trips as f64,
        st.send as f64 / st.round_trips as f64,
        st.recv as f64 / st.round_trips as f64
    );
    let dg = datagram_ping_pong();
    eprintln!(
        "datagram ping-pong: {dg:?}; per round trip: poll {:.4}, send {:.4}, recv {:.4}",
        dg.poll as f64 / dg.round_trips as f64,
        dg.send as f64 / dg.round_trips as f64,
        dg.recv as f64 / dg.round_trips as f64
    );
    assert_eq!(st.round_trips, MEASURED);
    assert_eq!(dg.round_trips, MEASURED);
    assert_eq!(
        st.poll, 0,
        "allocations on the engine's send/receive paths (stream)"
    );
    assert_eq!(
        dg.poll, 0,
        "allocations on the engine's send/receive paths (datagram)"
    );
    // Reading into the caller's buffer allocates nothing.
    assert_eq!(st.recv, 0);
    assert_eq!(dg.recv, 0);
    // quinn-proto 0.11's send APIs take ownership as `Bytes`. The engine
    // copies small writes and datagrams into a shared chunk (copy_arena.rs),
    // reclaimed once acknowledged: no allocation of their own. What is left
    // is quinn-proto's `SendBuffer`, which shrinks its segment queue to
    // nothing once everything is acked, so each write in a request/response
    // loop grows it again: one per write (two writes per round trip).
    // Allowance: a new chunk (two allocations) when the old one is still
    // held, at most one per 256 messages; measured: none.
    let chunks = 2 * (2 * MEASURED).div_ceil(256);
    assert!(
        st.send <= 2 * MEASURED + chunks,
        "stream writes: {} for {} writes",
        st.send,
        2 * MEASURED
    );
    assert!(
        dg.send <= chunks,
        "datagram sends: {} for {} sends",
        dg.send,
        2 * MEASURED
    );
}
