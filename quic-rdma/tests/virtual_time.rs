//! QUIC timers in virtual time: two engines over a `sim` fabric on the
//! caller's clock (`SimClock::Manual`). Nothing sleeps and nothing reads the
//! wall clock after the epoch: time jumps straight to the next instant
//! anything is due (a connection timer or a delayed packet), as quinn's own
//! `Pair` tests do, so the instants asserted below are exact.
//! - the idle timeout closes a connection whose peer went silent at the
//!   configured idle timeout (RFC 9000 §10.1);
//! - one lost ack-eliciting packet is retransmitted at the probe timeout
//!   (RFC 9002 §6.2.1);
//! - a seed reproduces a lossy, reordering run exactly; another seed does not.

mod engine_common;

use std::time::{Duration, Instant};

use engine_common::{configs_with, gid, Sink, Source};
use quic_rdma::engine::{AcceptPolicy, CloseReason, ConnHandle, Engine, Event};
use quic_rdma::fabric::sim::{FabricStats, Faults, SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::quinn_adapter::Liveness;

/// One-way delay of every packet: an RTT of 1 ms.
const ONE_WAY: Duration = Duration::from_micros(500);
/// quinn-proto's `max_ack_delay` transport parameter (RFC 9000 §18.2 default:
/// 25 ms); neither side sets another.
const MAX_ACK_DELAY: Duration = Duration::from_millis(25);
/// RFC 9002 §6.1.2 kGranularity (quinn-proto's `TIMER_GRANULARITY`).
const GRANULARITY: Duration = Duration::from_millis(1);
/// A hang guard on the number of distinct instants a run may visit.
const MAX_INSTANTS: usize = 1_000_000;

/// Which engine an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// Two engines over a manual-clock fabric, and everything that happened.
struct Net {
    fabric: SimFabric,
    client: Engine<SimQp>,
    server: Engine<SimQp>,
    /// The epoch: virtual time 0.
    start: Instant,
    now: Instant,
    /// Whether the server is still polled (a stopped server is silent).
    server_up: bool,
    /// (virtual time, side, event), in order.
    trace: Vec<(Duration, Side, Event)>,
    events: Vec<Event>,
}

impl Net {
    /// Engines whose randomness (fabric faults, CIDs, packet-number skips)
    /// all comes from `seed`; both sides' transports get `live`.
    fn new(seed: u64, faults: Faults, live: Liveness) -> Net {
        // The only wall-clock read: an epoch for the Instants the engines take.
        let start = Instant::now();
        let cfg = SimConfig {
            faults,
            seed,
            ..SimConfig::default()
        };
        let mtu = cfg.mtu.bytes();
        let fabric = SimFabric::manual(cfg, start);
        let (mut ccfg, mut scfg) = configs_with(mtu, AcceptPolicy::AcceptAll, |t| live.apply(t));
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        ccfg.rng_seed = Some(seed_bytes);
        seed_bytes[31] = 1;
        scfg.rng_seed = Some(seed_bytes);
        let sqp = fabric
            .create_qp(gid(1, false), SimQpOptions::default())
            .unwrap();
        let cqp = fabric
            .create_qp(gid(2, false), SimQpOptions::default())
            .unwrap();
        Net {
            server: Engine::new(sqp, scfg).unwrap(),
            client: Engine::new(cqp, ccfg).unwrap(),
            fabric,
            start,
            now: start,
            server_up: true,
            trace: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Virtual time since the epoch.
    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Poll both engines at `now` until nothing moves (every packet sent
    /// without delay was received and handled); the events of this instant.
    fn settle(&mut self) -> Vec<(Side, Event)> {
        let mut out = Vec::new();
        loop {
            let before = self.fabric.stats();
            self.fabric.advance(self.now);
            self.poll(Side::Client, &mut out);
            if self.server_up {
                self.poll(Side::Server, &mut out);
            }
            self.fabric.advance(self.now);
            let after = self.fabric.stats();
            if (after.sent, after.delivered) == (before.sent, before.delivered) {
                return out;
            }
        }
    }

    fn poll(&mut self, side: Side, out: &mut Vec<(Side, Event)>) {
        self.events.clear();
        let e = match side {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        };
        e.poll(self.now, &mut self.events);
        for ev in &self.events {
            self.trace.push((self.now - self.start, side, *ev));
            out.push((side, *ev));
        }
    }

    /// The next instant anything is due: a timer of a polled engine or a
    /// packet on the wire.
    fn next_instant(&mut self) -> Option<Instant> {
        let mut next = self.fabric.next_due();
        let mut take = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        take(self.client.next_deadline());
        if self.server_up {
            take(self.server.next_deadline());
        }
        next
    }

    /// Settle, hand the events to `done`, and jump to the next instant until
    /// `done` says so (or `limit` of virtual time passed: `false`).
    fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Net, &[(Side, Event)]) -> bool,
    ) -> bool {
        let end = self.now + limit;
        for _ in 0..MAX_INSTANTS {
            let evs = self.settle();
            if done(self, &evs) {
                return true;
            }
            match self.next_instant() {
                // A timer not after now was handled by this poll already.
                Some(t) if t > self.now && t <= end => self.now = t,
                Some(t) if t <= self.now => self.now += Duration::from_micros(1),
                _ => {
                    self.now = end;
                    self.settle();
                    return false;
                }
            }
        }
        panic!("more than {MAX_INSTANTS} instants");
    }

    /// Handshake: both sides' handles.
    fn connect(&mut self) -> (ConnHandle, ConnHandle) {
        let c = self
            .client
            .connect(self.now, self.server.local_addr(), "localhost")
            .unwrap();
        let (mut c_ok, mut s) = (false, None);
        let ok = self.run_until(Duration::from_secs(10), |_, evs| {
            for (side, e) in evs {
                match (side, e) {
                    (Side::Client, Event::Connected { conn }) if *conn == c => c_ok = true,
                    (Side::Server, Event::Connected { conn }) => s = Some(*conn),
                    _ => {}
                }
            }
            c_ok && s.is_some()
        });
        assert!(ok, "no handshake in 10 s of virtual time");
        (c, s.unwrap())
    }

    /// Client → server on a fresh stream: `len` seeded bytes, read by the
    /// server to the end; the sha256 of what arrived (checked against what
    /// was sent).
    fn transfer(&mut self, c: ConnHandle, s: ConnHandle, len: u64, seed: u64) -> [u8; 32] {
        let stream = self.client.open_bi(c).unwrap();
        let mut src = Source::new(stream, len, seed);
        let mut sink: Option<Sink> = None;
        src.pump(&mut self.client, c);
        let ok = self.run_until(Duration::from_secs(60), |n, evs| {
            for (side, e) in evs {
                if let (Side::Server, Event::StreamOpened { stream, .. }) = (side, e) {
                    sink = Some(Sink::new(*stream, false));
                }
            }
            src.pump(&mut n.client, c);
            sink.as_mut().is_some_and(|k| {
                k.pump(&mut n.server, s);
                k.fin
            })
        });
        assert!(ok, "transfer of {len} bytes did not finish");
        let sink = sink.unwrap();
        assert_eq!(sink.received, len);
        assert_eq!(sink.digest(), src.digest(), "sha256 end to end");
        sink.digest()
    }
}

/// RFC 9000 §10.1: a connection whose peer went silent closes at the idle
/// timeout, counted from the later of the last packet received and the first
/// ack-eliciting packet sent after it. The server stops (is never polled
/// again, as if its process hung); the client then writes, which restarts its
/// idle timer; it closes with TimedOut exactly one idle timeout later.
/// quinn-proto never arms the idle timer below 3 × PTO (≈ 81 ms here), far
/// under the 2 s configured, so the configured value is the one that counts.
#[test]
fn idle_timeout_closes_at_the_configured_instant() {
    let idle = Duration::from_secs(2);
    // No keep-alives: nothing else may restart the timer.
    let live = Liveness::new(None, Some(idle)).unwrap();
    let delayed = Faults {
        delay: ONE_WAY,
        ..Faults::default()
    };
    let mut net = Net::new(7, delayed, live);
    let (c, s) = net.connect();
    net.transfer(c, s, 64 << 10, 1);
    // Quiet: every ACK delivered, no timer but the idle ones pending.
    net.run_until(Duration::from_millis(100), |_, _| false);
    let last_rx = net.elapsed();
    let received = net.client.socket_stats().recv_packets;

    net.server_up = false;
    let stream = net.client.open_uni(c).unwrap();
    net.client.write(c, stream, b"anyone there?").unwrap();
    let wrote_at = net.elapsed();
    let mut closed = None;
    let ok = net.run_until(Duration::from_secs(30), |n, evs| {
        for (side, e) in evs {
            if let (Side::Client, Event::ConnectionLost { conn, reason }) = (side, e) {
                if *conn == c {
                    closed = Some((n.elapsed(), *reason));
                }
            }
        }
        closed.is_some()
    });
    assert!(ok, "the client never timed out");
    let (at, reason) = closed.unwrap();
    eprintln!("last receipt {last_rx:?}, write {wrote_at:?}, closed {at:?}: {reason}");
    assert_eq!(reason, CloseReason::TimedOut);
    assert_eq!(
        net.client.socket_stats().recv_packets,
        received,
        "the silent server sent nothing"
    );
    assert!(
        at >= last_rx + idle,
        "closed before the idle timeout: {at:?}"
    );
    assert_eq!(
        at,
        wrote_at + idle,
        "the first ack-eliciting packet after the last receipt restarted the timer"
    );
}

/// RFC 9002 §6.2.1: with no acknowledgement, an ack-eliciting packet is
/// followed by a probe after PTO = smoothed_rtt + max(4 × rttvar,
/// kGranularity) + max_ack_delay. The fabric drops the one packet carrying a
/// small write; the client's next packet leaves in that window, and the data
/// arrives.
#[test]
fn a_lost_packet_is_probed_at_the_pto() {
    let delayed = Faults {
        delay: ONE_WAY,
        ..Faults::default()
    };
    let mut net = Net::new(
        11,
        delayed,
        Liveness::new(None, Some(Duration::from_secs(10))).unwrap(),
    );
    let (c, s) = net.connect();
    // Warm the RTT estimator: 40 exchanges of a constant 1 ms RTT take
    // rttvar (RFC 9002 §5.3: 3/4 of itself per sample, plus a quarter of
    // |srtt - sample|, here 0) from its first value of half an RTT to
    // 0.5 ms × (3/4)^40 ≈ 5 ns, so max(4 × rttvar, kGranularity) is
    // kGranularity.
    for i in 0..40 {
        net.transfer(c, s, 100, i);
    }
    // Quiet: every packet acknowledged (delayed ACKs go out within 25 ms).
    net.run_until(Duration::from_millis(100), |_, _| false);
    let srtt = net.client.conn_stats(c).unwrap().path.rtt;
    assert!(
        srtt >= 2 * ONE_WAY && srtt < 2 * ONE_WAY + GRANULARITY,
        "smoothed RTT {srtt:?} for a 1 ms path"
    );

    let lost_before = net.fabric.stats().lost;
    net.fabric.lose_next(1);
    let stream = net.client.open_uni(c).unwrap();
    net.client.write(c, stream, &[0x5a; 100]).unwrap();
    let sent_at = net.elapsed();
    net.settle();
    assert_eq!(
        net.fabric.stats().lost,
        lost_before + 1,
        "the write was lost"
    );
    let sent = net.client.socket_stats().sent_wrs;
    let mut probe_at = None;
    let ok = net.run_until(Duration::from_secs(1), |n, _| {
        if n.client.socket_stats().sent_wrs > sent {
            probe_at = Some(n.elapsed());
        }
        probe_at.is_some()
    });
    assert!(ok, "no probe within 1 s");
    let waited = probe_at.unwrap() - sent_at;
    let pto_min = srtt + GRANULARITY + MAX_ACK_DELAY;
    eprintln!("srtt {srtt:?}: probe {waited:?} after the lost packet (PTO >= {pto_min:?})");
    // 4 × rttvar ≤ 1 ms (above), so the PTO is exactly pto_min; the window's
    // upper edge allows rttvar up to a quarter of a millisecond more.
    assert!(
        waited >= pto_min && waited <= pto_min + GRANULARITY,
        "probe after {waited:?}, PTO window [{pto_min:?}, {:?}]",
        pto_min + GRANULARITY
    );
    // The probe carries the data again: the server reads all 100 bytes.
    let mut sink: Option<Sink> = None;
    let ok = net.run_until(Duration::from_secs(1), |n, evs| {
        for (side, e) in evs {
            if let (Side::Server, Event::StreamOpened { stream, .. }) = (side, e) {
                sink = Some(Sink::new(*stream, false));
            }
        }
        sink.as_mut().is_some_and(|k| {
            k.pump(&mut n.server, s);
            k.received == 100
        })
    });
    assert!(ok, "the retransmitted data never arrived");
}

/// Everything one run observed: its event trace, the fabric's counters and
/// the sha256 of the delivered bytes.
#[derive(Debug, PartialEq)]
struct Run {
    /// Events with connection handles made run-independent (see [`canonical`]).
    trace: Vec<(Duration, Side, String)>,
    fabric: FabricStats,
    digest: [u8; 32],
    finished_at: Duration,
}

fn lossy_run(seed: u64) -> Run {
    let hostile = Faults {
        loss: 0.02,
        duplicate: 0.01,
        reorder: 0.05,
        reorder_delay: Duration::from_micros(300),
        delay: Duration::from_micros(100),
        ..Faults::default()
    };
    let mut net = Net::new(seed, hostile, Liveness::default());
    let (c, s) = net.connect();
    // The same data every run: the seed varies the faults, not the bytes.
    let digest = net.transfer(c, s, 512 << 10, 42);
    Run {
        fabric: net.fabric.stats(),
        finished_at: net.elapsed(),
        trace: net
            .trace
            .iter()
            .map(|(t, side, e)| (*t, *side, canonical(e)))
            .collect(),
        digest,
    }
}

/// An event's text with each connection handle's engine tag (the high half
/// of its generation, distinct per engine in a process so that one engine's
/// handles never name another's connections) masked out: what is left — slot
/// and per-engine generation — is the same in every run of one seed.
fn canonical(e: &Event) -> String {
    let text = format!("{e:?}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("conn#") {
        let (head, tail) = rest.split_at(i + "conn#".len());
        out.push_str(head);
        let end = tail
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(tail.len());
        let (handle, after) = tail.split_at(end);
        match handle.split_once('.') {
            Some((index, gen)) => {
                let gen: u32 = gen.parse().expect("a handle's generation");
                out.push_str(&format!("{index}.{}", gen & 0xFFFF));
            }
            None => out.push_str(handle),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The same seed gives the same run, event for event and instant for
/// instant, through loss, duplication and reordering; another seed gives
/// another run (other packets lost, other recovery, other timing).
#[test]
fn a_seed_reproduces_a_lossy_run_exactly() {
    let a = lossy_run(0x1234);
    let b = lossy_run(0x1234);
    let c = lossy_run(0x4321);
    eprintln!(
        "seed 0x1234: {} events, {:?}, done at {:?}; seed 0x4321: {:?}, done at {:?}",
        a.trace.len(),
        a.fabric,
        a.finished_at,
        c.fabric,
        c.finished_at
    );
    assert!(
        a.fabric.lost > 0 && a.fabric.reordered > 0,
        "{:?}",
        a.fabric
    );
    assert_eq!(a, b, "one seed, one run");
    assert_eq!(
        a.digest, c.digest,
        "the same bytes arrive whatever the faults"
    );
    assert_ne!(
        (a.fabric, a.finished_at),
        (c.fabric, c.finished_at),
        "another seed, another run"
    );
}
