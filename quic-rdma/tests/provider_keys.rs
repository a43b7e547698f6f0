//! `sim` and `soft` accept and drop the same packets for the same keys: both
//! apply the one receive rule of `fabric::keys` (IBA 10.9.3 P_Key membership,
//! Q_Key match, destination QPN) and count drops by the same causes.
//!
//! Each case sends one packet with the case's keys. The sim decides its fate
//! inside `post_send`; over `soft` a marker packet with good keys follows from
//! another port, and once the marker is in, the first packet's fate is decided
//! (loopback delivers in send order).
//!
//! Loopback addresses of this file: 127.91.x.y.

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{
    AhAttr, Completion, FabricError, Gid, Memory, ProviderDrops, Region, SendFlags, SendWr, Sge,
    UdQueuePair, WcStatus, DEFAULT_QKEY, GRH_LEN,
};

const SLOT: u32 = 1024;
const FULL: u16 = 0xFFFF;
const LIMITED: u16 = 0x7FFF;
const OTHER_QKEY: u32 = 0x0BAD_0BAD;

/// A QP with `slots` receive slots and one send slot after them.
struct Ep {
    qp: Box<dyn UdQueuePair>,
    mem: Memory,
    region: u32,
    lkey: u32,
    slots: u32,
}

impl Ep {
    fn new(mut qp: Box<dyn UdQueuePair>, slots: u32) -> Ep {
        let mut mem = Memory::new();
        let mut r = Region::new(((slots + 1) * SLOT) as usize);
        qp.register(&mut r).unwrap();
        let lkey = r.lkey().unwrap();
        let region = mem.push(r);
        Ep {
            qp,
            mem,
            region,
            lkey,
            slots,
        }
    }

    fn sge(&self, slot: u32, len: u32) -> Sge {
        Sge {
            region: self.region,
            offset: slot * SLOT,
            len,
            lkey: self.lkey,
        }
    }

    fn post_recvs(&mut self) {
        let wrs: Vec<_> = (0..self.slots)
            .map(|i| quic_rdma::fabric::RecvWr {
                wr_id: u64::from(i),
                sge: self.sge(i, SLOT),
            })
            .collect();
        self.qp.post_recv(&mut self.mem, &wrs).unwrap();
    }

    fn send(&mut self, to: Gid, qpn: u32, qkey: u32, payload: &[u8]) {
        let off = (self.slots * SLOT) as usize;
        self.mem
            .region_mut(self.region)
            .unwrap()
            .slice_mut(off, payload.len())
            .unwrap()
            .copy_from_slice(payload);
        let ah = self.qp.create_ah(&AhAttr::new(to, 0)).unwrap();
        let wr = SendWr {
            wr_id: 1,
            sge: self.sge(self.slots, payload.len() as u32),
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
            imm: None,
            flags: SendFlags {
                signaled: true,
                inline: false,
            },
        };
        self.qp.post_send(&self.mem, &[wr]).unwrap();
        let mut c = [Completion::send(0); 2];
        assert_eq!(self.qp.poll_send_cq(&mut c), 1);
        assert_eq!(c[0].status, WcStatus::Success);
        self.qp.destroy_ah(ah).unwrap();
    }

    /// Payloads received until `marker` arrived (or 2 s passed); an empty
    /// `marker`: what has arrived already.
    fn recv_until(&mut self, marker: &[u8]) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut c = [Completion::send(0); 4];
        let mut polls = 0;
        while (polls == 0 || !marker.is_empty())
            && !got.iter().any(|p: &Vec<u8>| p == marker)
            && Instant::now() < deadline
        {
            polls += 1;
            let n = self.qp.poll_recv_cq(&mut self.mem, &mut c);
            for done in &c[..n] {
                assert_eq!(done.status, WcStatus::Success);
                let off = (done.wr_id as u32 * SLOT) as usize + GRH_LEN;
                let len = done.byte_len as usize - GRH_LEN;
                let r = self.mem.region(self.region).unwrap();
                got.push(r.slice(off, len).unwrap().to_vec());
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        got
    }
}

/// What became of the case's packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Delivered,
    BadPkey,
    BadQkey,
    UnknownQpn,
    /// Neither delivered nor counted: a bug.
    Vanished,
}

/// A case: the receiving QP's P_Key, the sender's P_Key, the WR's Q_Key, and
/// whether the packet goes to the receiver's QPN or to one nobody has.
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    rx_pkey: u16,
    tx_pkey: u16,
    qkey: u32,
    to_known_qpn: bool,
    want: Fate,
}

const CASES: &[Case] = &[
    Case {
        name: "full / full",
        rx_pkey: FULL,
        tx_pkey: FULL,
        qkey: DEFAULT_QKEY,
        to_known_qpn: true,
        want: Fate::Delivered,
    },
    Case {
        name: "limited sender, full receiver",
        rx_pkey: FULL,
        tx_pkey: LIMITED,
        qkey: DEFAULT_QKEY,
        to_known_qpn: true,
        want: Fate::Delivered,
    },
    Case {
        name: "full sender, limited receiver",
        rx_pkey: LIMITED,
        tx_pkey: FULL,
        qkey: DEFAULT_QKEY,
        to_known_qpn: true,
        want: Fate::Delivered,
    },
    Case {
        name: "limited / limited",
        rx_pkey: LIMITED,
        tx_pkey: LIMITED,
        qkey: DEFAULT_QKEY,
        to_known_qpn: true,
        want: Fate::BadPkey,
    },
    Case {
        name: "other partition",
        rx_pkey: FULL,
        tx_pkey: 0x8001,
        qkey: DEFAULT_QKEY,
        to_known_qpn: true,
        want: Fate::BadPkey,
    },
    Case {
        name: "wrong Q_Key",
        rx_pkey: FULL,
        tx_pkey: FULL,
        qkey: OTHER_QKEY,
        to_known_qpn: true,
        want: Fate::BadQkey,
    },
    Case {
        // IBA 10.2.4: a privileged WR Q_Key sends the sender QP's own Q_Key.
        name: "privileged WR Q_Key",
        rx_pkey: FULL,
        tx_pkey: FULL,
        qkey: 0x8000_0000,
        to_known_qpn: true,
        want: Fate::Delivered,
    },
    Case {
        name: "unknown QPN",
        rx_pkey: FULL,
        tx_pkey: FULL,
        qkey: DEFAULT_QKEY,
        to_known_qpn: false,
        want: Fate::UnknownQpn,
    },
];

/// Run `case` with a receiver, a sender with the case's P_Key and, for a
/// provider that delivers after `post_send` returns, a marker sender with the
/// default keys; `to` is the receiver's GID.
fn run(case: &Case, mut rx: Ep, mut tx: Ep, marker: Option<Ep>, to: Gid) -> Fate {
    rx.post_recvs();
    let before: ProviderDrops = rx.qp.drops();
    let qpn = rx.qp.attr().qpn;
    let dest = if case.to_known_qpn { qpn } else { qpn + 0x100 };
    tx.send(to, dest, case.qkey, b"the case's packet");
    let got = match marker {
        Some(mut marker) => {
            marker.send(to, qpn, DEFAULT_QKEY, b"marker");
            let got = rx.recv_until(b"marker");
            assert!(
                got.iter().any(|p| p == b"marker"),
                "{}: marker lost",
                case.name
            );
            got
        }
        None => rx.recv_until(b""),
    };
    let d = rx.qp.drops();
    if got.iter().any(|p| p == b"the case's packet") {
        Fate::Delivered
    } else if d.bad_pkey > before.bad_pkey {
        Fate::BadPkey
    } else if d.bad_qkey > before.bad_qkey {
        Fate::BadQkey
    } else if d.unknown_qpn > before.unknown_qpn {
        Fate::UnknownQpn
    } else {
        Fate::Vanished
    }
}

fn sim_fate(case: &Case) -> Fate {
    let f = SimFabric::new(SimConfig::default());
    let g = |n: u16| -> Gid { Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into() };
    let qp = |gid, pkey| -> Box<dyn UdQueuePair> {
        let opts = SimQpOptions {
            pkey,
            ..SimQpOptions::default()
        };
        Box::new(f.create_qp(gid, opts).unwrap())
    };
    let rx = Ep::new(qp(g(1), case.rx_pkey), 4);
    let tx = Ep::new(qp(g(2), case.tx_pkey), 0);
    // The sim delivers inside post_send: no marker needed.
    run(case, rx, tx, None, g(1))
}

fn soft_fate(case: &Case, index: u8) -> Fate {
    let port = |host: u8, pkey: u16| {
        let ip: IpAddr = [127, 91, index, host].into();
        let cfg = SoftConfig {
            pkey,
            ..SoftConfig::new(ip).with_port(0)
        };
        SoftPort::open(cfg).unwrap()
    };
    let prx = port(1, case.rx_pkey);
    let ptx = port(2, case.tx_pkey);
    let pmk = port(3, FULL);
    for p in [&ptx, &pmk] {
        p.set_peer_port(prx.gid(), prx.local_addr().port());
    }
    let rx = Ep::new(Box::new(prx.create_qp(DEFAULT_QKEY).unwrap()), 4);
    let tx = Ep::new(Box::new(ptx.create_qp(DEFAULT_QKEY).unwrap()), 0);
    let marker = Ep::new(Box::new(pmk.create_qp(DEFAULT_QKEY).unwrap()), 0);
    run(case, rx, tx, Some(marker), prx.gid())
}

#[test]
fn sim_and_soft_accept_and_drop_the_same_packets() {
    let mut wrong = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let sim = sim_fate(case);
        let soft = soft_fate(case, i as u8 + 1);
        if (sim, soft) != (case.want, case.want) {
            wrong.push(format!(
                "{}: sim {sim:?}, soft {soft:?}, want {:?}",
                case.name, case.want
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "providers disagree:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn both_providers_refuse_an_invalid_pkey_by_name() {
    let f = SimFabric::new(SimConfig::default());
    for pkey in [0x0000, 0x8000] {
        let sim = f.create_qp(
            Gid::from(Ipv6Addr::LOCALHOST),
            SimQpOptions {
                pkey,
                ..SimQpOptions::default()
            },
        );
        assert!(matches!(sim, Err(FabricError::InvalidPkey(p)) if p == pkey));
        let soft = SoftPort::open(SoftConfig {
            pkey,
            ..SoftConfig::new([127, 91, 0, 1].into()).with_port(0)
        });
        let err = soft.unwrap_err();
        assert!(matches!(err, FabricError::InvalidPkey(p) if p == pkey));
        assert!(err.to_string().contains("0xffff"), "{err}");
    }
}
