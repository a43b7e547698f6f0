//! Interop with rdma-core's `ibv_ud_pingpong` (unmodified): the `verbs` provider
//! speaks its TCP address exchange and its UD ping-pong, once as the client of an
//! `ibv_ud_pingpong` server and once as the server of an `ibv_ud_pingpong` client.
//!
//! The exchange (libibverbs/examples/ud_pingpong.c): TCP port 18515 by default;
//! each side sends `"%04x:%06x:%06x:%s\0"` — LID, QPN, PSN and the GID as 32 hex
//! digits in wire order — 52 bytes; the client then sends `"done\0"`. Q_Key
//! 0x11111111; messages of `-s` bytes; the client sends first and each side sends
//! again once its last send completed and a message arrived.
//!
//! Runs where an RDMA device and `ibv_ud_pingpong` exist (the rxe guest); skips
//! otherwise unless `QR_REQUIRE_RDMA=1`.
#![cfg(feature = "verbs")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quic_rdma::fabric::verbs::{VerbsOptions, VerbsQp};
use quic_rdma::fabric::{
    AhAttr, Completion, FabricError, Gid, Memory, RecvWr, Region, SendFlags, SendWr, Sge,
    UdQueuePair, WcStatus, GRH_LEN,
};

const PP_QKEY: u32 = 0x1111_1111;
const MSG_LEN: usize = 52;
const SIZE: usize = 1024;
const ITERS: u32 = 200;
const RX_DEPTH: usize = 16;

#[derive(Debug, PartialEq, Eq)]
struct Dest {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: Gid,
}

fn encode(d: &Dest) -> [u8; MSG_LEN] {
    let hex: String = d.gid.0.iter().map(|b| format!("{b:02x}")).collect();
    let s = format!("{:04x}:{:06x}:{:06x}:{hex}", d.lid, d.qpn, d.psn);
    let mut out = [0u8; MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

fn decode(msg: &[u8]) -> Dest {
    let s = std::str::from_utf8(msg).unwrap().trim_end_matches('\0');
    let parts: Vec<&str> = s.split(':').collect();
    assert_eq!(parts.len(), 4, "bad exchange message {s:?}");
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&parts[3][2 * i..2 * i + 2], 16).unwrap();
    }
    Dest {
        lid: u32::from_str_radix(parts[0], 16).unwrap(),
        qpn: u32::from_str_radix(parts[1], 16).unwrap(),
        psn: u32::from_str_radix(parts[2], 16).unwrap(),
        gid: Gid(gid),
    }
}

#[test]
fn exchange_message_format() {
    let d = Dest {
        lid: 0,
        qpn: 0x12,
        psn: 0xabcdef,
        gid: "::ffff:127.0.0.1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .into(),
    };
    let m = encode(&d);
    assert_eq!(
        &m[..51],
        b"0000:000012:abcdef:00000000000000000000ffff7f000001"
    );
    assert_eq!(m[51], 0);
    assert_eq!(decode(&m), d);
}

fn have_pingpong() -> bool {
    Command::new("ibv_ud_pingpong")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn open() -> Option<VerbsQp> {
    let opts = VerbsOptions {
        qkey: PP_QKEY,
        ..VerbsOptions::default()
    };
    match VerbsQp::open(&opts) {
        Ok(qp) if have_pingpong() => Some(qp),
        Ok(_) if std::env::var("QR_REQUIRE_RDMA").is_err() => {
            eprintln!("skipped: ibv_ud_pingpong not installed");
            None
        }
        Ok(_) => panic!("ibv_ud_pingpong (ibverbs-utils) is required"),
        Err(e @ FabricError::NoDevice { .. }) if std::env::var("QR_REQUIRE_RDMA").is_err() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("opening the verbs QP failed: {e}"),
    }
}

/// Our side: a QP with its receives posted before the address exchange (a UD
/// message that finds no posted receive is lost).
struct Pp {
    qp: VerbsQp,
    mem: Memory,
    lkey: u32,
    stride: usize,
}

impl Pp {
    fn new(mut qp: VerbsQp) -> Pp {
        let stride = (SIZE + GRH_LEN).div_ceil(64) * 64;
        let mut mem = Memory::new();
        let mut r = Region::new(stride * (RX_DEPTH + 1));
        qp.register(&mut r).unwrap();
        let lkey = r.lkey().unwrap();
        mem.push(r);
        let pp = Pp {
            qp,
            mem,
            lkey,
            stride,
        };
        let recvs: Vec<RecvWr> = (0..RX_DEPTH)
            .map(|s| RecvWr {
                wr_id: s as u64,
                sge: pp.sge(s, SIZE + GRH_LEN),
            })
            .collect();
        let mut pp = pp;
        pp.qp.post_recv(&mut pp.mem, &recvs).unwrap();
        pp
    }

    fn sge(&self, slot: usize, len: usize) -> Sge {
        Sge {
            region: 0,
            offset: (slot * self.stride) as u32,
            len: len as u32,
            lkey: self.lkey,
        }
    }
}

/// The ping-pong loop of ud_pingpong.c, over a connected peer.
fn pingpong(pp: Pp, peer: &Dest, client: bool) -> (u32, u32) {
    let Pp {
        mut qp,
        mut mem,
        lkey,
        stride,
    } = pp;
    let sge = |slot: usize, len: usize| Sge {
        region: 0,
        offset: (slot * stride) as u32,
        len: len as u32,
        lkey,
    };
    let ah = qp.create_ah(&AhAttr::new(peer.gid, 0)).unwrap();
    let r = mem.region_mut(0).unwrap();
    r.slice_mut(RX_DEPTH * stride, SIZE).unwrap().fill(0x5a);
    let send = SendWr {
        wr_id: 1 << 32,
        sge: sge(RX_DEPTH, SIZE),
        ah,
        remote_qpn: peer.qpn,
        remote_qkey: PP_QKEY,
        imm: None,
        flags: SendFlags {
            signaled: true,
            inline: false,
        },
    };
    const RECV: u8 = 1;
    const SEND: u8 = 2;
    let mut pending = RECV;
    if client {
        qp.post_send(&mem, &[send]).unwrap();
        pending |= SEND;
    }
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wcs = [Completion::send(0); 8];
    let deadline = Instant::now() + Duration::from_secs(120);
    while rcnt < ITERS || scnt < ITERS {
        assert!(
            Instant::now() < deadline,
            "ping-pong stalled at rcnt {rcnt} scnt {scnt}"
        );
        let mut events = Vec::new();
        let n = qp.poll_send_cq(&mut wcs);
        events.extend(wcs[..n].iter().map(|w| (SEND, *w)));
        let n = qp.poll_recv_cq(&mut mem, &mut wcs);
        events.extend(wcs[..n].iter().map(|w| (RECV, *w)));
        for (kind, wc) in events {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if kind == SEND {
                scnt += 1;
            } else {
                assert_eq!(wc.byte_len as usize, GRH_LEN + SIZE);
                assert_eq!(wc.src_qp, peer.qpn);
                let slot = wc.wr_id as usize;
                qp.post_recv(
                    &mut mem,
                    &[RecvWr {
                        wr_id: wc.wr_id,
                        sge: sge(slot, SIZE + GRH_LEN),
                    }],
                )
                .unwrap();
                rcnt += 1;
            }
            pending &= !kind;
            if scnt < ITERS && pending == 0 {
                qp.post_send(&mem, &[send]).unwrap();
                pending = RECV | SEND;
            }
        }
    }
    drop(qp); // the QP goes before the memory its WRs pointed into
    drop(mem);
    (rcnt, scnt)
}

fn me(qp: &VerbsQp) -> Dest {
    Dest {
        lid: 0,
        qpn: qp.attr().qpn,
        psn: rand::random::<u32>() & 0xFF_FFFF,
        gid: qp.attr().gid,
    }
}

fn spawn_pingpong(qp: &VerbsQp, port: u16, server: Option<&str>) -> Child {
    let mut c = Command::new("ibv_ud_pingpong");
    c.args(["-d", qp.device_name()])
        .args(["-g", &qp.gid_index().to_string()])
        .args(["-p", &port.to_string()])
        .args(["-s", &SIZE.to_string()])
        .args(["-n", &ITERS.to_string()]);
    if let Some(host) = server {
        c.arg(host);
    }
    c.spawn().unwrap()
}

fn finish(mut child: Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "ibv_ud_pingpong exited with {st}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ibv_ud_pingpong did not finish");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn verbs_client_with_ibv_ud_pingpong_server() {
    let Some(qp) = open() else { return };
    let port = 18515;
    let child = spawn_pingpong(&qp, port, None);
    let mine = me(&qp);
    let pp = Pp::new(qp);
    // Connect (the server needs a moment to listen).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tcp = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("connecting to ibv_ud_pingpong: {e}"),
        }
    };
    tcp.write_all(&encode(&mine)).unwrap();
    let mut msg = [0u8; MSG_LEN];
    tcp.read_exact(&mut msg).unwrap();
    tcp.write_all(b"done\0").unwrap();
    drop(tcp);
    let peer = decode(&msg);
    eprintln!("us {mine:?}, ibv_ud_pingpong server {peer:?}");
    let (r, s) = pingpong(pp, &peer, true);
    assert_eq!((r, s), (ITERS, ITERS));
    finish(child);
}

#[test]
fn verbs_server_with_ibv_ud_pingpong_client() {
    let Some(qp) = open() else { return };
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let child = spawn_pingpong(&qp, port, Some("127.0.0.1"));
    let mine = me(&qp);
    let pp = Pp::new(qp);
    let (mut tcp, _) = listener.accept().unwrap();
    let mut msg = [0u8; MSG_LEN];
    tcp.read_exact(&mut msg).unwrap();
    let peer = decode(&msg);
    tcp.write_all(&encode(&mine)).unwrap();
    // The client's "done"; its length varies between rdma-core versions.
    let mut done = [0u8; MSG_LEN];
    let _ = tcp.read(&mut done);
    drop(tcp);
    eprintln!("us {mine:?}, ibv_ud_pingpong client {peer:?}");
    let (r, s) = pingpong(pp, &peer, false);
    assert_eq!((r, s), (ITERS, ITERS));
    finish(child);
}
