//! `qr`'s reports as text for a terminal: the client's [`Report`] as a summary
//! and a table of counters (client and server side by side), the server's
//! [`ServeSummary`] as one line per connection. The JSON is in `schema.rs`.

use std::fmt;

use super::schema::{DropsReport, Report, ServeSummary, SocketReport, SoftPortReport};

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
        writeln!(f, "  socket counters          client          server")?;
        let c = &self.sockets.client;
        let sv = self.sockets.server.as_ref();
        let row = |f: &mut fmt::Formatter<'_>, name: &str, a: u64, b: Option<u64>| match b {
            Some(b) => writeln!(f, "    {name:<20} {a:>12}    {b:>12}"),
            None => writeln!(f, "    {name:<20} {a:>12}    {:>12}", "-"),
        };
        let sf = |g: fn(&SocketReport) -> u64| sv.map(g);
        row(f, "sent WRs", c.sent_wrs, sf(|s| s.sent_wrs))?;
        row(f, "sent bytes", c.sent_bytes, sf(|s| s.sent_bytes))?;
        row(f, "doorbells", c.send_posts, sf(|s| s.send_posts))?;
        match sv {
            Some(s) => writeln!(
                f,
                "    {:<20} {:>12.2}    {:>12.2}",
                "WRs per post", c.wrs_per_post, s.wrs_per_post
            )?,
            None => writeln!(
                f,
                "    {:<20} {:>12.2}    {:>12}",
                "WRs per post", c.wrs_per_post, "-"
            )?,
        }
        row(f, "inline sends", c.inline_sends, sf(|s| s.inline_sends))?;
        row(
            f,
            "signaled sends",
            c.signaled_sends,
            sf(|s| s.signaled_sends),
        )?;
        row(f, "send errors", c.send_errors, sf(|s| s.send_errors))?;
        row(f, "MTU refusals", c.mtu_refusals, sf(|s| s.mtu_refusals))?;
        row(f, "would block", c.would_block, sf(|s| s.would_block))?;
        row(f, "recv WRs", c.recv_wrs, sf(|s| s.recv_wrs))?;
        row(f, "recv bytes", c.recv_bytes, sf(|s| s.recv_bytes))?;
        row(
            f,
            "recv WRs posted",
            c.recv_wrs_posted,
            sf(|s| s.recv_wrs_posted),
        )?;
        row(f, "recv errors", c.recv_errors, sf(|s| s.recv_errors))?;
        row(f, "AHs created", c.ah_created, sf(|s| s.ah_created))?;
        row(f, "AHs rebuilt", c.ah_rebuilt, sf(|s| s.ah_rebuilt))?;
        row(f, "AHs destroyed", c.ah_destroyed, sf(|s| s.ah_destroyed))?;
        row(f, "AH cache hits", c.ah_hits, sf(|s| s.ah_hits))?;
        if c.seg_parts_sent + c.seg_reassembled > 0
            || sv.is_some_and(|s| s.seg_parts_sent + s.seg_reassembled > 0)
        {
            row(
                f,
                "segmented sent",
                c.seg_datagrams_sent,
                sf(|s| s.seg_datagrams_sent),
            )?;
            row(
                f,
                "  parts sent",
                c.seg_parts_sent,
                sf(|s| s.seg_parts_sent),
            )?;
            row(
                f,
                "reassembled",
                c.seg_reassembled,
                sf(|s| s.seg_reassembled),
            )?;
        }
        let cd = &c.drops;
        let sd = |g: fn(&DropsReport) -> u64| sv.map(|s| g(&s.drops));
        row(f, "drops (total)", cd.total(), sd(DropsReport::total))?;
        row(f, "  bad GRH", cd.bad_grh, sd(|d| d.bad_grh))?;
        row(f, "  imm mismatch", cd.imm_mismatch, sd(|d| d.imm_mismatch))?;
        row(f, "  provider P_Key", cd.bad_pkey, sd(|d| d.bad_pkey))?;
        row(f, "  provider Q_Key", cd.bad_qkey, sd(|d| d.bad_qkey))?;
        row(f, "  provider QPN", cd.unknown_qpn, sd(|d| d.unknown_qpn))?;
        row(
            f,
            "  provider no recv",
            cd.no_recv_posted,
            sd(|d| d.no_recv_posted),
        )?;
        row(f, "  provider too long", cd.too_long, sd(|d| d.too_long))?;
        row(f, "  provider malformed", cd.malformed, sd(|d| d.malformed))?;
        row(f, "  provider runt", cd.runt, sd(|d| d.runt))?;
        row(
            f,
            "  kernel rcvbuf full",
            cd.kernel_rx_dropped,
            sd(|d| d.kernel_rx_dropped),
        )?;
        row(f, "  provider bad ICRC", cd.bad_icrc, sd(|d| d.bad_icrc))?;
        row(
            f,
            "  provider oversize",
            cd.oversize_sent,
            sd(|d| d.oversize_sent),
        )?;
        row(
            f,
            "  seg incomplete",
            cd.seg_incomplete,
            sd(|d| d.seg_incomplete),
        )?;
        row(
            f,
            "  seg malformed",
            cd.seg_malformed,
            sd(|d| d.seg_malformed),
        )?;
        row(
            f,
            "  seg duplicates",
            cd.seg_duplicates,
            sd(|d| d.seg_duplicates),
        )?;
        if let Some(soft) = &self.soft {
            writeln!(f)?;
            writeln!(f, "  soft port (RoCEv2/UDP)   client          server")?;
            let c = &soft.client;
            let sv = soft.server.as_ref();
            let sp = |g: fn(&SoftPortReport) -> u64| sv.map(g);
            row(f, "tx packets", c.tx_packets, sp(|s| s.tx_packets))?;
            row(f, "tx bytes", c.tx_bytes, sp(|s| s.tx_bytes))?;
            row(
                f,
                "tx GSO batches",
                c.tx_gso_batches,
                sp(|s| s.tx_gso_batches),
            )?;
            row(
                f,
                "tx would block",
                c.tx_would_block,
                sp(|s| s.tx_would_block),
            )?;
            row(f, "tx errors", c.tx_errors, sp(|s| s.tx_errors))?;
            row(f, "rx datagrams", c.rx_datagrams, sp(|s| s.rx_datagrams))?;
            row(f, "rx delivered", c.rx_delivered, sp(|s| s.rx_delivered))?;
            row(
                f,
                "rx decode errors",
                c.rx_decode_errors,
                sp(|s| s.rx_decode_errors),
            )?;
            row(f, "rx bad ICRC", c.rx_bad_icrc, sp(|s| s.rx_bad_icrc))?;
            row(f, "rx oversize", c.rx_oversize, sp(|s| s.rx_oversize))?;
            row(
                f,
                "rx IPv4 ID solved",
                c.rx_ipv4_id_solved,
                sp(|s| s.rx_ipv4_id_solved),
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

    #[test]
    fn sizes() {
        assert_eq!(size(64 << 20), "64.00 MiB");
        assert_eq!(size(12), "12 B");
    }
}
