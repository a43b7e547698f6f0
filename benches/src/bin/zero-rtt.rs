//! `zero-rtt`: handshake-to-first-byte, full handshake against a resumed one
//! with 0-RTT (RFC 9001 §4.6), over `soft` on loopback (real RoCEv2 packets
//! on UDP) with two engines polled by one thread.
//!
//! ```text
//! zero-rtt [--iters N] [--json]
//! ```
//! Each iteration: the client connects, opens a stream and writes 64 bytes as
//! soon as the engine lets it (at once when resuming with 0-RTT, after
//! `Connected` otherwise); the time is from `connect` to the server reading
//! the first byte. Rounds alternate full / resumed so drift hits both alike.
//! The server's session tickets come from a first connection before timing.

use std::time::{Duration, Instant};

use quic_rdma::engine::{ConnHandle, Engine, EngineConfig, EngineError, Event};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{Mtu, DEFAULT_QKEY};
use quic_rdma::quic::{parse_certificates, parse_private_key, transport, TlsSettings};

const SERVER_IP: &str = "127.0.114.11";
const CLIENT_IP: &str = "127.0.114.12";

fn engine(ip: &str, tls: &TlsSettings, server: bool, key: u32) -> anyhow::Result<Engine<SoftQp>> {
    let port = SoftPort::open(SoftConfig {
        mtu: Mtu::M4096,
        ..SoftConfig::new(ip.parse()?)
    })
    .map_err(|e| anyhow::anyhow!("soft port on {ip}: {e}"))?;
    let qp = port.create_qp(DEFAULT_QKEY)?;
    let t = transport(4096);
    let mut cfg = EngineConfig {
        routing_key: key,
        ..EngineConfig::default()
    };
    if server {
        cfg.server = Some(tls.server_config(t)?);
    } else {
        cfg.client = Some(tls.client_config(t)?);
    }
    Ok(Engine::new(qp, cfg)?)
}

/// One connection: microseconds from `connect` to the server's first byte,
/// and whether the server accepted early data.
fn once(client: &mut Engine<SoftQp>, server: &mut Engine<SoftQp>) -> anyhow::Result<(f64, bool)> {
    let (mut cev, mut sev) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    let c: ConnHandle = client.connect(t0, server.local_addr(), "localhost")?;
    let mut stream = None;
    let mut first_byte = None;
    let mut buf = [0u8; 64];
    let deadline = t0 + Duration::from_secs(10);
    while first_byte.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "no first byte within 10 s");
        if stream.is_none() {
            // Succeeds before the handshake only with 0-RTT keys.
            match client.open_uni(c) {
                Ok(s) => {
                    anyhow::ensure!(client.write(c, s, &[7u8; 64])? == 64, "short write");
                    client.finish(c, s)?;
                    stream = Some(s);
                }
                Err(EngineError::WouldBlock) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let now = Instant::now();
        cev.clear();
        sev.clear();
        client.poll(now, &mut cev);
        server.poll(now, &mut sev);
        for e in &sev {
            if let Event::StreamOpened { conn, stream } | Event::StreamReadable { conn, stream } =
                *e
            {
                if let Ok(r) = server.read(conn, stream, &mut buf) {
                    if r.len > 0 && first_byte.is_none() {
                        first_byte = Some(Instant::now());
                    }
                }
            }
        }
    }
    let us = (first_byte.unwrap() - t0).as_secs_f64() * 1e6;
    // Let the handshake finish, then close and drain both sides.
    let until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < until {
        let now = Instant::now();
        client.poll(now, &mut cev);
        server.poll(now, &mut sev);
    }
    let accepted = client.zero_rtt(c)?.accepted;
    client.close(Instant::now(), c, 0, b"done")?;
    let until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < until {
        let now = Instant::now();
        client.poll(now, &mut cev);
        server.poll(now, &mut sev);
    }
    Ok((us, accepted))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let mut iters = 200usize;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => {
                iters = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--iters N"))?
                    .parse()?
            }
            "--json" => json = true,
            other => anyhow::bail!("unknown argument {other}: zero-rtt [--iters N] [--json]"),
        }
    }
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let tls = |accept_0rtt| -> anyhow::Result<TlsSettings> {
        Ok(TlsSettings {
            identity: Some((
                parse_certificates(ck.cert.der())?,
                parse_private_key(&ck.key_pair.serialize_der())?,
            )),
            roots: parse_certificates(ck.cert.der())?,
            alpn: vec![b"qr-bench/1".to_vec()],
            accept_0rtt,
            ..TlsSettings::default()
        })
    };
    // Two servers: one allows 0-RTT (resumed rounds), one does not (full rounds).
    let with = tls(true)?;
    let without = tls(false)?;
    let mut s0rtt = engine(SERVER_IP, &with, true, 0x111)?;
    let mut sfull = engine("127.0.114.13", &without, true, 0x113)?;
    let mut c0rtt = engine(CLIENT_IP, &with, false, 0x112)?;
    let mut cfull = engine("127.0.114.14", &without, false, 0x114)?;
    // Tickets for the resumed rounds; a warm-up for both.
    once(&mut c0rtt, &mut s0rtt)?;
    once(&mut cfull, &mut sfull)?;
    let (mut full, mut resumed) = (Vec::new(), Vec::new());
    let mut accepted = 0;
    for _ in 0..iters {
        full.push(once(&mut cfull, &mut sfull)?.0);
        let (us, a) = once(&mut c0rtt, &mut s0rtt)?;
        resumed.push(us);
        accepted += usize::from(a);
    }
    let (fp50, fp99) = (percentile(&mut full, 0.5), percentile(&mut full, 0.99));
    let (rp50, rp99) = (
        percentile(&mut resumed, 0.5),
        percentile(&mut resumed, 0.99),
    );
    if json {
        println!(
            "{{\"iters\":{iters},\"full_p50_us\":{fp50:.1},\"full_p99_us\":{fp99:.1},\
             \"resumed_p50_us\":{rp50:.1},\"resumed_p99_us\":{rp99:.1},\"accepted_0rtt\":{accepted}}}"
        );
    } else {
        println!("handshake-to-first-byte over soft (loopback), {iters} rounds each, interleaved");
        println!("  full handshake     p50 {fp50:8.1} us   p99 {fp99:8.1} us");
        println!("  resumed with 0-RTT p50 {rp50:8.1} us   p99 {rp99:8.1} us   ({accepted}/{iters} accepted)");
        println!("  ratio resumed/full p50 {:.2}", rp50 / fp50);
    }
    anyhow::ensure!(
        accepted == iters,
        "0-RTT accepted in {accepted} of {iters} resumed rounds"
    );
    Ok(())
}
