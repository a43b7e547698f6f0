//! `qr serve --metrics` and `qr stats`: scraped during a transfer over `soft`
//! between processes, every scrape is valid Prometheus text and the socket,
//! provider and quinn counters move; `qr stats` reports their rates.
//! A bearer token, when set, is required of every scrape. `--retry always`
//! answers a client's first attempt with a Retry, counted, and it still gets in.
//! Addresses 127.0.116.40-44, ports 19811-19816.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{json_of, qr, wait_for_file, Guard, TempDir};
use quic_rdma::counters::Counters;
use quic_rdma_tools::prom_text;
use serde_json::Value;

const METRICS: &str = "127.0.116.40:19812";

fn scrape() -> Option<String> {
    common::http::get_ok(METRICS, "/metrics")
}

#[test]
fn serve_metrics_move_during_a_transfer_and_qr_stats_shows_rates() {
    let dir = TempDir::new("serve-metrics");
    let cert = dir.path("serve.der");
    let _serve = Guard::spawn(qr().args([
        "serve",
        "--ip",
        "127.0.116.40",
        "--service-port",
        "19811",
        "--metrics",
        METRICS,
        "--cert-out",
        cert.to_str().unwrap(),
    ]));
    wait_for_file(&cert, Duration::from_secs(20));
    let idle = common::http::when_up(METRICS, scrape);
    common::promtool_check("serve", &idle);
    let idle = prom_text::parse(&idle).unwrap();
    // Every value the endpoint's visitors list is on the page, typed as its
    // kind says (the coverage check of `metric`'s tests, on a live page).
    let visitors: [(&str, &dyn Counters); 4] = [
        ("qr_socket", &quic_rdma::socket::SocketStats::default()),
        ("qr_socket", &quic_rdma::quic::RoutingStats::default()),
        ("qr_peers", &quic_rdma::quic::PeerStats::default()),
        ("qr_soft", &quic_rdma::fabric::soft::SoftStats::default()),
    ];
    for (prefix, c) in visitors {
        let mut n = 0;
        c.visit(&mut |m| {
            n += 1;
            let (name, ty) = quic_rdma_tools::metric::exposed(prefix, &m);
            assert_eq!(idle.type_of(&name), Some(ty), "{name}");
            assert!(idle.value(&name).is_some(), "{name} has no sample");
        });
        assert!(n > 0, "{prefix}: nothing visited");
    }
    assert_eq!(idle.value("qr_quinn_connections_open"), Some(0.0));
    assert_eq!(idle.type_of("qr_socket_recv_wrs_total"), Some("counter"));

    // Scrape in the background while the client runs.
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(t) = scrape() {
                    got.push(t);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            got
        })
    };
    let stats = Guard::spawn(qr().args([
        "stats",
        METRICS,
        "--interval",
        "200ms",
        "--count",
        "8",
        "--json",
    ]));
    let client = Guard::spawn(qr().args([
        "connect",
        "127.0.116.40:19811",
        "--cert",
        cert.to_str().unwrap(),
        "--ip",
        "127.0.116.41",
        "--bytes",
        "256M",
        "--pings",
        "5000",
        "--json",
    ]))
    .wait(Duration::from_secs(120));
    let report = json_of("qr connect", &client);
    assert_eq!(report["transfer"]["sha256_match"], true, "{report:#}");
    let stats = stats.wait(Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    let scrapes = scraper.join().unwrap();

    // Every scrape is valid Prometheus text; the receive counter moved between
    // scrapes while the connection was open.
    let parsed: Vec<_> = scrapes
        .iter()
        .map(|t| prom_text::parse(t).unwrap_or_else(|e| panic!("{e}:\n{t}")))
        .collect();
    let during = parsed
        .iter()
        .filter(|e| e.value("qr_quinn_connections_open") == Some(1.0))
        .count();
    assert!(during >= 2, "{during} scrapes saw the connection open");
    let recv: Vec<f64> = parsed
        .iter()
        .map(|e| e.value("qr_socket_recv_wrs_total").unwrap())
        .collect();
    assert!(
        recv.windows(2).all(|w| w[1] >= w[0]),
        "a counter went down: {recv:?}"
    );
    let rises = recv.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        rises >= 2,
        "the receive counter rose between scrapes only {rises} times: {recv:?}"
    );
    let last = parsed.last().unwrap();
    assert!(last.value("qr_quinn_udp_rx_bytes_total").unwrap() >= (256u64 << 20) as f64);
    assert!(last.value("qr_soft_rx_datagrams_total").unwrap() >= ((256u64 << 20) / 4096) as f64);
    assert_eq!(last.value("qr_quinn_connections_total"), Some(1.0));

    // qr stats: one JSON object per interval, with rates of the moving counters.
    let out = String::from_utf8_lossy(&stats.stdout);
    assert!(
        stats.status.success(),
        "qr stats: {}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8, "{out}");
    let moving = lines
        .iter()
        .filter(|l| {
            l["rates"]["qr_socket_recv_wrs_total"]
                .as_f64()
                .unwrap_or(0.0)
                > 0.0
        })
        .count();
    assert!(moving >= 1, "no interval showed the receive rate:\n{out}");
}

#[test]
fn metrics_with_a_token_file_answer_only_requests_that_carry_it() {
    let dir = TempDir::new("serve-metrics-token");
    let cert = dir.path("serve.der");
    let token = dir.path("token");
    std::fs::write(&token, "t0ken-of-the-scraper\n").unwrap();
    let metrics = "127.0.116.42:19814";
    let _serve = Guard::spawn(qr().args([
        "serve",
        "--ip",
        "127.0.116.42",
        "--service-port",
        "19813",
        "--metrics",
        metrics,
        "--metrics-token-file",
        token.to_str().unwrap(),
        "--cert-out",
        cert.to_str().unwrap(),
    ]));
    wait_for_file(&cert, Duration::from_secs(20));
    let refused = common::http::when_up(metrics, || common::http::get(metrics, "/metrics").ok());
    assert_eq!(refused.0, 401, "{}", refused.1);
    assert!(!refused.1.contains("qr_socket"), "{}", refused.1);
    for wrong in [
        "Authorization: Bearer guess\r\n",
        "Authorization: t0ken-of-the-scraper\r\n",
    ] {
        assert_eq!(
            common::http::get_with(metrics, "/metrics", wrong)
                .unwrap()
                .0,
            401
        );
    }
    let (code, body) = common::http::get_with(
        metrics,
        "/metrics",
        "Authorization: Bearer t0ken-of-the-scraper\r\n",
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(prom_text::parse(&body)
        .unwrap()
        .value("qr_quinn_connections_open")
        .is_some());
    // `qr stats` with the token reads it; without, it fails naming the 401.
    let ok = Guard::spawn(qr().args([
        "stats",
        metrics,
        "--interval",
        "100ms",
        "--count",
        "1",
        "--token-file",
        token.to_str().unwrap(),
    ]))
    .wait(Duration::from_secs(30));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let no =
        Guard::spawn(qr().args(["stats", metrics, "--count", "1"])).wait(Duration::from_secs(30));
    assert_eq!(no.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&no.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&no.stderr)
    );
}

#[test]
fn retry_always_is_counted_and_the_client_still_connects() {
    let dir = TempDir::new("serve-metrics-retry");
    let cert = dir.path("serve.der");
    let metrics = "127.0.116.43:19816";
    let _serve = Guard::spawn(qr().args([
        "serve",
        "--ip",
        "127.0.116.43",
        "--service-port",
        "19815",
        "--metrics",
        metrics,
        "--retry",
        "always",
        "--cert-out",
        cert.to_str().unwrap(),
    ]));
    wait_for_file(&cert, Duration::from_secs(20));
    let scrape = || common::http::get_ok(metrics, "/metrics");
    let idle = prom_text::parse(&common::http::when_up(metrics, scrape)).unwrap();
    for (name, kind) in [
        ("qr_quinn_retries_total", "counter"),
        ("qr_quinn_unvalidated_handshakes", "gauge"),
        ("qr_peers_unvalidated", "gauge"),
        ("qr_peers_unvalidated_limit", "gauge"),
        ("qr_peers_evicted_unvalidated_total", "counter"),
        ("qr_peers_expired_unvalidated_total", "counter"),
        ("qr_peers_amplification_drops_total", "counter"),
    ] {
        assert_eq!(idle.type_of(name), Some(kind), "{name}");
    }
    assert_eq!(idle.value("qr_quinn_retries_total"), Some(0.0));
    let client = Guard::spawn(qr().args([
        "connect",
        "127.0.116.43:19815",
        "--cert",
        cert.to_str().unwrap(),
        "--ip",
        "127.0.116.44",
        "--bytes",
        "1M",
        "--pings",
        "10",
        "--json",
    ]))
    .wait(Duration::from_secs(60));
    let report = json_of("qr connect", &client);
    assert_eq!(report["transfer"]["sha256_match"], true, "{report:#}");
    let after = prom_text::parse(&scrape().unwrap()).unwrap();
    assert_eq!(after.value("qr_quinn_retries_total"), Some(1.0));
    assert_eq!(after.value("qr_quinn_connections_total"), Some(1.0));
    assert_eq!(after.value("qr_quinn_unvalidated_handshakes"), Some(0.0));
}
