//! `qr devices`: every provider and device this host offers, with the fix
//! for each misconfiguration that would stop QUIC from running over it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::ExitCode;

use quic_rdma::fabric::Mtu;
use quic_rdma::socket::segment::{datagram_mtu, parts_for};
use serde::Serialize;

/// QUIC's smallest datagram (RFC 9000 §14): a path must carry at least this.
const QUIC_MIN: usize = 1200;

/// What QUIC runs at over a RoCE MTU of `roce` bytes, and how: the datagram
/// size the socket offers (above `roce` when it segments, docs/architecture.md
/// §6) and, when segmented, a note saying so with the way to avoid it.
fn quic_over(roce: usize, netdev: Option<&str>) -> (usize, Option<String>) {
    let quic = datagram_mtu(roce);
    let note = (quic > roce).then(|| {
        format!(
            "RoCE MTU {roce}: each QUIC datagram ({quic} bytes) travels as {} RoCEv2 \
             packets (segmentation); jumbo frames (`ip link set {} mtu 9000`, RoCE MTU 4096) \
             carry it whole",
            parts_for(quic, roce),
            netdev.unwrap_or("<if>")
        )
    });
    (quic, note)
}

/// Options of `qr devices`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct DevicesArgs {
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

/// Everything `qr devices` found.
#[derive(Debug, Serialize)]
struct Devices {
    verbs: Verbs,
    soft: Vec<SoftInterface>,
}

/// The `verbs` provider: its devices, or why there are none.
#[derive(Debug, Serialize)]
struct Verbs {
    built_in: bool,
    devices: Vec<VerbsDevice>,
    /// Why no device is listed, with the fix.
    problem: Option<String>,
}

#[derive(Debug, Serialize)]
struct VerbsDevice {
    name: String,
    guid: String,
    fw_ver: String,
    max_qp: u32,
    max_qp_wr: u32,
    max_cqe: u32,
    max_sge: u32,
    max_inline_ud: Option<u32>,
    ports: Vec<VerbsPort>,
}

#[derive(Debug, Serialize)]
struct VerbsPort {
    port: u8,
    state: String,
    link_layer: String,
    active_mtu: Option<usize>,
    max_mtu: Option<usize>,
    /// The QUIC datagram size over the active MTU (larger when segmented).
    quic_mtu: Option<usize>,
    gids: Vec<GidRow>,
    /// Misconfigurations found, each with its fix.
    problems: Vec<String>,
    /// How QUIC runs here when it runs differently (segmented), with the
    /// way to avoid it.
    notes: Vec<String>,
}

#[derive(Debug, Serialize)]
struct GidRow {
    index: u32,
    gid: String,
    /// "RoCE v2", "RoCE v1/IB" or "unknown".
    kind: String,
    /// "IPv4" (IPv4-mapped) or "IPv6".
    family: String,
    netdev: Option<String>,
}

/// One interface a `soft` endpoint could bind.
#[derive(Debug, Serialize)]
struct SoftInterface {
    name: String,
    addresses: Vec<String>,
    netdev_mtu: Option<usize>,
    /// The largest RoCE MTU whose packets fit the interface.
    roce_mtu: Option<usize>,
    /// The QUIC datagram size over it: the RoCE MTU, or more when segmented.
    quic_mtu: Option<usize>,
    /// Whether QUIC runs over it (a QUIC datagram of at least 1200 bytes).
    quic_ok: bool,
    /// Whether QUIC datagrams go as several RoCEv2 packets each.
    segmented: bool,
    problem: Option<String>,
    note: Option<String>,
}

/// Run `qr devices`.
pub(crate) fn main(args: &DevicesArgs) -> ExitCode {
    let d = Devices {
        verbs: verbs(),
        soft: soft(),
    };
    if args.json {
        match serde_json::to_string_pretty(&d) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("qr devices: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", human(&d));
    }
    ExitCode::SUCCESS
}

#[cfg(feature = "verbs")]
fn verbs() -> Verbs {
    use quic_rdma::fabric::verbs::{describe_devices, GidKind};
    use quic_rdma::fabric::FabricError;
    match describe_devices() {
        Ok(list) => Verbs {
            built_in: true,
            problem: None,
            devices: list
                .into_iter()
                .map(|d| VerbsDevice {
                    guid: format!("{:#018x}", d.guid),
                    fw_ver: d.fw_ver,
                    max_qp: d.max_qp,
                    max_qp_wr: d.max_qp_wr,
                    max_cqe: d.max_cqe,
                    max_sge: d.max_sge,
                    max_inline_ud: d.max_inline_ud,
                    ports: d
                        .ports
                        .into_iter()
                        .map(|p| {
                            let netdevs: BTreeMap<u32, String> = p.netdevs.into_iter().collect();
                            let gids: Vec<GidRow> = p
                                .gids
                                .iter()
                                .map(|g| GidRow {
                                    index: g.index,
                                    gid: g.gid.to_string(),
                                    kind: match g.kind {
                                        GidKind::RoceV2 => "RoCE v2",
                                        GidKind::RoceV1OrIb => "RoCE v1/IB",
                                        _ => "unknown",
                                    }
                                    .into(),
                                    family: if g.gid.to_ip().is_ipv4() {
                                        "IPv4"
                                    } else {
                                        "IPv6"
                                    }
                                    .into(),
                                    netdev: netdevs.get(&g.index).cloned(),
                                })
                                .collect();
                            let mut port = VerbsPort {
                                port: p.port,
                                state: p.state.into(),
                                link_layer: p.link_layer.into(),
                                active_mtu: p.active_mtu.map(Mtu::bytes),
                                max_mtu: p.max_mtu.map(Mtu::bytes),
                                quic_mtu: p.active_mtu.map(|m| datagram_mtu(m.bytes())),
                                gids,
                                problems: Vec::new(),
                                notes: Vec::new(),
                            };
                            (port.problems, port.notes) = port_problems(&d.name, &port);
                            port
                        })
                        .collect(),
                    name: d.name,
                })
                .collect(),
        },
        Err(FabricError::NoDevice { detail }) => Verbs {
            built_in: true,
            devices: Vec::new(),
            problem: Some(format!(
                "no RDMA device ({detail}). Fix: load the NIC's driver; without a RoCE NIC use \
                 kernel soft-RoCE (`modprobe rdma_rxe; rdma link add rxe0 type rxe netdev <if>`) \
                 or the userspace provider (`--provider soft`)"
            )),
        },
        Err(e) => Verbs {
            built_in: true,
            devices: Vec::new(),
            problem: Some(format!("listing RDMA devices failed: {e}")),
        },
    }
}

#[cfg(not(feature = "verbs"))]
fn verbs() -> Verbs {
    Verbs {
        built_in: false,
        devices: Vec::new(),
        problem: Some(
            "this qr was built without the `verbs` provider (cargo feature `verbs`; needs \
             libibverbs-dev librdmacm-dev libclang-dev); without it use `--provider soft`"
                .into(),
        ),
    }
}

/// What would stop QUIC on `port`, each with its fix; and notes on how it
/// runs (segmented below 2048).
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
fn port_problems(dev: &str, p: &VerbsPort) -> (Vec<String>, Vec<String>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    if p.state != "ACTIVE" {
        out.push(format!(
            "{dev} port {} is {}: bring its netdev up (`ip link set <if> up`)",
            p.port, p.state
        ));
    }
    if let Some(m) = p.active_mtu {
        let nd = p.gids.iter().find_map(|g| g.netdev.clone());
        let (quic, note) = quic_over(m, nd.as_deref());
        if quic < QUIC_MIN {
            out.push(format!(
                "active MTU {m} is below QUIC's {QUIC_MIN}-byte minimum: enable jumbo frames \
                 (`ip link set {} mtu 9000`, giving RoCE MTU 4096)",
                nd.as_deref().unwrap_or("<if>")
            ));
        }
        notes.extend(note);
    }
    if p.link_layer == "Ethernet" && !p.gids.iter().any(|g| g.kind == "RoCE v2") {
        out.push(
            "no RoCE v2 GID: give the netdev an IP address (RoCEv2 GIDs are made from its \
             addresses), or pick a RoCE v2 GID index"
                .into(),
        );
    } else if p.gids.iter().any(|g| g.kind == "RoCE v1/IB") {
        out.push(
            "some GIDs are RoCE v1: quic-rdma speaks RoCE v2 only (UDP 4791); it picks a \
             RoCE v2 entry, so choose a RoCE v2 GID index if you set one"
                .into(),
        );
    }
    (out, notes)
}

/// Interfaces with their addresses, MTU and what RoCE MTU they allow.
fn soft() -> Vec<SoftInterface> {
    let mut by_name: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    for i in if_addrs::get_if_addrs().unwrap_or_default() {
        by_name.entry(i.name.clone()).or_default().push(i.ip());
    }
    by_name
        .into_iter()
        .map(|(name, addrs)| {
            let netdev_mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok());
            soft_row(name, &addrs, netdev_mtu)
        })
        .collect()
}

/// What `soft` would run at on interface `name` of MTU `netdev_mtu`: the RoCE
/// MTU kernel rxe would take, and QUIC over it (segmented below 2048).
fn soft_row(name: String, addrs: &[IpAddr], netdev_mtu: Option<usize>) -> SoftInterface {
    let roce = netdev_mtu.and_then(Mtu::for_netdev).map(Mtu::bytes);
    let (quic_mtu, note) = match roce {
        Some(r) => {
            let (q, n) = quic_over(r, Some(&name));
            (Some(q), n)
        }
        None => (None, None),
    };
    let quic_ok = quic_mtu.is_some_and(|m| m >= QUIC_MIN);
    let problem = match (netdev_mtu, roce) {
        (None, _) => Some("MTU unknown (no /sys/class/net entry)".to_string()),
        (Some(n), _) if !quic_ok => Some(format!(
            "netdev MTU {n} allows no RoCE MTU QUIC can run over: \
             `ip link set {name} mtu 9000` (RoCE MTU 4096)"
        )),
        _ => None,
    };
    SoftInterface {
        addresses: addrs.iter().map(IpAddr::to_string).collect(),
        name,
        netdev_mtu,
        roce_mtu: roce,
        quic_mtu,
        quic_ok,
        segmented: note.is_some(),
        problem,
        note,
    }
}

fn human(d: &Devices) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "verbs (libibverbs: RoCE NICs, kernel rxe)");
    if let Some(p) = &d.verbs.problem {
        let _ = writeln!(s, "  {p}");
    }
    for dev in &d.verbs.devices {
        let _ = writeln!(
            s,
            "  {}  guid {}  fw {}  max_qp {}  max_qp_wr {}  max_cqe {}  max_sge {}  max_inline(UD) {}",
            dev.name,
            dev.guid,
            if dev.fw_ver.is_empty() { "-" } else { &dev.fw_ver },
            dev.max_qp,
            dev.max_qp_wr,
            dev.max_cqe,
            dev.max_sge,
            dev.max_inline_ud.map_or("-".to_string(), |v| v.to_string())
        );
        for p in &dev.ports {
            let mtu = |m: Option<usize>| m.map_or("?".to_string(), |m| m.to_string());
            let _ = writeln!(
                s,
                "    port {}  {}  {}  active MTU {} (max {})",
                p.port,
                p.state,
                p.link_layer,
                mtu(p.active_mtu),
                mtu(p.max_mtu)
            );
            for n in &p.notes {
                let _ = writeln!(s, "      * {n}");
            }
            for g in &p.gids {
                let _ = writeln!(
                    s,
                    "      GID[{:>3}]  {:<40} {:<10} {:<4} {}",
                    g.index,
                    g.gid,
                    g.kind,
                    g.family,
                    g.netdev.as_deref().unwrap_or("-")
                );
            }
            for pr in &p.problems {
                let _ = writeln!(s, "      ! {pr}");
            }
        }
    }
    let _ = writeln!(
        s,
        "\nsoft (userspace RoCEv2 over UDP port 4791; --provider soft --ip ADDR)"
    );
    let _ = writeln!(
        s,
        "  {:<12} {:>7} {:>9}  {:<15} addresses",
        "interface", "MTU", "RoCE MTU", "QUIC"
    );
    for i in &d.soft {
        let opt = |m: Option<usize>| m.map_or("-".to_string(), |m| m.to_string());
        let _ = writeln!(
            s,
            "  {:<12} {:>7} {:>9}  {:<15} {}",
            i.name,
            opt(i.netdev_mtu),
            opt(i.roce_mtu),
            match (i.quic_ok, i.segmented) {
                (true, false) => "yes".to_string(),
                (true, true) => "yes, segmented".to_string(),
                (false, _) => "no".to_string(),
            },
            i.addresses.join(", ")
        );
        if let Some(p) = &i.problem {
            let _ = writeln!(s, "      ! {p}");
        }
        if let Some(n) = &i.note {
            let _ = writeln!(s, "      * {n}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, mtu: usize, gids: &[(&str, &str)]) -> VerbsPort {
        VerbsPort {
            port: 1,
            state: state.into(),
            link_layer: "Ethernet".into(),
            active_mtu: Some(mtu),
            max_mtu: Some(4096),
            quic_mtu: Some(datagram_mtu(mtu)),
            gids: gids
                .iter()
                .enumerate()
                .map(|(i, (gid, kind))| GidRow {
                    index: i as u32,
                    gid: gid.to_string(),
                    kind: kind.to_string(),
                    family: "IPv4".into(),
                    netdev: Some("eth9".into()),
                })
                .collect(),
            problems: Vec::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn misconfigurations_name_their_fix() {
        let ok = port("ACTIVE", 4096, &[("::ffff:10.0.0.1", "RoCE v2")]);
        assert_eq!(port_problems("rxe0", &ok), (vec![], vec![]));
        // rxe on a 1500-byte netdev: usable, segmented, with the way to avoid it.
        let small = port("ACTIVE", 1024, &[("::ffff:10.0.0.1", "RoCE v2")]);
        let (p, notes) = port_problems("rxe0", &small);
        assert!(p.is_empty(), "{p:?}");
        assert!(notes[0].contains("2040 bytes") && notes[0].contains("2 RoCEv2 packets"));
        assert!(notes[0].contains("ip link set eth9 mtu 9000"), "{notes:?}");
        let v1 = port("ACTIVE", 4096, &[("::ffff:10.0.0.1", "RoCE v1/IB")]);
        assert!(port_problems("rxe0", &v1).0[0].contains("no RoCE v2 GID"));
        let down = port("DOWN", 4096, &[("::ffff:10.0.0.1", "RoCE v2")]);
        assert!(port_problems("rxe0", &down).0[0].contains("is DOWN"));
    }

    #[test]
    fn a_1500_byte_link_is_usable_with_segmentation() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let eth = soft_row("eth0".into(), &[ip], Some(1500));
        assert_eq!((eth.roce_mtu, eth.quic_mtu), (Some(1024), Some(2040)));
        assert!(
            eth.quic_ok && eth.segmented && eth.problem.is_none(),
            "{eth:?}"
        );
        let d = Devices {
            verbs: verbs(),
            soft: vec![eth],
        };
        let text = human(&d);
        assert!(text.contains("yes, segmented"), "{text}");
        assert!(text.contains("ip link set eth0 mtu 9000"), "{text}");
        let jumbo = soft_row("eth1".into(), &[ip], Some(9000));
        assert!(jumbo.quic_ok && !jumbo.segmented && jumbo.note.is_none());
        let tiny = soft_row("eth2".into(), &[ip], Some(300));
        assert!(!tiny.quic_ok && tiny.problem.is_some());
    }

    /// On any Linux host: loopback is listed with its addresses and MTU, and
    /// the report is JSON a script can read back.
    #[test]
    fn loopback_is_listed_for_soft() {
        let d = Devices {
            verbs: verbs(),
            soft: soft(),
        };
        let lo = d.soft.iter().find(|i| i.name == "lo").expect("lo");
        assert!(lo.addresses.iter().any(|a| a == "127.0.0.1"), "{lo:?}");
        assert_eq!(lo.netdev_mtu, Some(65536));
        assert_eq!(lo.roce_mtu, Some(4096));
        assert!(lo.quic_ok);
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert!(!json["soft"].as_array().unwrap().is_empty());
        // This host has no RDMA (or no verbs build): said, with a fix.
        if d.verbs.devices.is_empty() {
            assert!(d.verbs.problem.as_deref().unwrap().contains("soft"));
        }
        assert!(human(&d).contains("soft (userspace RoCEv2"));
    }
}
