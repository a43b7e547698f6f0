//! `bulk-once`: one bulk transfer over one row, for instruction counting.
//!
//! ```text
//! bulk-once --peer ROW [--bytes 64M] [--verify] [--placement same-core|separate-cores] [--idle yield|sleep]
//! bulk-once --peer ROW --handshakes N [--bytes 0] [--placement …] [--idle …]
//! bulk-once --peer ROW --rtt N [--samples FILE] [--placement …] [--idle …]
//! ```
//! The server side runs in the process's second thread and the client in its
//! third (the first only sets up), so `valgrind --tool=callgrind
//! --separate-threads=yes` gives one profile per side; `benches/callgrind.sh`
//! does that. Without `--verify` the receiver discards the bytes (no sha256), so
//! the profile is the transport's own work plus one copy into the application.
//! With `--handshakes N` it runs the row's handshake workload instead (N
//! connections one after another, as `compare` does): two runs with different
//! N give the instructions of one handshake per side. A non-zero `--bytes`
//! runs a bulk transfer of that size first on the same row (as `compare` does
//! before its handshake series), so its effect on the handshakes shows.
//! With `--rtt N` it runs the row's request/response workload (1000 warm-up
//! round trips, then N sampled, 64 bytes each way) and prints the samples'
//! median and what each side's QUIC connection sent: two runs with different
//! N give the instructions and packets of one round trip per side
//! (`benches/latency-callgrind.sh`). `--samples FILE` writes every sampled
//! round trip, in nanoseconds and in the order they ran, one per line: what
//! a percentile hides (bursts, a period, a slow start) shows in the sequence.

use quic_rdma_benches::affinity::Placement;
use quic_rdma_benches::rows::{all_rows, BulkParams};

fn main() -> anyhow::Result<()> {
    let mut peer = None;
    let mut bytes = None;
    let mut verify = false;
    let mut place = Placement::SameCore;
    let mut handshakes = None;
    let mut rtt = None;
    let mut samples_out = None::<std::path::PathBuf>;
    let mut it = quic_rdma_benches::cli::Words::from_env();
    while let Some(a) = it.next() {
        let mut val = || it.value(&a);
        match a.as_str() {
            "--peer" => peer = Some(val()?),
            "--bytes" => bytes = Some(parse_size(&val()?)?),
            "--verify" => verify = true,
            "--handshakes" => handshakes = Some(val()?.parse::<usize>()?),
            "--rtt" => rtt = Some(val()?.parse::<usize>()?),
            "--samples" => samples_out = Some(val()?.into()),
            "--idle" => match val()?.as_str() {
                "sleep" => quic_rdma_benches::rows::engine::set_idle_sleep(true),
                "yield" => quic_rdma_benches::rows::engine::set_idle_sleep(false),
                other => anyhow::bail!("unknown idle mode {other} (sleep or yield)"),
            },
            "--placement" => {
                place = match val()?.as_str() {
                    "same-core" => Placement::SameCore,
                    "separate-cores" => Placement::SeparateCores,
                    other => anyhow::bail!("unknown placement {other}"),
                }
            }
            "--list" => {
                for r in all_rows() {
                    println!("{}", r.name());
                }
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(
        samples_out.is_none() || rtt.is_some(),
        "--samples goes with --rtt N"
    );
    let peer = peer.ok_or_else(|| anyhow::anyhow!("--peer ROW (see --list)"))?;
    let row = all_rows()
        .into_iter()
        .find(|r| r.name() == peer)
        .ok_or_else(|| anyhow::anyhow!("no row {peer} (see --list)"))?;
    if let Some(n) = rtt {
        anyhow::ensure!(n > 0, "--rtt needs at least one round trip");
        let out = row.rtt(n, place)?;
        anyhow::ensure!(
            out.samples_ns.len() == n,
            "{} samples, {n} asked",
            out.samples_ns.len()
        );
        let mut sorted = out.samples_ns.clone();
        sorted.sort_unstable();
        let report = serde_json::json!({
            "round_trips": n,
            "p50_ns": sorted[n / 2],
            "client_sent": out.sent.map(|s| s.0),
            "server_sent": out.sent.map(|s| s.1),
        });
        println!("{report}");
        if let Some(path) = samples_out {
            let text: String = out.samples_ns.iter().map(|ns| format!("{ns}\n")).collect();
            std::fs::write(&path, text)
                .map_err(|e| anyhow::anyhow!("--samples {}: {e}", path.display()))?;
        }
        return Ok(());
    }
    if let Some(n) = handshakes {
        if let Some(bytes) = bytes.filter(|&b| b > 0) {
            let b = row.bulk(BulkParams { bytes, verify }, place)?;
            anyhow::ensure!(b.sha256_ok || !verify, "transfer not verified");
        }
        let h = row.handshakes(n, place)?;
        println!("{}", serde_json::to_string(&h)?);
        return Ok(());
    }
    let bytes = bytes.unwrap_or(64 << 20);
    let b = row.bulk(BulkParams { bytes, verify }, place)?;
    println!("{}", serde_json::to_string(&b)?);
    anyhow::ensure!(b.sha256_ok, "transfer not verified");
    Ok(())
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    Ok(num.parse::<u64>()? << shift)
}
