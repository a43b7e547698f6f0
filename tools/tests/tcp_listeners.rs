//! Every TCP listener's defences (src/listener), attacked the way a stranger
//! on the network would: an idle-connection flood past the open-file limit and
//! past the connection cap must not lock out a real scrape, the accept loop
//! must outlive EMFILE, and a connection that never sends a request is closed
//! by the request timeout. Run against `qr serve --metrics` (one accept loop
//! serves every listener). Addresses 127.0.117.60-61, ports 19861-19864.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{http, wait_for_file, Guard, TempDir};
use quic_rdma_tools::prom_text;

/// `qr serve` on `ip` with its metrics on `metrics`, under `ulimit -n nofile`.
fn serve(
    ip: &str,
    service_port: u16,
    metrics: &str,
    nofile: u32,
    extra: &[&str],
    cert: &Path,
) -> Guard {
    let qr = env!("CARGO_BIN_EXE_qr");
    let mut argv = vec![
        "serve".to_string(),
        "--ip".into(),
        ip.into(),
        "--service-port".into(),
        service_port.to_string(),
        "--metrics".into(),
        metrics.into(),
        "--cert-out".into(),
        cert.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    // `ulimit` then `exec`: the limit applies to qr itself, nothing else.
    Guard::spawn(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(qr)
            .args(argv),
    )
}

fn wait_up(metrics: &str) {
    http::when_up(metrics, || http::get_ok(metrics, "/metrics"));
}

/// Open `n` connections that never send a byte.
fn idle_flood(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect()
}

fn value(text: &str, key: &str) -> f64 {
    prom_text::parse(text)
        .unwrap_or_else(|e| panic!("{e}:\n{text}"))
        .value(key)
        .unwrap_or_else(|| panic!("{key} missing:\n{text}"))
}

#[test]
fn an_idle_flood_past_the_open_file_limit_does_not_lock_out_a_scrape() {
    let dir = TempDir::new("tcp-emfile");
    let cert = dir.path("serve.der");
    let metrics = "127.0.117.60:19862";
    let _serve = serve("127.0.117.60", 19861, metrics, 96, &[], &cert);
    wait_for_file(&cert, Duration::from_secs(20));
    wait_up(metrics);
    // 400 idle connections against 96 descriptors: accept fails with EMFILE
    // long before the cap (512) is reached.
    let flood = idle_flood(metrics, 400);
    assert!(flood.len() > 300, "only {} connected", flood.len());
    let t0 = Instant::now();
    let (code, body) = http::get(metrics, "/metrics").expect("a scrape during the flood");
    let took = t0.elapsed();
    assert_eq!(code, 200, "{body}");
    assert!(took < Duration::from_secs(3), "the scrape took {took:?}");
    // The flood did hit the limit, and idle connections made room.
    assert!(value(&body, "qr_tcp_accept_errors_total{listener=\"http\"}") > 0.0);
    assert!(value(&body, "qr_tcp_connections_evicted_total{listener=\"http\"}") > 0.0);
    // The listener is still accepting after the flood ends.
    drop(flood);
    std::thread::sleep(Duration::from_millis(200));
    let again = http::get_ok(metrics, "/metrics").expect("a scrape after the flood");
    assert!(
        value(
            &again,
            "qr_tcp_connections_accepted_total{listener=\"http\"}"
        ) > 96.0
    );
    eprintln!("scrape during a 400-connection flood at ulimit -n 96: {took:?}");
}

#[test]
fn an_idle_flood_past_the_cap_evicts_the_idle_and_the_request_timeout_closes_them() {
    let dir = TempDir::new("tcp-cap");
    let cert = dir.path("serve.der");
    let metrics = "127.0.117.61:19864";
    let _serve = serve(
        "127.0.117.61",
        19863,
        metrics,
        1024,
        &["--tcp-max-connections", "16", "--tcp-request-timeout", "1s"],
        &cert,
    );
    wait_for_file(&cert, Duration::from_secs(20));
    wait_up(metrics);
    let mut flood = idle_flood(metrics, 100);
    let t0 = Instant::now();
    let (code, body) = http::get(metrics, "/metrics").expect("a scrape during the flood");
    assert_eq!(code, 200, "{body}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let evicted = value(&body, "qr_tcp_connections_evicted_total{listener=\"http\"}");
    assert!(evicted >= 80.0, "{evicted} evicted:\n{body}");
    assert!(value(&body, "qr_tcp_connections_open{listener=\"http\"}") <= 16.0);
    // The newest idle connections kept their slots; each is closed by the
    // server once the request timeout passes without a request.
    let last = flood.last_mut().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t1 = Instant::now();
    let n = last
        .read(&mut [0u8; 16])
        .expect("closed, not timed out on our side");
    assert_eq!(n, 0);
    assert!(t1.elapsed() < Duration::from_secs(3), "{:?}", t1.elapsed());
    let after = http::get_ok(metrics, "/metrics").unwrap();
    assert!(
        value(
            &after,
            "qr_tcp_connections_timed_out_total{listener=\"http\"}"
        ) >= 1.0
    );
}
