//! `engine-idle`: the CPU an idle, connected engine costs, busy-polled and
//! with the spin-then-sleep `Waiter` (the goal: an idle engine costs ~0 CPU).
//!
//! ```text
//! engine-idle [--secs 5] [--rounds 3] [--placement separate-cores|same-core]
//! ```
//! For each round and each of `engine/sim`, `engine/sim+adaptive`,
//! `engine/soft`, `engine/soft+adaptive` (interleaved): connect a client and a
//! server, leave the connection idle for `--secs` with both sides polling as
//! the row polls (keep-alives are the only packets), and print the CPU each
//! side's thread used meanwhile as a fraction of the wall time.

use std::time::Duration;

use quic_rdma_benches::affinity::Placement;
use quic_rdma_benches::rows::engine::EngineRow;
use quic_rdma_benches::rows::soft::SoftPairs;
use quic_rdma_benches::rows::Row;

fn main() -> anyhow::Result<()> {
    let (mut secs, mut rounds, mut place) = (5.0f64, 3usize, Placement::SeparateCores);
    let mut it = quic_rdma_benches::cli::Words::from_env();
    while let Some(a) = it.next() {
        let mut val = || it.value(&a);
        match a.as_str() {
            "--secs" => secs = val()?.parse()?,
            "--rounds" => rounds = val()?.parse()?,
            "--placement" => {
                place = match val()?.as_str() {
                    "same-core" => Placement::SameCore,
                    "separate-cores" => Placement::SeparateCores,
                    other => anyhow::bail!("unknown placement {other}"),
                }
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let idle = Duration::from_secs_f64(secs);
    println!("# idle {secs} s per run, {place:?}; CPU (user+sys) per side ÷ wall, client / server");
    // Made once: each `soft` row hands out fresh loopback addresses from a
    // counter, so later rounds do not rebind an address still being released.
    let sim = EngineRow::sim();
    let sim_a = EngineRow::sim().adaptive();
    let soft = EngineRow::new(SoftPairs::new());
    let soft_a = EngineRow::new(SoftPairs::new()).adaptive();
    for round in 1..=rounds {
        macro_rules! one {
            ($row:expr) => {{
                let (c, s) = $row.idle_cpu(idle, place)?;
                println!(
                    "round {round} {:22} client {:6.3}  server {:6.3}  (CPU-s {:.3} / {:.3})",
                    $row.name(),
                    c.total_s() / secs,
                    s.total_s() / secs,
                    c.total_s(),
                    s.total_s()
                );
            }};
        }
        one!(sim);
        one!(sim_a);
        one!(soft);
        one!(soft_a);
    }
    Ok(())
}
