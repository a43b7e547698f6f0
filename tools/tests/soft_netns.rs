//! `soft` between two network namespaces this test creates (a veth pair, MTU
//! 9000), over IPv4 GIDs and over IPv6 GIDs: `qr serve` in one namespace, `qr
//! connect` in the other, 256 MiB with sha256 compared. Needs root and iproute2
//! (fails with a message otherwise); all traffic stays inside the namespaces.

mod common;

use std::time::{Duration, Instant};

use common::{check_soft_report, json_of, require_root_and, Guard, NetnsPair, TempDir};
use serde_json::Value;

fn transfer_between_namespaces(net: u8, ipv6: bool) {
    require_root_and(&["ip"]);
    let t = Instant::now();
    let ns = NetnsPair::new(net);
    let dir = TempDir::new("netns");
    let cert = dir.path("server.der");
    let [server_ip, client_ip] = if ipv6 { &ns.v6 } else { &ns.v4 };
    let service = if ipv6 {
        format!("[{server_ip}]:18515")
    } else {
        format!("{server_ip}:18515")
    };
    let server = Guard::spawn(
        ns.qr(
            &ns.a,
            &["serve", "--once", "--json", "--ip", server_ip, "--cert-out"],
        )
        .arg(&cert),
    );
    common::wait_for_file(&cert, Duration::from_secs(10));
    let out = ns
        .qr(
            &ns.b,
            &[
                "connect", &service, "--bytes", "256M", "--pings", "200", "--json", "--cert",
            ],
        )
        .arg(&cert)
        .output()
        .unwrap();
    let r = json_of("qr connect in the client namespace", &out);
    check_soft_report(&r, 256 << 20);
    let gid = |ip: &str| {
        if ipv6 {
            ip.to_string()
        } else {
            format!("::ffff:{ip}")
        }
    };
    assert_eq!(r["endpoints"]["server"]["gid"], gid(server_ip).as_str());
    // The client's IP came from the route in its namespace.
    assert_eq!(r["endpoints"]["client"]["gid"], gid(client_ip).as_str());

    let out = server.wait(Duration::from_secs(30));
    let s = json_of("qr serve in the server namespace", &out);
    assert_eq!(s["ok"], true, "{s:#}");
    assert_eq!(s["bytes_received"], 256u64 << 20);
    assert_eq!(s["sha256_received"], r["transfer"]["sha256_sent"]);
    assert_eq!(s["client"]["gid"], gid(client_ip).as_str());
    assert_eq!(s["soft"]["rx_bad_icrc"], 0, "{s:#}");
    assert_eq!(s["soft"]["rx_decode_errors"], 0, "{s:#}");
    assert_ne!(s["socket"], Value::Null);
    eprintln!(
        "netns {}: 256 MiB at {:.3} Gbit/s, test {:.1} s",
        if ipv6 { "IPv6" } else { "IPv4" },
        r["transfer"]["gbit_per_s"].as_f64().unwrap(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn netns_veth_ipv4_gids_256_mib() {
    transfer_between_namespaces(201, false);
}

#[test]
fn netns_veth_ipv6_gids_256_mib() {
    transfer_between_namespaces(202, true);
}
