//! Fuzz `UdSocket::recv` with arbitrary receive completions.
//!
//! [`FuzzQp`] is a `UdQueuePair` built on the public API only. Its receive queue
//! holds what the socket posted; its completion queue returns what the input
//! scripts: any status, any `byte_len` (below the GRH, past the buffer), any
//! `src_qp` (also wider than 24 bits) and immediate data, for a receive still
//! posted or for a wr_id the provider does not hold (one the socket already got
//! back, or any value at all), with fuzzer bytes written into the posted buffer
//! (a valid GRH or arbitrary bytes; a QUIC-shaped payload with or without its
//! routing key as immediate data, or arbitrary bytes: the socket must hand up
//! either as it came). Events (QP fatal, GID change), failing `recover` and
//! failing `post_recv` are scripted too.
//!
//! Checked after every `recv` call:
//! - nothing panics;
//! - what was delivered is, in order, what a model of the receive rules predicts
//!   from the buffer contents at completion time (source GID and ECN from the
//!   GRH, QPN and immediate data from the completion, payload bytes
//!   `GRH_LEN..byte_len`), and nothing else;
//! - the counters reconcile: every completion polled is delivered
//!   (`recv_packets`) or counted exactly once by cause (`recv_errors`,
//!   `drop_bad_grh`, `recv_bogus_completions`); `recv_wrs_posted` and
//!   `qp_recoveries` match what the queue pair saw;
//! - the socket never posts a receive buffer twice, never posts one wr_id with
//!   two different buffers, and keeps its receive queue filled (every slot is
//!   posted or awaiting a repost that is due).
#![no_main]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use quic_rdma::fabric::{
    AhAttr, AhId, AsyncEvent, Completion, FabricError, Gid, Grh, GrhLayout, Memory, Mtu,
    ProviderDrops, QpAttr, Qpn, RecvWr, Region, SendWr, Sge, UdQueuePair, WcOpcode, WcStatus,
    DEFAULT_PKEY, DEFAULT_QKEY, GRH_LEN, MAX_QPN,
};
use quic_rdma::quic::{key_of_datagram, RoutingCidGenerator};
use quic_rdma::socket::{SocketConfig, SocketStats, UdSocket};
use quinn_proto::ConnectionIdGenerator;

/// Which work request a scripted completion completes.
#[derive(Clone, Copy, Debug)]
enum WrPick {
    /// The i-th (mod count) receive still posted; skipped if none is.
    Posted(usize),
    /// A wr_id the socket posted once but holds now (already completed).
    Stale(usize),
    /// Any wr_id not posted now (past the pool, past `u32`, or held).
    Raw(u64),
}

/// What the "hardware" writes into the GRH area.
#[derive(Clone, Debug)]
enum GrhBytes {
    /// A well-formed GRH of the port's layout.
    Valid(Grh),
    /// These 40 bytes.
    Raw([u8; GRH_LEN]),
    /// Nothing: whatever the buffer held before.
    Stale,
}

/// How `byte_len` relates to what was written.
#[derive(Clone, Copy, Debug)]
enum LenPick {
    /// GRH + payload written: what hardware reports.
    Exact,
    /// Any value below the GRH.
    Short(u8),
    /// Past the end of the buffer by this much.
    Over(u16),
    /// Anything.
    Raw(u32),
}

/// One scripted completion.
#[derive(Clone, Debug)]
struct Scripted {
    wr: WrPick,
    status: WcStatus,
    grh: GrhBytes,
    payload: Vec<u8>,
    len: LenPick,
    imm: Option<u32>,
    src_qp: Qpn,
}

/// What the receive rules make of one completion.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Deliver {
        gid: Gid,
        qpn: Qpn,
        ecn: u8,
        imm: Option<u32>,
        data: Vec<u8>,
    },
    /// An error status for a receive the provider held (`recv_errors`).
    Error,
    /// Success, but the GRH area does not parse (`drop_bad_grh`).
    BadGrh,
    /// What no conforming provider reports (`recv_bogus_completions`): a wr_id
    /// it does not hold, or Success with `byte_len` outside `GRH_LEN..=` the
    /// buffer or `src_qp` over 24 bits.
    Bogus,
}

/// The queue pair's state, shared between the fake and the harness.
#[derive(Default)]
struct State {
    attr: Option<QpAttr>,
    next_lkey: u32,
    /// Receives posted and not completed, in posting order.
    posted: VecDeque<RecvWr>,
    /// The buffer each wr_id was ever posted with.
    known: HashMap<u64, Sge>,
    /// wr_ids completed (not flushed; bogus ones of a posted receive included)
    /// and not posted again: the socket holds them for reposting.
    held: HashSet<u64>,
    /// The completion queue: scripted completions not yet polled.
    cq: VecDeque<Scripted>,
    events: VecDeque<AsyncEvent>,
    /// Fail the next `recover`.
    fail_recover: bool,
    /// Fail the next `post_recv` after this many WRs.
    fail_post_after: Option<usize>,
    /// A `post_recv` failed (by script) since the harness last looked.
    post_failed: bool,
    /// A `recover` failed: the socket is dead and keeps nothing filled.
    dead: bool,
    /// Model outcomes of the completions polled since the harness last looked.
    outcomes: Vec<Outcome>,
    wrs_posted: u64,
    recoveries: u64,
}

impl State {
    fn attr(&self) -> &QpAttr {
        self.attr.as_ref().expect("attr set at construction")
    }
}

/// A `UdQueuePair` whose receive completions come from the fuzz input.
struct FuzzQp {
    attr: QpAttr,
    st: Arc<Mutex<State>>,
}

impl FuzzQp {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap()
    }
}

impl UdQueuePair for FuzzQp {
    fn attr(&self) -> &QpAttr {
        &self.attr
    }

    fn register(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let mut st = self.lock();
        st.next_lkey += 1;
        region.set_lkey(Some(st.next_lkey));
        Ok(())
    }

    fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError> {
        region.set_lkey(None);
        Ok(())
    }

    fn create_ah(&mut self, _attr: &AhAttr) -> Result<AhId, FabricError> {
        Ok(AhId(0))
    }

    fn destroy_ah(&mut self, _ah: AhId) -> Result<(), FabricError> {
        Ok(())
    }

    fn post_send(&mut self, _mem: &Memory, _wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        // `recv` never sends; a send here would be a socket bug worth seeing.
        panic!("UdSocket::recv posted a send");
    }

    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        let mut st = self.lock();
        let fail_at = st.fail_post_after.take();
        for (i, wr) in wrs.iter().enumerate() {
            // On failure the WRs from `i` on stay with the socket, to post again.
            if fail_at == Some(i) {
                st.post_failed = true;
                st.held.extend(wrs[i..].iter().map(|w| w.wr_id));
                return Err((i, FabricError::QpError("scripted post_recv failure".into())));
            }
            if st.posted.len() >= self.attr.max_recv_wr as usize {
                st.held.extend(wrs[i..].iter().map(|w| w.wr_id));
                return Err((i, FabricError::QueueFull(st.posted.len())));
            }
            assert!(
                mem.resolve(&wr.sge).is_some_and(|b| b.len() >= GRH_LEN),
                "socket posted a receive outside registered memory: {wr:?}"
            );
            assert!(
                st.posted.iter().all(|p| p.wr_id != wr.wr_id),
                "socket posted wr_id {} while it was still posted",
                wr.wr_id
            );
            if let Some(sge) = st.known.insert(wr.wr_id, wr.sge) {
                assert_eq!(sge, wr.sge, "wr_id {} posted with another buffer", wr.wr_id);
            }
            st.held.remove(&wr.wr_id);
            st.posted.push_back(*wr);
            st.wrs_posted += 1;
        }
        Ok(())
    }

    fn poll_send_cq(&mut self, _out: &mut [Completion]) -> usize {
        0
    }

    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        let mut st = self.lock();
        let layout = GrhLayout::for_gid(self.attr.gid);
        let mut n = 0;
        while n < out.len() {
            let Some(s) = st.cq.pop_front() else { break };
            // The buffer this completion lands in, if the wr_id is one posted.
            let (wr_id, sge) = match s.wr {
                WrPick::Posted(i) => {
                    if st.posted.is_empty() {
                        continue; // hardware cannot complete a receive never posted
                    }
                    let i = i % st.posted.len();
                    let wr = st.posted.remove(i).unwrap();
                    (wr.wr_id, Some(wr.sge))
                }
                WrPick::Stale(i) => {
                    let mut ids: Vec<u64> = st.held.iter().copied().collect();
                    if ids.is_empty() {
                        continue;
                    }
                    ids.sort_unstable();
                    (ids[i % ids.len()], None)
                }
                WrPick::Raw(id) if st.posted.iter().any(|p| p.wr_id == id) => continue,
                WrPick::Raw(id) => (id, None),
            };
            let mut byte_len = (GRH_LEN + s.payload.len()) as u32;
            let outcome = match sge {
                // The provider does not hold this wr_id: whatever the status,
                // the socket must not touch (or repost) the slot it names.
                None => Outcome::Bogus,
                Some(sge) => {
                    let buf = mem.resolve_mut(&sge).expect("posted buffers resolve");
                    match &s.grh {
                        GrhBytes::Valid(g) => g.write(&mut buf[..GRH_LEN], layout),
                        GrhBytes::Raw(b) => buf[..GRH_LEN].copy_from_slice(b),
                        GrhBytes::Stale => {}
                    }
                    let room = buf.len() - GRH_LEN;
                    let k = s.payload.len().min(room);
                    buf[GRH_LEN..GRH_LEN + k].copy_from_slice(&s.payload[..k]);
                    byte_len = match s.len {
                        LenPick::Exact => (GRH_LEN + k) as u32,
                        LenPick::Short(b) => u32::from(b) % GRH_LEN as u32,
                        LenPick::Over(o) => (buf.len() + 1 + usize::from(o)) as u32,
                        LenPick::Raw(v) => v,
                    };
                    model(&s, byte_len, buf, layout)
                }
            };
            // The socket keeps the buffer of every completion of a posted
            // receive to repost it (a bogus length or QPN included), except a
            // flushed one: the recovery that follows returns them all.
            if sge.is_some() && s.status != WcStatus::WrFlushErr {
                st.held.insert(wr_id);
            }
            out[n] = Completion {
                wr_id,
                status: s.status,
                opcode: WcOpcode::Recv,
                byte_len,
                imm: s.imm,
                src_qp: s.src_qp,
                timestamp: None,
            };
            if trace() {
                eprintln!(
                    "poll: {:?} ({:?} GRH {:?}, {} payload bytes) -> model {:?}",
                    out[n],
                    s.wr,
                    s.grh,
                    s.payload.len(),
                    outcome
                );
            }
            st.outcomes.push(outcome);
            n += 1;
        }
        n
    }

    fn arm(&mut self, _waker: &Waker) -> bool {
        let st = self.lock();
        !st.cq.is_empty() || !st.events.is_empty()
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        let ev = self.lock().events.pop_front();
        if let Some(AsyncEvent::GidChanged { new }) = ev {
            self.attr.gid = new;
        }
        ev
    }

    fn recover(&mut self) -> Result<(), FabricError> {
        let mut st = self.lock();
        if std::mem::take(&mut st.fail_recover) {
            st.dead = true;
            return Err(FabricError::QpError("scripted recover failure".into()));
        }
        // The trait's contract: nothing outstanding, unpolled completions gone,
        // a queued QpFatal dropped; the socket owns every buffer again.
        st.posted.clear();
        st.held.clear();
        st.cq.clear();
        st.events.retain(|e| *e != AsyncEvent::QpFatal);
        st.recoveries += 1;
        Ok(())
    }

    fn drops(&self) -> ProviderDrops {
        ProviderDrops::default()
    }
}

/// Print what the completion queue returns (`QR_FUZZ_TRACE=1`, to read a crash input).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("QR_FUZZ_TRACE").is_some())
}

/// The receive rules for a completion of a posted receive, as documented by
/// `UdSocket::recv`, `SocketStats` and `fabric` (byte_len counts the GRH area,
/// which the hardware always writes, so a Success shorter than it or longer
/// than the buffer is not real; a QPN has 24 bits, IBA 9.2 BTH; the GRH gives
/// source GID and ECN; the immediate data is handed up as it came), applied to
/// the buffer as the completion left it.
fn model(s: &Scripted, byte_len: u32, buf: &[u8], layout: GrhLayout) -> Outcome {
    if s.status != WcStatus::Success {
        return Outcome::Error;
    }
    let end = byte_len as usize;
    if !(GRH_LEN..=buf.len()).contains(&end) || s.src_qp > MAX_QPN {
        return Outcome::Bogus;
    }
    let Ok(grh) = Grh::parse(&buf[..GRH_LEN], layout) else {
        return Outcome::BadGrh;
    };
    let data = &buf[GRH_LEN..end];
    Outcome::Deliver {
        gid: grh.sgid,
        qpn: s.src_qp,
        ecn: grh.ecn(),
        imm: s.imm,
        data: data.to_vec(),
    }
}

fn gid(u: &mut Unstructured<'_>, ipv4: bool) -> ArbResult<Gid> {
    Ok(if ipv4 {
        std::net::Ipv4Addr::from(u.arbitrary::<[u8; 4]>()?).into()
    } else {
        Gid(u.arbitrary()?)
    })
}

fn bytes(u: &mut Unstructured<'_>, max: usize) -> ArbResult<Vec<u8>> {
    let n = u.int_in_range(0..=max)?.min(u.len());
    Ok(u.bytes(n)?.to_vec())
}

fn scripted(u: &mut Unstructured<'_>, ipv4: bool) -> ArbResult<Scripted> {
    let wr = match u.int_in_range(0..=9)? {
        0..=7 => WrPick::Posted(u.arbitrary()?),
        8 => WrPick::Stale(u.arbitrary()?),
        _ => WrPick::Raw(u.arbitrary()?),
    };
    let status = match u.int_in_range(0..=7)? {
        0 => WcStatus::LocLenErr,
        1 => WcStatus::LocProtErr,
        2 => WcStatus::WrFlushErr,
        3 => WcStatus::GeneralErr,
        _ => WcStatus::Success,
    };
    let grh = match u.int_in_range(0..=5)? {
        0 => GrhBytes::Raw(u.arbitrary()?),
        1 => GrhBytes::Stale,
        _ => GrhBytes::Valid(Grh {
            sgid: gid(u, ipv4)?,
            dgid: gid(u, ipv4)?,
            traffic_class: u.arbitrary()?,
            flow_label: u.arbitrary::<u32>()? & 0xF_FFFF,
            hop_limit: u.arbitrary()?,
            ip_payload_len: u.arbitrary()?,
        }),
    };
    // A QUIC-shaped payload (long or short header around a routing CID), with
    // the immediate data carrying its key, another value or none (what the QUIC
    // drivers above the socket check); or arbitrary bytes.
    let (payload, imm) = if u.ratio(2, 3)? {
        let key: u32 = u.arbitrary()?;
        let cid = RoutingCidGenerator::new(key, u.int_in_range(4..=20)?).generate_cid();
        let mut p = Vec::new();
        if u.arbitrary()? {
            p.extend_from_slice(&[0xC0, 0, 0, 0, 1, cid.len() as u8]);
        } else {
            p.push(0x40);
        }
        p.extend_from_slice(&cid);
        p.extend_from_slice(&bytes(u, 64)?);
        let imm = match u.int_in_range(0..=3)? {
            0 => None,
            1 => Some(u.arbitrary()?),
            _ => key_of_datagram(&p),
        };
        (p, imm)
    } else {
        (bytes(u, 4200)?, u.arbitrary()?)
    };
    let len = match u.int_in_range(0..=7)? {
        0 => LenPick::Short(u.arbitrary()?),
        1 => LenPick::Over(u.arbitrary()?),
        2 => LenPick::Raw(u.arbitrary()?),
        _ => LenPick::Exact,
    };
    // One in 16 wider than a QPN's 24 bits; the rest in range, so that most
    // completions can be delivered.
    let raw: u32 = u.arbitrary()?;
    let src_qp = if raw >> 24 & 0xF == 0xF {
        raw
    } else {
        raw & MAX_QPN
    };
    Ok(Scripted {
        wr,
        status,
        grh,
        payload,
        len,
        imm,
        src_qp,
    })
}

/// The receive counters that account for completions.
fn tally(s: &SocketStats) -> [u64; 4] {
    [
        s.recv_packets,
        s.recv_errors,
        s.drop_bad_grh,
        s.recv_bogus_completions,
    ]
}

fn run(u: &mut Unstructured<'_>) -> ArbResult<()> {
    let ipv4 = u.arbitrary()?;
    let gid0 = gid(u, ipv4)?;
    let attr = QpAttr {
        qpn: u.arbitrary::<u32>()? & MAX_QPN,
        qkey: DEFAULT_QKEY,
        pkey: DEFAULT_PKEY,
        gid: gid0,
        active_mtu: if u.arbitrary()? {
            Mtu::M4096
        } else {
            Mtu::M2048
        },
        max_inline: 64,
        max_send_wr: 64,
        max_recv_wr: u.int_in_range(1..=48)?,
    };
    // This byte chose the routing-key check before the socket lost it; still
    // read so that the committed corpus replays the scenarios it was cut for.
    let _: bool = u.arbitrary()?;
    let cfg = SocketConfig {
        recv_depth: u.int_in_range(1..=48)?,
        repost_batch: u.int_in_range(1..=16)?,
        send_slots: 1,
        region_bytes: 1 << 20,
        // Immediate data with bit 31 set would be taken as a part of a
        // segmented datagram (docs/architecture.md §6), which this model does
        // not follow: the `reassembly` target fuzzes that path.
        segmentation: false,
        ..SocketConfig::default()
    };
    let st = Arc::new(Mutex::new(State {
        attr: Some(attr.clone()),
        ..State::default()
    }));
    let qp = FuzzQp {
        attr,
        st: st.clone(),
    };
    let mut sock = UdSocket::new(qp, cfg).expect("valid configuration");
    let depth = sock.config().recv_depth;
    if trace() {
        eprintln!("socket: {:?}, QP {:?}", sock.config(), sock.qp_attr());
    }
    let batch = sock.config().repost_batch;
    assert!(
        (1..=depth).contains(&batch),
        "repost_batch {batch} not capped at recv_depth {depth}"
    );
    {
        let s = st.lock().unwrap();
        assert_eq!(
            s.posted.len(),
            depth,
            "construction fills the receive queue"
        );
        assert_eq!(sock.stats().recv_wrs_posted, s.wrs_posted);
    }

    for _ in 0..48 {
        if u.is_empty() {
            break;
        }
        // Script what happens before the next `recv`.
        {
            let mut s = st.lock().unwrap();
            for _ in 0..u.int_in_range(0..=40)? {
                let layout_v4 = s.attr().gid.is_ipv4();
                let sc = scripted(u, layout_v4)?;
                s.cq.push_back(sc);
            }
            match u.int_in_range(0..=15)? {
                0 => s.events.push_back(AsyncEvent::QpFatal),
                1 => {
                    let v4 = u.arbitrary()?;
                    let new = gid(u, v4)?;
                    s.events.push_back(AsyncEvent::GidChanged { new });
                    if let Some(a) = s.attr.as_mut() {
                        a.gid = new;
                    }
                }
                2 => s.events.push_back(AsyncEvent::PortDown),
                3 => s.fail_recover = true,
                4 => s.fail_post_after = Some(u.int_in_range(0..=8)?),
                _ => {}
            }
        }
        let max = u.int_in_range(1..=80)?;
        if trace() {
            let s = st.lock().unwrap();
            eprintln!(
                "recv(max {max}): {} scripted, events {:?}, fail_recover {}, fail_post_after {:?}; {} posted",
                s.cq.len(),
                s.events,
                s.fail_recover,
                s.fail_post_after,
                s.posted.len()
            );
        }
        let before = sock.stats();
        let mut got = Vec::new();
        let n = sock.recv(max, |r| {
            assert_eq!(r.src.qkey, DEFAULT_QKEY);
            got.push(Outcome::Deliver {
                gid: r.src.gid,
                qpn: r.src.qpn,
                ecn: r.ecn,
                imm: r.imm,
                data: r.data.to_vec(),
            });
        });
        let after = sock.stats();
        let mut s = st.lock().unwrap();
        let outcomes = std::mem::take(&mut s.outcomes);
        assert_eq!(n, got.len(), "recv returns what it delivered");
        assert!(n <= max);
        let want: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Deliver { .. }))
            .collect();
        assert_eq!(got.iter().collect::<Vec<_>>(), want, "deliveries");
        let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count() as u64;
        let (b, a) = (tally(&before), tally(&after));
        let delta: Vec<u64> = a.iter().zip(&b).map(|(a, b)| a - b).collect();
        assert_eq!(
            delta.iter().sum::<u64>(),
            outcomes.len() as u64,
            "every completion delivered or counted once: {delta:?} for {outcomes:?}"
        );
        let want = [
            count(|o| matches!(o, Outcome::Deliver { .. })),
            count(|o| matches!(o, Outcome::Error)),
            count(|o| matches!(o, Outcome::BadGrh)),
            count(|o| matches!(o, Outcome::Bogus)),
        ];
        let causes = [
            "recv_packets",
            "recv_errors",
            "drop_bad_grh",
            "recv_bogus_completions",
        ];
        for ((cause, d), w) in causes.iter().zip(&delta).zip(want) {
            assert_eq!(*d, w, "completions counted as {cause}, for {outcomes:?}");
        }
        let bytes: usize = got
            .iter()
            .map(|o| match o {
                Outcome::Deliver { data, .. } => data.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(after.recv_bytes - before.recv_bytes, bytes as u64);
        assert_eq!(after.recv_wrs_posted, s.wrs_posted);
        assert_eq!(after.qp_recoveries, s.recoveries);
        // Every slot is posted, or held by the socket for a repost not yet due.
        let post_failed = std::mem::take(&mut s.post_failed);
        if !s.dead && !post_failed {
            assert_eq!(
                s.posted.len() + s.held.len(),
                depth,
                "receive slots lost: {} posted, {} held",
                s.posted.len(),
                s.held.len()
            );
            // With nothing posted nothing can complete, so nothing would ever
            // trigger the repost: the socket would be deaf for good.
            assert!(
                !s.posted.is_empty(),
                "receive queue left empty ({} held)",
                s.held.len()
            );
            // recv.rs reposts when `reposts >= repost_batch || posted <= depth / 2`.
            assert!(
                s.held.is_empty() || (s.held.len() < batch && s.posted.len() > depth / 2),
                "repost overdue: {} held (batch {batch}), {} posted of {depth}",
                s.held.len(),
                s.posted.len()
            );
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
