//! Wireshark's view of our packets: capture a `soft` transfer (capture filter
//! `udp port 4791`) and let `tshark` (Debian package `tshark`) decode it as
//! RoCEv2 / InfiniBand. Every packet must be a UD SEND only (0x64) or SEND only
//! with immediate (0x65), carry P_Key 0xFFFF, our Q_Key and the sender's QPN as
//! DETH source QP, addressed to the receiver's QPN, with nothing malformed and no
//! expert-info error. Wireshark 4.0 shows the ICRC but does not verify it, so the
//! test recomputes each packet's ICRC from the captured wire bytes itself
//! (IBA Annex A17.4.5.3 masking; CRC-32 via crc32fast, independent of the codec).
//!
//! IPv4: on loopback (127.0.0.x); IPv6: on the veth of a network namespace pair
//! the test creates. Needs root (capturing, namespaces): fails with a message
//! otherwise.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use common::{json_of, qr, require_root_and, Guard, NetnsPair, TempDir};
use serde_json::Value;

/// Expert-info severity "Error" (epan/proto.h PI_ERROR).
const PI_ERROR: u64 = 0x0080_0000;

/// Captured on the sending host, a UDP GSO batch is one large datagram (the
/// kernel cuts it after the capture point): the endpoints send one packet per
/// datagram here, as a NIC puts them on the wire.
const GSO_ENV: &str = "QR_SOFT_GSO_SEGMENTS";

/// Capture with `tshark` on `iface` (inside `netns` if given) while `run` runs.
fn capture(netns: Option<&str>, iface: &str, filter: &str, pcap: &Path, run: impl FnOnce()) {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tshark"]);
            c
        }
        None => Command::new("tshark"),
    };
    cmd.args(["-i", iface, "-f", filter, "-F", "pcap", "-w"])
        .arg(pcap);
    let mut ts = Guard::spawn(&mut cmd);
    // tshark says "Capturing on ..." once the capture runs.
    let stderr = ts.0.as_mut().unwrap().stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut said = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.contains("Capturing on") => break,
            Ok(l) => said.push(l),
            Err(_) => panic!("tshark did not start capturing: {said:?}"),
        }
    }
    // dumpcap announces the capture slightly before its filter is live, and on a
    // loaded machine flushes late: give both ends slack (seen: 0 packets captured).
    std::thread::sleep(Duration::from_secs(1));
    run();
    std::thread::sleep(Duration::from_secs(2));
    // SIGINT: tshark finishes writing the file and exits.
    let pid = ts.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = ts.wait(Duration::from_secs(30));
    assert!(out.status.success(), "tshark capture failed: {out:?}");
}

/// The heuristic dissectors Wireshark 4.0 tries on every InfiniBand payload
/// (`tshark -G heuristic-decodes`, table `infiniband.payload`; these are their
/// internal names, which `--disable-heuristic` takes). Our payload is QUIC
/// ciphertext, so now and then one of them "finds" its protocol in random bytes
/// and flags the (well-formed) packet: EoIB saw IPX or a bad MAC, and a CI run saw
/// an expert-info error on a SEND-with-immediate packet. They are all off for
/// every read: what is checked is the RoCEv2 framing, not a guess at the
/// encrypted payload.
const PAYLOAD_HEURISTICS: &[&str] = &[
    "mellanox_eoib",
    "eth_over_ib",
    "fc_infiniband",
    "iser_infiniband",
    "lnet_ib",
    "nvme_rdma",
    "rpcrdma_infiniband",
    "sdp_infiniband",
    "smb_direct_infiniband",
    "smcr_infiniband",
];

/// Run `tshark -r pcap <args>` with [`PAYLOAD_HEURISTICS`] off; stdout.
fn tshark_read(pcap: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("tshark");
    for h in PAYLOAD_HEURISTICS {
        cmd.args(["--disable-heuristic", h]);
    }
    let out = cmd.arg("-r").arg(pcap).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

/// (GID IP, QPN, Q_Key) of both endpoints from a client report.
fn endpoints(r: &Value) -> HashMap<IpAddr, (u64, u64)> {
    ["server", "client"]
        .iter()
        .map(|who| {
            let e = &r["endpoints"][who];
            let gid: std::net::Ipv6Addr = e["gid"].as_str().unwrap().parse().unwrap();
            let ip = gid.to_ipv4_mapped().map_or(IpAddr::V6(gid), IpAddr::V4);
            (
                ip,
                (e["qpn"].as_u64().unwrap(), e["qkey"].as_u64().unwrap()),
            )
        })
        .collect()
}

/// Check the capture against the endpoints; returns the packet count.
fn check_capture(pcap: &Path, eps: &HashMap<IpAddr, (u64, u64)>) -> usize {
    // Header fields as Wireshark decodes them (default preferences: UDP 4791 is
    // the "rroce" port of the infiniband dissector).
    let fields = tshark_read(
        pcap,
        &[
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-e",
            "ip.src",
            "-e",
            "ipv6.src",
            "-e",
            "ip.dst",
            "-e",
            "ipv6.dst",
            "-e",
            "udp.dstport",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.p_key",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.deth.q_key",
            "-e",
            "infiniband.deth.srcqp",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
            "-e",
            "frame.number",
        ],
    );
    let mut n = 0;
    for line in fields.lines() {
        let f: Vec<&str> = line.split(';').collect();
        assert_eq!(f.len(), 13, "{line}");
        let src: IpAddr = format!("{}{}", f[0], f[1]).parse().unwrap();
        let dst: IpAddr = format!("{}{}", f[2], f[3]).parse().unwrap();
        let (src_qpn, qkey) = eps[&src];
        let (dst_qpn, _) = eps[&dst];
        assert_eq!(f[4], "4791", "{line}");
        assert!(
            ["100", "101"].contains(&f[5]),
            "not UD SEND only (+imm): {line}"
        );
        assert_eq!(num(f[6]), 0xFFFF, "P_Key: {line}");
        assert_eq!(num(f[7]), dst_qpn, "BTH DestQP: {line}");
        assert_eq!(num(f[8]), qkey, "DETH Q_Key: {line}");
        assert_eq!(num(f[9]), src_qpn, "DETH SrcQP: {line}");
        let flagged = !f[10].is_empty()
            || f[11]
                .split(',')
                .filter(|s| !s.is_empty())
                .any(|sev| num(sev) >= PI_ERROR);
        if flagged {
            // Name what Wireshark objected to: the whole decode of that frame.
            let filter = format!("frame.number == {}", f[12]);
            let decode = tshark_read(pcap, &["-V", "-Y", &filter]);
            panic!("malformed or expert-info error: {line}\n{decode}");
        }
        n += 1;
    }
    assert!(n > 20, "only {n} packets captured:\n{fields}");

    // Expert info: with the payload guesses off (see `tshark_read`), none at all.
    let expert = tshark_read(pcap, &["-q", "-z", "expert"]);
    assert!(expert.trim().is_empty(), "expert info:\n{expert}");

    // A full decode of the first packet, for the record.
    let first = tshark_read(pcap, &["-V", "-c", "1", "-O", "infiniband"]);
    eprintln!("{first}");
    for needle in [
        "InfiniBand",
        "Base Transport Header",
        "Unreliable Datagram (UD) - SEND only",
        "DETH - Datagram Extended Transport Header",
        "Invariant CRC",
    ] {
        assert!(first.contains(needle), "`{needle}` missing:\n{first}");
    }
    assert_eq!(check_icrcs(pcap), n);
    n
}

/// Recompute the ICRC of every packet in a classic pcap (Ethernet link type)
/// from its wire bytes; returns how many were checked.
fn check_icrcs(pcap: &Path) -> usize {
    let b = std::fs::read(pcap).unwrap();
    assert_eq!(&b[..4], &0xa1b2_c3d4u32.to_le_bytes(), "little-endian pcap");
    assert_eq!(
        u32::from_le_bytes(b[20..24].try_into().unwrap()),
        1,
        "Ethernet link type"
    );
    let (mut at, mut n) = (24, 0);
    while at + 16 <= b.len() {
        let caplen = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &b[at + 16..at + 16 + caplen];
        at += 16 + caplen;
        let ip = &frame[14..];
        let (mut hdr, udp) = match ip[0] >> 4 {
            4 => {
                let ihl = usize::from(ip[0] & 0xf) * 4;
                let mut h = ip[..ihl].to_vec();
                h[1] = 0xff; // TOS
                h[8] = 0xff; // TTL
                h[10] = 0xff; // header checksum
                h[11] = 0xff;
                (h, &ip[ihl..])
            }
            6 => {
                let mut h = ip[..40].to_vec();
                h[0] |= 0x0f; // traffic class + flow label
                h[1] = 0xff;
                h[2] = 0xff;
                h[3] = 0xff;
                h[7] = 0xff; // hop limit
                (h, &ip[40..])
            }
            v => panic!("IP version {v}"),
        };
        let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
        let udp = &udp[..udp_len];
        let mut u = udp[..8].to_vec();
        u[6] = 0xff; // UDP checksum
        u[7] = 0xff;
        let roce = &udp[8..];
        let (body, tail) = roce.split_at(roce.len() - 4);
        let mut bth = body[..12].to_vec();
        bth[4] = 0xff; // FECN, BECN, reserved
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        h.update(&hdr);
        h.update(&u);
        h.update(&bth);
        h.update(&body[12..]);
        assert_eq!(
            h.finalize(),
            u32::from_le_bytes(tail.try_into().unwrap()),
            "ICRC of captured packet {n}"
        );
        hdr.clear();
        n += 1;
    }
    n
}

#[test]
fn tshark_decodes_rocev2_ipv4_loopback() {
    require_root_and(&["tshark"]);
    let dir = TempDir::new("tshark4");
    let pcap = dir.path("soft.pcap");
    let mut report = None;
    capture(
        None,
        "lo",
        "udp port 4791 and host 127.0.0.51",
        &pcap,
        || {
            let out = qr()
                .env(GSO_ENV, "1")
                .args([
                    "demo",
                    "--provider",
                    "soft",
                    "--json",
                    "--bytes",
                    "256K",
                    "--pings",
                    "20",
                    "--server-ip",
                    "127.0.0.51",
                    "--client-ip",
                    "127.0.0.52",
                ])
                .output()
                .unwrap();
            report = Some(json_of("qr demo --provider soft", &out));
        },
    );
    let r = report.unwrap();
    let n = check_capture(&pcap, &endpoints(&r));
    eprintln!("IPv4: {n} packets decoded as RoCEv2, all ICRCs recomputed");
}

#[test]
fn tshark_decodes_rocev2_ipv6_netns() {
    require_root_and(&["tshark", "ip"]);
    let ns = NetnsPair::new(203);
    let dir = TempDir::new("tshark6");
    let (pcap, cert) = (dir.path("soft.pcap"), dir.path("server.pem"));
    let veth = Command::new("ip")
        .args(["-n", &ns.a, "-o", "link", "show", "type", "veth"])
        .output()
        .unwrap();
    let veth = String::from_utf8(veth.stdout).unwrap();
    let veth = veth
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .split('@')
        .next()
        .unwrap()
        .to_string();
    let mut report = None;
    capture(Some(&ns.a), &veth, "udp port 4791", &pcap, || {
        let server = Guard::spawn(
            ns.qr(
                &ns.a,
                &[
                    "serve",
                    "--once",
                    "--json",
                    "--qpn",
                    "0xabcde",
                    "--ip",
                    &ns.v6[0],
                    "--cert-out",
                ],
            )
            .arg(&cert)
            .env(GSO_ENV, "1"),
        );
        common::wait_for_file(&cert, Duration::from_secs(10));
        let service = format!("[{}]:18515", ns.v6[0]);
        let out = ns
            .qr(
                &ns.b,
                &[
                    "connect", &service, "--bytes", "256K", "--pings", "20", "--json", "--cert",
                ],
            )
            .arg(&cert)
            .env(GSO_ENV, "1")
            .output()
            .unwrap();
        report = Some(json_of("qr connect", &out));
        let s = json_of("qr serve", &server.wait(Duration::from_secs(30)));
        assert_eq!(s["ok"], true);
    });
    let r = report.unwrap();
    // Distinct QPNs, so SrcQP and DestQP cannot be confused.
    assert_eq!(r["endpoints"]["server"]["qpn"], 0xabcde);
    assert_ne!(r["endpoints"]["client"]["qpn"], 0xabcde);
    let n = check_capture(&pcap, &endpoints(&r));
    eprintln!("IPv6: {n} packets decoded as RoCEv2, all ICRCs recomputed");
}
