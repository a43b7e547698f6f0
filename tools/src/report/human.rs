//! `qr`'s reports as text for a terminal: the client's [`Report`] as a summary
//! and a table of counters (client and server side by side), the server's
//! [`ServeSummary`] as one line per connection. The JSON is in `schema.rs`.

use std::fmt;

use quic_rdma::counters::Counters;
use quic_rdma::fabric::soft::SoftStats;
use quic_rdma::quic::RoutingStats;
use quic_rdma::socket::SocketStats;

use super::schema::{CounterReport, Report, ServeSummary};

/// A counter's name as a row label: words apart, acronyms in capitals as
/// the RDMA and IP specifications write them (`rx_bad_icrc`: "rx bad ICRC").
fn label(name: &str) -> String {
    name.split('_')
        .map(|w| match w {
            "ipv4" => "IPv4".to_string(),
            "ah" | "bth" | "gid" | "grh" | "gso" | "icrc" | "id" | "mtu" | "qp" | "qpn" => {
                w.to_uppercase()
            }
            _ => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One row per value `shape` visits (zero-valued structs: only the names
/// matter), client `c` beside server `s`: the rows follow the visitor, so a
/// counter added there is shown with no row to add here. Ungrouped values
/// first, then each group under its total; fractional values (ratios) with
/// two decimals.
fn counter_rows(
    f: &mut fmt::Formatter<'_>,
    shape: &[&dyn Counters],
    c: &CounterReport,
    s: Option<&CounterReport>,
) -> fmt::Result {
    let mut names: Vec<(Option<&str>, &str)> = Vec::new();
    for v in shape {
        v.visit(&mut |m| names.push((m.group, m.name)));
    }
    // Stable: visiting order within a group is kept.
    names.sort_by_key(|(g, _)| *g);
    let cell = |v: Option<f64>| match v {
        None => format!("{:>12}", "-"),
        Some(v) if v.fract() != 0.0 => format!("{v:>12.2}"),
        Some(v) => format!("{v:>12}"),
    };
    let mut group = None;
    for (g, name) in names {
        if let Some(gn) = g.filter(|_| g != group) {
            let label = format!("{gn} (total)");
            let total = |r: &CounterReport| r.group_total(gn) as f64;
            writeln!(
                f,
                "    {label:<28} {}    {}",
                cell(Some(total(c))),
                cell(s.map(total))
            )?;
            group = g;
        }
        let label = format!("{}{}", if g.is_some() { "  " } else { "" }, label(name));
        let get = |r: &CounterReport| r.get(g, name);
        writeln!(
            f,
            "    {label:<28} {}    {}",
            cell(Some(get(c))),
            cell(s.map(get))
        )?;
    }
    Ok(())
}

/// `n` bytes in the largest binary unit that keeps it readable.
fn size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.transfer;
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "(not reported)".into());
        writeln!(
            f,
            "qr demo: QUIC over RDMA UD, provider `{}`{}",
            self.provider,
            if self.provider != "sim" {
                format!(
                    " (server {} QPN {:#x}, client {} QPN {:#x}, Q_Key {:#x})",
                    self.endpoints.server.gid,
                    self.endpoints.server.qpn,
                    self.endpoints.client.gid,
                    self.endpoints.client.qpn,
                    self.endpoints.server.qkey
                )
            } else if self.loss_percent > 0.0 {
                format!(
                    " (hostile fabric: {}% loss + dup + reorder, seed {})",
                    self.loss_percent, self.seed
                )
            } else {
                " (ideal fabric)".into()
            }
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  result        {}",
            if self.ok {
                "OK: the data arrived intact"
            } else {
                "FAILED: the data did not arrive intact"
            }
        )?;
        writeln!(
            f,
            "  handshake     {:.3} ms, {} {}, ALPN {}, certificate verified for \"{}\"",
            self.handshake_ms,
            opt(&self.tls.version),
            opt(&self.tls.cipher_suite),
            opt(&self.tls.alpn),
            opt(&self.tls.server_name),
        )?;
        writeln!(
            f,
            "  path MTU      {} bytes (fabric MTU {})",
            self.mtu, self.fabric_mtu
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  transfer      {} ({} bytes) client -> server, received {} bytes",
            size(t.bytes),
            t.bytes,
            t.bytes_received
        )?;
        writeln!(f, "    sha256 sent     {}", t.sha256_sent)?;
        writeln!(
            f,
            "    sha256 received {}  {}",
            t.sha256_received,
            if t.sha256_match { "MATCH" } else { "MISMATCH" }
        )?;
        writeln!(
            f,
            "    throughput      {:.1} MB/s = {:.3} Gbit/s ({:.3} s)",
            t.mb_per_s, t.gbit_per_s, t.seconds
        )?;
        let r = &self.ping.rtt_us;
        writeln!(
            f,
            "  ping-pong     {} round trips of {} bytes on one stream",
            self.ping.count, self.ping.size
        )?;
        writeln!(
            f,
            "    RTT (us)        p50 {:.1}  p99 {:.1}  p999 {:.1}  (min {:.1}, mean {:.1}, max {:.1})",
            r.p50, r.p99, r.p999, r.min, r.mean, r.max
        )?;
        let q = &self.quic;
        writeln!(
            f,
            "  quinn         {} datagrams sent, {} received, {} lost packets, {} congestion events, srtt {:.1} us",
            q.datagrams_sent, q.datagrams_received, q.lost_packets, q.congestion_events, q.smoothed_rtt_us
        )?;
        writeln!(f)?;
        let (stats, routing) = (SocketStats::default(), RoutingStats::default());
        writeln!(
            f,
            "  socket counters                  client          server"
        )?;
        let (c, sv) = (&self.sockets.client, self.sockets.server.as_ref());
        counter_rows(f, &[&stats, &routing], c, sv)?;
        // Derived, so not visited: shown once here.
        let wpp = |r: &CounterReport| format!("{:>12.2}", r.get(None, "wrs_per_post"));
        let s_wpp = sv.map_or(format!("{:>12}", "-"), wpp);
        writeln!(f, "    {:<28} {}    {s_wpp}", "WRs per post", wpp(c))?;
        if let Some(soft) = &self.soft {
            writeln!(f)?;
            writeln!(
                f,
                "  soft port (RoCEv2/UDP)           client          server"
            )?;
            counter_rows(
                f,
                &[&SoftStats::default()],
                &soft.client,
                soft.server.as_ref(),
            )?;
        }
        writeln!(f)?;
        match &self.fabric {
            Some(w) => writeln!(
                f,
                "  fabric        {} delivered, {} lost, {} duplicated, {} reordered, {} corrupted, {} CE-marked, {} unreachable",
                w.delivered, w.lost, w.duplicated, w.reordered, w.corrupted, w.ce_marked, w.unreachable
            ),
            None => writeln!(f, "  fabric        (this provider has no wire counters)"),
        }
    }
}

impl fmt::Display for ServeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let client = self
            .client
            .as_ref()
            .map_or("?".to_string(), |c| format!("{} QPN {:#x}", c.gid, c.qpn));
        match &self.error {
            None => write!(
                f,
                "qr serve: connection from {client}: received {} bytes, sha256 {}; echoed {} ping bytes",
                self.bytes_received, self.sha256_received, self.ping_bytes_echoed
            ),
            Some(e) => write!(f, "qr serve: connection from {client} failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter a visitor lists appears in every output: the JSON
    /// record, the human table and the `/metrics` text, typed as it says.
    /// (The C API's coverage is checked in `quic-rdma-ffi`.)
    #[test]
    fn every_visited_counter_appears_in_every_output() {
        let (stats, routing, soft) = (
            SocketStats::default(),
            RoutingStats::default(),
            SoftStats::default(),
        );
        let shapes: [(&str, &[&dyn Counters]); 2] =
            [("qr_socket", &[&stats, &routing]), ("qr_soft", &[&soft])];
        for (prefix, shape) in shapes {
            let json = serde_json::to_value(CounterReport::of(shape)).unwrap();
            struct Table<'a>(&'a [&'a dyn Counters], CounterReport);
            impl fmt::Display for Table<'_> {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    counter_rows(f, self.0, &self.1, None)
                }
            }
            let human = Table(shape, CounterReport::of(shape)).to_string();
            let text = shape
                .iter()
                .fold(crate::metric::Text::default(), |t, c| t.visited(prefix, *c))
                .render();
            let mut n = 0;
            for c in shape {
                c.visit(&mut |m| {
                    n += 1;
                    let at = m.group.map_or(&json, |g| &json[g]);
                    assert!(
                        at[m.name].is_u64(),
                        "{:?} {} not in the JSON",
                        m.group,
                        m.name
                    );
                    let label = label(m.name);
                    assert!(human.contains(&label), "{label} not in the human table");
                    let (name, ty) = crate::metric::exposed(prefix, &m);
                    let line = format!("# TYPE {name} {ty}\n");
                    assert!(text.contains(&line), "{line} not in /metrics");
                });
            }
            assert!(n >= 12, "{prefix}: {n} values visited");
        }
        // The counters `qr demo --json` and `qr serve --metrics` once lacked.
        let json = serde_json::to_value(CounterReport::of(&[&stats])).unwrap();
        for name in [
            "qp_recoveries",
            "recv_window_grows",
            "tx_buf_sends",
            "gid_changes",
        ] {
            assert!(json[name].is_u64(), "{name}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(size(64 << 20), "64.00 MiB");
        assert_eq!(size(12), "12 B");
    }
}
